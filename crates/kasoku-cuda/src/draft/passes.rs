//! The passes a draft model's tree needs ([`DraftPasses`]), and those passes on the GPU
//! ([`CudaDraftPasses`]): the draft model's own `CudaState` feeds tokens, verifies a tree
//! (one graph launch), leaves each row's best two tokens and softmax mass on the device
//! (`Kernels::row_top2`) and commits the accepted path. Per level, the host receives 20
//! bytes a tree node; the logits never leave the GPU.

use std::sync::Arc;

use kasoku::model::TokenTree;
use kasoku::spec::DraftError;

use crate::kernels::{RowTop2, TOP2_WORDS};
use crate::model::MAX_TREE;
use crate::runtime::{DeviceBuffer, PinnedBuffer};
use crate::{CudaModel, CudaState, Error};

fn device_error(e: Error) -> DraftError {
    DraftError::Device(e.to_string())
}

/// A draft model's state and the passes over it that a tree drafter makes.
pub trait DraftPasses: Send {
    /// Positions the state holds at most.
    fn max_len(&self) -> usize;
    /// Nodes one verification takes at most (the leading chain included).
    fn max_tree(&self) -> usize;
    /// Forgets every position from `len` on (a pending tree too) and returns the positions
    /// kept: `len`, or 0 where the state cannot rewind (recurrent layers start over).
    fn truncate(&mut self, len: usize) -> usize;
    /// Appends `tokens` (their logits are not needed).
    fn feed(&mut self, tokens: &[u32]) -> Result<(), DraftError>;
    /// Runs every node of `tree` (its root the first token not in the state) and leaves
    /// each node's best two tokens in `rows`, node by node; the tree stays pending.
    fn verify(&mut self, tree: &TokenTree, rows: &mut Vec<RowTop2>) -> Result<(), DraftError>;
    /// Keeps the root path `path` of the pending tree.
    fn commit(&mut self, path: &[usize]) -> Result<(), DraftError>;
}

/// A draft model on the GPU with its own state.
pub struct CudaDraftPasses {
    model: Arc<CudaModel>,
    state: CudaState,
    /// Token ids scored: `0..scored`.
    scored: usize,
    /// Each row's [`TOP2_WORDS`] words, on the device and pinned on the host.
    top_dev: DeviceBuffer,
    top_host: PinnedBuffer,
}

impl CudaDraftPasses {
    /// A state of `max_len` positions for `model`, its head computing the logits of token
    /// ids `0..scored` only.
    pub fn new(
        model: Arc<CudaModel>,
        max_len: usize,
        scored: usize,
    ) -> Result<CudaDraftPasses, Error> {
        let gpu = model.gpu().clone();
        gpu.bind()?;
        let mut state = model.new_state(max_len)?;
        if scored < model.config.vocab {
            state.set_head_rows(&model, scored)?;
        }
        Ok(CudaDraftPasses {
            scored,
            top_dev: gpu.alloc(MAX_TREE * TOP2_WORDS * 4)?,
            top_host: gpu.pinned(MAX_TREE * TOP2_WORDS * 4)?,
            model,
            state,
        })
    }

    /// The draft model.
    pub fn model(&self) -> &Arc<CudaModel> {
        &self.model
    }

    /// Token ids scored: `0..scored`.
    pub fn scored(&self) -> usize {
        self.scored
    }

    fn verify_rows(&mut self, tree: &TokenTree, rows: &mut Vec<RowTop2>) -> Result<(), Error> {
        let m = &self.model;
        self.state.verify(m, tree)?;
        let n = tree.len();
        m.kernels.row_top2(
            self.state.head_logits().ptr(),
            m.config.vocab,
            self.scored,
            n,
            self.top_dev.ptr(),
        )?;
        self.top_dev
            .read_async(0, &self.top_host, n * TOP2_WORDS * 4)?;
        m.gpu().synchronize()?;
        let words = self.top_host.get_u32s(0, n * TOP2_WORDS);
        rows.clear();
        rows.extend(words.chunks_exact(TOP2_WORDS).map(RowTop2::from_words));
        Ok(())
    }
}

impl DraftPasses for CudaDraftPasses {
    fn max_len(&self) -> usize {
        self.state.max_len
    }

    fn max_tree(&self) -> usize {
        MAX_TREE
    }

    fn truncate(&mut self, len: usize) -> usize {
        self.state.truncate(len);
        self.state.len
    }

    fn feed(&mut self, tokens: &[u32]) -> Result<(), DraftError> {
        self.state
            .prefill(&self.model, tokens)
            .map(|_| ())
            .map_err(device_error)
    }

    fn verify(&mut self, tree: &TokenTree, rows: &mut Vec<RowTop2>) -> Result<(), DraftError> {
        self.verify_rows(tree, rows).map_err(device_error)
    }

    fn commit(&mut self, path: &[usize]) -> Result<(), DraftError> {
        self.state.commit(&self.model, path).map_err(device_error)
    }
}
