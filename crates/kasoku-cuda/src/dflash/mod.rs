//! DFlash block drafting with the target and the drafter on the same GPU. The drafter is the
//! CPU's `kasoku::spec::BlockDrafter` (its context follows the target's sequence, its trees are
//! prompt lookup's branch merged with the marginals' best paths: `kasoku::spec::dflash_tree`)
//! over [`CudaDFlash`], the network on the device:
//!
//! - [`weights`]: the checkpoint's tensors uploaded as stored (F32/F16/BF16), checked strictly
//!   and against the target;
//! - [`state`]: one sequence's context K/V on the device and the two passes (project committed
//!   tokens' features once; draft a block `[last token, MASK × (B−1)]` in one pass with the
//!   target's embedding and the first `vocab_rows` rows of its head), after which only each
//!   row's top-k ids and log-probabilities come back to the host.
//!
//! The features are the target's layer outputs (`CudaState::set_tap_layers`), read in place:
//! the target's state hands its recorded rows' [`crate::model::TapView`] to the drafter
//! (`Features::device_taps`, through `DeviceSession` or `generate_greedy`), and the
//! projection gathers the accepted path's rows on the device. Host features (the CPU's, or a
//! prompt longer than one pass) are uploaded as before.
//!
//! `kasoku-cuda-check dflash` compares its marginals with the CPU network's and its
//! speculative output with plain decoding; both passed on an H100 (2026-12-06: log-probs within
//! 2.1e-2 on the 1.5B shape, top-1 equal; speculative == plain through DeviceSession) before
//! the graphs, the one-launch top-k and the taps in place (not yet run on a GPU: the check
//! now also compares graph replays with plain launches and device features with host ones,
//! bit for bit, and times a draft).

pub mod state;
pub mod weights;

use std::any::Any;
use std::path::Path;
use std::sync::Arc;

use kasoku::spec::{BlockDrafter, DFlashBlocks, DFlashDrafterConfig, DraftError};

pub use state::{DFlashState, PassCounts, APPEND_ROWS, GRAPH_APPEND_ROWS, MAX_DRAFT_TOP_K};
pub use weights::DFlashWeights;

use crate::model::TapView;
use crate::runtime::Error;
use crate::CudaModel;

/// The DFlash drafter on the GPU.
pub type CudaDFlashDrafter = BlockDrafter<CudaDFlash>;

fn device_error(e: Error) -> DraftError {
    DraftError::Device(e.to_string())
}

/// Token ids a drafter scores for a target of `vocab` tokens when asked for `vocab_rows`:
/// the first `vocab_rows` rounded up to a multiple of 8 (the CPU drafter's head), or all
/// (0, or at least the vocabulary).
pub fn scored_rows(vocab_rows: usize, vocab: usize) -> usize {
    if vocab_rows > 0 && vocab_rows < vocab {
        (vocab_rows.div_ceil(8) * 8).min(vocab)
    } else {
        vocab
    }
}

/// The DFlash network on the target's GPU with one sequence's context.
pub struct CudaDFlash {
    target: Arc<CudaModel>,
    weights: Arc<DFlashWeights>,
    state: DFlashState,
}

impl CudaDFlash {
    /// The network `weights` (loaded for `target`) with room for `max_len` context rows,
    /// scoring [`scored_rows`]`(vocab_rows, …)` ids.
    pub fn new(
        target: Arc<CudaModel>,
        weights: Arc<DFlashWeights>,
        max_len: usize,
        vocab_rows: usize,
    ) -> Result<CudaDFlash, DraftError> {
        weights::check_for_target(&weights.config, &target).map_err(DraftError::Incompatible)?;
        let rows = scored_rows(vocab_rows, target.config.vocab);
        let state = DFlashState::new(&target, &weights, max_len, rows).map_err(device_error)?;
        Ok(CudaDFlash {
            target,
            weights,
            state,
        })
    }

    /// The drafter's per-sequence state.
    pub fn state(&self) -> &DFlashState {
        &self.state
    }

    /// The same, to change how it runs (`use_graphs`).
    pub fn state_mut(&mut self) -> &mut DFlashState {
        &mut self.state
    }

    /// The target state's recorded rows, when this drafter reads them in place.
    fn view<'a>(&self, source: &'a (dyn Any + Send + Sync)) -> Option<&'a TapView> {
        source
            .downcast_ref::<TapView>()
            .filter(|v| self.state.reads(&self.weights, v))
    }
}

impl DFlashBlocks for CudaDFlash {
    fn tap_layers(&self) -> Vec<usize> {
        self.weights.config.taps.clone()
    }

    fn feature_width(&self) -> usize {
        self.weights.config.taps.len() * self.weights.config.hidden
    }

    fn block_size(&self) -> usize {
        self.weights.config.block_size
    }

    fn context_positions(&self) -> &[usize] {
        self.state.positions()
    }

    fn truncate_context(&mut self, rows: usize) {
        self.state.truncate(rows);
    }

    fn append_context(&mut self, features: &[f32], positions: &[usize]) -> Result<(), DraftError> {
        self.state
            .append(&self.target, &self.weights, features, positions)
            .map_err(device_error)
    }

    fn reads_device_taps(&self, source: &(dyn Any + Send + Sync)) -> bool {
        self.view(source).is_some()
    }

    fn append_device_context(
        &mut self,
        source: &(dyn Any + Send + Sync),
        rows: &[usize],
        positions: &[usize],
    ) -> Result<(), DraftError> {
        let view = self.view(source).ok_or_else(|| {
            DraftError::Incompatible("not the recorded layer outputs of this GPU's target".into())
        })?;
        self.state
            .append_device(&self.target, &self.weights, view, rows, positions)
            .map_err(device_error)
    }

    fn marginals(
        &mut self,
        root: u32,
        pos: usize,
        rows: usize,
        top_k: usize,
    ) -> Result<Vec<Vec<(u32, f32)>>, DraftError> {
        self.state
            .block(&self.target, &self.weights, root, pos, rows, top_k)
            .map_err(device_error)
    }
}

/// A DFlash drafter on `target`'s GPU for one sequence of up to `max_len` tokens.
pub fn dflash_drafter(
    target: Arc<CudaModel>,
    weights: Arc<DFlashWeights>,
    max_len: usize,
    config: DFlashDrafterConfig,
) -> Result<CudaDFlashDrafter, DraftError> {
    let blocks = CudaDFlash::new(target, weights, max_len, config.vocab_rows)?;
    Ok(BlockDrafter::over(blocks, config))
}

/// Loads a DFlash checkpoint directory onto `target`'s GPU.
pub fn load_weights(target: &CudaModel, dir: &Path) -> Result<Arc<DFlashWeights>, DraftError> {
    DFlashWeights::load(target, dir)
        .map(Arc::new)
        .map_err(|e| DraftError::Incompatible(e.to_string()))
}

#[cfg(test)]
mod tests;
