//! [`HostDevice`]: a CPU model behind the device interface ([`DeviceModel`]), handing back
//! only what a GPU would (argmax ids, and a row of logits when asked, counted). The stand-in
//! that lets a server's or a command line's device path run and be checked on a machine with
//! no GPU: the same weights through a CPU `Session` and through a `DeviceSession` on it must
//! answer the same.

#![warn(missing_docs)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::device::{DeviceModel, DeviceState};
use super::session::EngineError;
use crate::model::{Batch, Model, ModelState, Output, TokenTree};
use crate::sampler::argmax;

/// Most nodes of a tree its states verify (a GPU's graphs take at most 64).
const MAX_TREE: usize = 64;

/// A CPU model posing as a device.
pub struct HostDevice {
    model: Arc<Model>,
    name: String,
    logits_rows: Arc<AtomicUsize>,
}

impl HostDevice {
    /// `model` as a device called `name` (what statistics and metrics report).
    pub fn new(model: Arc<Model>, name: impl Into<String>) -> HostDevice {
        HostDevice {
            model,
            name: name.into(),
            logits_rows: Arc::default(),
        }
    }

    /// Rows of logits its states have copied to the host so far (a GPU's cost beyond ids).
    pub fn logits_rows(&self) -> usize {
        self.logits_rows.load(Ordering::Relaxed)
    }
}

impl DeviceModel for HostDevice {
    fn device(&self) -> String {
        self.name.clone()
    }

    fn vocab(&self) -> usize {
        self.model.config.vocab
    }

    fn max_context(&self) -> usize {
        self.model.config.max_context
    }

    fn new_state(&self, max_len: usize) -> Result<Box<dyn DeviceState>, EngineError> {
        Ok(Box::new(HostState {
            state: self.model.new_state(max_len),
            model: Arc::clone(&self.model),
            out: Output::default(),
            logits_rows: Arc::clone(&self.logits_rows),
        }))
    }
}

struct HostState {
    model: Arc<Model>,
    state: ModelState,
    out: Output,
    logits_rows: Arc<AtomicUsize>,
}

impl DeviceState for HostState {
    fn len(&self) -> usize {
        self.state.len()
    }

    fn max_len(&self) -> usize {
        self.state.max_len()
    }

    fn max_tree(&self) -> usize {
        MAX_TREE
    }

    fn truncate(&mut self, len: usize) {
        if !self.state.truncate(len) {
            // A recurrent state cannot be rewound: only a full reset is honoured.
            self.state = self.model.new_state(self.state.max_len());
        }
    }

    fn feed(&mut self, tokens: &[u32]) -> Result<u32, EngineError> {
        self.model
            .run(&mut self.state, &Batch::chain(tokens), &mut self.out)?;
        Ok(argmax(&self.out.logits))
    }

    fn last_logits(&mut self, out: &mut Vec<f32>) -> Result<(), EngineError> {
        self.logits_rows.fetch_add(1, Ordering::Relaxed);
        let vocab = self.model.config.vocab;
        let Some(first) = self.out.logits.len().checked_sub(vocab) else {
            return Err(EngineError::Device("no pass has run yet".into()));
        };
        out.clear();
        out.extend_from_slice(&self.out.logits[first..]);
        Ok(())
    }

    fn node_logits(&mut self, node: usize, out: &mut Vec<f32>) -> Result<(), EngineError> {
        self.logits_rows.fetch_add(1, Ordering::Relaxed);
        let vocab = self.model.config.vocab;
        let Some(row) = self.out.logits.get(node * vocab..(node + 1) * vocab) else {
            return Err(EngineError::Device(format!("no logits of node {node}")));
        };
        out.clear();
        out.extend_from_slice(row);
        Ok(())
    }

    fn verify(&mut self, tree: &TokenTree) -> Result<Vec<u32>, EngineError> {
        self.model
            .run(&mut self.state, &Batch::tree(tree), &mut self.out)?;
        let vocab = self.model.config.vocab;
        Ok(self.out.logits.chunks(vocab).map(argmax).collect())
    }

    fn commit(&mut self, path: &[usize]) -> Result<(), EngineError> {
        Ok(self.model.commit(&mut self.state, path)?)
    }
}
