//! Per-sequence state of a whole model: one entry per layer (a KV cache for attention
//! layers, recurrent + conv state for Gated DeltaNet layers) and the number of positions
//! it holds. Made by `Model::new_state`; the weights never change, so any number of states
//! can run on one model.

use super::config::LayerKind;
use super::mixer::{GdnState, KvCache};
use super::verify::PendingTree;

/// The state of one layer.
#[derive(Clone, Debug)]
pub enum LayerState {
    Kv(KvCache),
    Gdn(GdnState),
}

impl LayerState {
    pub fn kind(&self) -> LayerKind {
        match self {
            LayerState::Kv(_) => LayerKind::Attention,
            LayerState::Gdn(_) => LayerKind::GatedDeltaNet,
        }
    }
}

/// The state of one sequence.
#[derive(Clone, Debug)]
pub struct ModelState {
    pub layers: Vec<LayerState>,
    /// Positions processed so far (the next token goes at position `len`).
    pub len: usize,
    /// Capacity: `forward` refuses to go past it.
    pub max_len: usize,
    /// The last verified tree, until it is committed or discarded (its KV rows sit past `len`).
    pub(crate) pending: Option<Box<PendingTree>>,
}

impl ModelState {
    /// Positions processed so far.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Drops positions `len..` from every KV cache. Only possible when every layer is an
    /// attention layer (a recurrent state cannot be rewound); returns whether it was done.
    pub fn truncate(&mut self, len: usize) -> bool {
        self.discard_pending();
        if len > self.len || self.layers.iter().any(|l| !matches!(l, LayerState::Kv(_))) {
            return false;
        }
        for l in &mut self.layers {
            if let LayerState::Kv(c) = l {
                c.truncate(len);
            }
        }
        self.len = len;
        true
    }

    /// Forgets an uncommitted verified tree (drops its KV rows).
    pub fn discard_pending(&mut self) {
        if self.pending.take().is_some() {
            let len = self.len;
            for l in &mut self.layers {
                if let LayerState::Kv(c) = l {
                    c.truncate(len);
                }
            }
        }
    }
}
