//! Per-sequence state of a whole model: one entry per layer (a KV cache for attention
//! layers, recurrent + conv state for Gated DeltaNet layers), the number of positions it
//! holds, and the token tree a verification pass left pending. Made by `Model::new_state`;
//! the weights never change, so any number of states can run on one model.

use super::config::LayerKind;
use super::mixer::{GdnState, KvCache};
use super::transformer::Layer;

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

    /// Forgets the uncommitted rows of a pending tree: the KV rows past `len`, the recurrent
    /// layer's commit data.
    pub(crate) fn discard_pending(&mut self, len: usize) {
        match self {
            LayerState::Kv(c) => c.truncate(len),
            LayerState::Gdn(g) => g.discard_pending(),
        }
    }
}

/// The token tree of the last verification pass, until its commit: node `i`'s parent
/// (`NO_PARENT` for a root; always an earlier node) and depth.
#[derive(Clone, Debug, Default)]
pub(crate) struct PendingTree {
    pub(crate) parents: Vec<usize>,
    pub(crate) depths: Vec<usize>,
}

impl PendingTree {
    /// Whether `path` runs from the root down, each node a child of the one before.
    pub(crate) fn is_root_path(&self, path: &[usize]) -> bool {
        path.first() == Some(&0)
            && path.iter().all(|&i| i < self.parents.len())
            && path.windows(2).all(|w| self.parents[w[1]] == w[0])
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
    pub(crate) pending: Option<PendingTree>,
}

impl ModelState {
    /// An empty state for `layers` with room for `max_len` positions.
    pub(crate) fn new(layers: &[Layer], max_len: usize) -> ModelState {
        ModelState {
            layers: layers.iter().map(|l| l.mixer.new_state()).collect(),
            len: 0,
            max_len,
            pending: None,
        }
    }

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
                l.discard_pending(len);
            }
        }
    }
}
