//! [`HostDevice`]: a CPU model behind the device interface ([`DeviceModel`]), handing back
//! only what a GPU would (argmax ids, a row of logits when asked, and a top-k selection when
//! asked, each counted). The stand-in
//! that lets a server's or a command line's device path run and be checked on a machine with
//! no GPU: the same weights through a CPU `Session` and through a `DeviceSession` on it must
//! answer the same.

#![warn(missing_docs)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use super::device::{DeviceModel, DeviceState, LogitsRow};
use super::session::EngineError;
use crate::model::{Batch, Model, ModelState, Output, TokenTree};
use crate::sampler::{argmax, top_k_of};

/// Most nodes of a tree its states verify (a GPU's graphs take at most 64).
const MAX_TREE: usize = 64;
/// Most logits a top-k selection returns (as the GPU's).
const MAX_TOP_LOGITS: usize = 1024;

/// A CPU model posing as a device.
pub struct HostDevice {
    model: Arc<Model>,
    name: String,
    logits_rows: Arc<AtomicUsize>,
    top_selections: Arc<AtomicUsize>,
}

impl HostDevice {
    /// `model` as a device called `name` (what statistics and metrics report).
    pub fn new(model: Arc<Model>, name: impl Into<String>) -> HostDevice {
        HostDevice {
            model,
            name: name.into(),
            logits_rows: Arc::default(),
            top_selections: Arc::default(),
        }
    }

    /// Rows of logits its states have copied to the host so far (a GPU's cost beyond ids).
    pub fn logits_rows(&self) -> usize {
        self.logits_rows.load(Ordering::Relaxed)
    }

    /// Top-k selections its states have handed to the host so far (instead of rows).
    pub fn top_selections(&self) -> usize {
        self.top_selections.load(Ordering::Relaxed)
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
            top_selections: Arc::clone(&self.top_selections),
        }))
    }
}

struct HostState {
    model: Arc<Model>,
    state: ModelState,
    out: Output,
    logits_rows: Arc<AtomicUsize>,
    top_selections: Arc<AtomicUsize>,
}

impl HostState {
    /// Row `row` of the last pass's logits.
    fn row(&self, row: LogitsRow) -> Result<&[f32], EngineError> {
        let vocab = self.model.config.vocab;
        let range = match row {
            LogitsRow::Last => self
                .out
                .logits
                .len()
                .checked_sub(vocab)
                .map(|f| f..f + vocab),
            LogitsRow::Node(node) => Some(node * vocab..(node + 1) * vocab),
        };
        range
            .and_then(|r| self.out.logits.get(r))
            .ok_or_else(|| EngineError::Device(format!("no logits of row {row:?}")))
    }
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

    fn vocab(&self) -> usize {
        self.model.config.vocab
    }

    fn max_top_logits(&self) -> usize {
        MAX_TOP_LOGITS
    }

    fn top_logits(
        &mut self,
        row: LogitsRow,
        count: usize,
        ids: &[u32],
        top: &mut Vec<(u32, f32)>,
        gathered: &mut Vec<f32>,
    ) -> Result<(), EngineError> {
        self.top_selections.fetch_add(1, Ordering::Relaxed);
        let logits = self.row(row)?;
        if count > MAX_TOP_LOGITS || count >= logits.len() {
            return Err(EngineError::Device(format!(
                "a selection of {count} of {} logits",
                logits.len()
            )));
        }
        gathered.clear();
        for &id in ids {
            let l = logits
                .get(id as usize)
                .ok_or_else(|| EngineError::Device(format!("token {id} out of the vocabulary")))?;
            gathered.push(*l);
        }
        let all = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, l))
            .collect();
        *top = top_k_of(all, count);
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
