//! Per-sequence state of a whole model: one entry per layer (a KV cache for attention
//! layers, recurrent + conv state for Gated DeltaNet layers), the number of positions it
//! holds, and the token tree a verification pass left pending. Made by `Model::new_state`;
//! the weights never change, so any number of states can run on one model.
//!
//! The layers stay inside: callers see a [`ModelState`] through its methods (length,
//! capacity, bytes, truncation, checkpoints of the recurrent layers, forks), so that
//! nothing above the model depends on which kinds of layers a model has or how they keep
//! their state.

use crate::backend::{Backend, Cpu, KvStore};

use super::config::LayerKind;
use super::mixer::GdnState;
use super::scratch::Scratch;
use super::transformer::Layer;

/// The state of one layer, in backend `B`'s memory.
#[derive(Clone, Debug)]
pub(crate) enum LayerState<B: Backend = Cpu> {
    Kv(B::KvCache),
    Gdn(GdnState<B>),
}

impl<B: Backend> LayerState<B> {
    pub(crate) fn kind(&self) -> LayerKind {
        match self {
            LayerState::Kv(_) => LayerKind::Attention,
            LayerState::Gdn(_) => LayerKind::GatedDeltaNet,
        }
    }

    /// Makes room for `positions` rows without allocating later (KV caches; a no-op for
    /// recurrent layers, whose state has a fixed size).
    fn reserve(&mut self, positions: usize) {
        if let LayerState::Kv(c) = self {
            c.reserve(positions);
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

    /// Bytes of the committed state (KV rows; recurrent and conv states).
    fn bytes(&self) -> usize {
        match self {
            LayerState::Kv(c) => c.bytes(),
            LayerState::Gdn(g) => g.bytes(),
        }
    }
}

/// The token tree of the last verification pass, until its commit: node `i`'s parent
/// (`NO_PARENT` for a root; always an earlier node) and depth. Its buffers are kept from
/// tree to tree.
#[derive(Clone, Debug, Default)]
pub(crate) struct PendingTree {
    /// Whether a tree is pending (the buffers hold it).
    pub(crate) active: bool,
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

/// The state of one sequence: see the module doc.
#[derive(Debug)]
pub struct ModelState<B: Backend = Cpu> {
    pub(crate) layers: Vec<LayerState<B>>,
    /// Positions processed so far (the next token goes at position `len`).
    pub(crate) len: usize,
    /// Capacity: a pass refuses to go past it.
    pub(crate) max_len: usize,
    /// The last verified tree, until it is committed or discarded (its KV rows sit past `len`).
    pub(crate) pending: PendingTree,
    /// The passes' activations (see `scratch.rs`).
    pub(crate) scratch: Scratch<B>,
}

/// A compact copy: the KV caches hold just their rows (no room reserved beyond them) and the
/// activation buffers start empty. What a prefix cache stores; [`ModelState::fork`] is the
/// copy that goes on decoding.
impl<B: Backend> Clone for ModelState<B> {
    fn clone(&self) -> ModelState<B> {
        ModelState {
            layers: self.layers.clone(),
            len: self.len,
            max_len: self.max_len,
            pending: self.pending.clone(),
            scratch: Scratch::default(),
        }
    }
}

/// The recurrent layers' states of a model state after [`Checkpoint::len`] positions: what a
/// state that cannot be rewound needs to return to that length later
/// ([`ModelState::restore`]). Attention layers are not copied (their caches can be cut back).
#[derive(Clone, Debug)]
pub struct Checkpoint<B: Backend = Cpu> {
    len: usize,
    layers: Vec<(usize, GdnState<B>)>,
}

impl<B: Backend> Checkpoint<B> {
    /// Positions the state held when the checkpoint was taken.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it was taken of an empty state.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes the copied states take.
    pub fn bytes(&self) -> usize {
        self.layers.iter().map(|(_, g)| g.bytes()).sum()
    }
}

impl<B: Backend> ModelState<B> {
    /// An empty state for `layers` on `backend` with room for `max_len` positions.
    /// Its KV caches reserve room for all of them at once (memory the system maps in as the
    /// rows arrive), so that appending never allocates.
    pub(crate) fn new(backend: &B, layers: &[Layer<B>], max_len: usize) -> ModelState<B> {
        let mut state = ModelState {
            layers: layers.iter().map(|l| l.mixer.new_state(backend)).collect(),
            len: 0,
            max_len,
            pending: PendingTree::default(),
            scratch: Scratch::default(),
        };
        state.reserve();
        state
    }

    /// Reserves KV room for `max_len` positions (where the allocator grants it; otherwise
    /// the caches grow as rows arrive).
    fn reserve(&mut self) {
        let max_len = self.max_len;
        self.layers.iter_mut().for_each(|l| l.reserve(max_len));
    }

    /// Positions processed so far (the next token goes at this position).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no position has been processed.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Capacity in positions: a pass that would go past it is refused.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// Changes the capacity to `max_len` positions (reserving their KV room); refused
    /// (`false`, nothing changed) when the state already holds more.
    pub fn set_max_len(&mut self, max_len: usize) -> bool {
        if max_len < self.len {
            return false;
        }
        self.max_len = max_len;
        self.reserve();
        true
    }

    /// Bytes of activation memory the state's passes keep (see `scratch.rs`): grows to the
    /// largest pass run so far.
    pub fn scratch_bytes(&self) -> usize {
        self.scratch.bytes()
    }

    /// Bytes the committed state takes: every KV cache's stored rows, every recurrent
    /// layer's recurrent and conv states.
    pub fn bytes(&self) -> usize {
        self.layers.iter().map(LayerState::<B>::bytes).sum()
    }

    /// Whether the state can be cut back to any shorter length ([`ModelState::truncate`]):
    /// every layer is an attention layer (a recurrent state cannot be rewound).
    pub fn is_rewindable(&self) -> bool {
        self.layers.iter().all(|l| matches!(l, LayerState::Kv(_)))
    }

    /// Cuts the state back to its first `len` positions. Only possible when the state
    /// [`is_rewindable`](ModelState::is_rewindable) and holds at least `len`; returns whether
    /// it was done. A pending tree is discarded either way.
    pub fn truncate(&mut self, len: usize) -> bool {
        self.discard_pending();
        if len > self.len || !self.is_rewindable() {
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

    /// A copy of the recurrent layers' states at the current length (empty for an
    /// attention-only model).
    pub fn checkpoint(&self) -> Checkpoint<B> {
        Checkpoint {
            len: self.len,
            layers: self
                .layers
                .iter()
                .enumerate()
                .filter_map(|(i, l)| match l {
                    LayerState::Gdn(g) => Some((i, g.clone())),
                    LayerState::Kv(_) => None,
                })
                .collect(),
        }
    }

    /// Returns the state to the length of `checkpoint`, taken earlier of this state or of
    /// one it was forked from: attention caches are cut back, recurrent layers take the
    /// checkpoint's states. Refused (`false`, nothing changed) when the state is shorter than
    /// the checkpoint or the checkpoint belongs to another layout. A pending tree is
    /// discarded.
    pub fn restore(&mut self, checkpoint: &Checkpoint<B>) -> bool {
        self.discard_pending();
        let len = checkpoint.len;
        let fits = len <= self.len
            && checkpoint.layers.len()
                == self
                    .layers
                    .iter()
                    .filter(|l| matches!(l, LayerState::Gdn(_)))
                    .count()
            && checkpoint
                .layers
                .iter()
                .all(|(i, g)| match self.layers.get(*i) {
                    Some(LayerState::Gdn(own)) => own.same_shape(g),
                    _ => false,
                });
        if !fits {
            return false;
        }
        for (i, g) in &checkpoint.layers {
            if let LayerState::Gdn(own) = &mut self.layers[*i] {
                own.clone_from(g);
            }
        }
        for layer in &mut self.layers {
            if let LayerState::Kv(c) = layer {
                c.truncate(len);
            }
        }
        self.len = len;
        true
    }

    /// An independent copy that goes on from this state: KV room for its capacity reserved,
    /// its own activation buffers (a compact copy is [`Clone`]).
    pub fn fork(&self) -> ModelState<B> {
        let mut copy = self.clone();
        copy.reserve();
        copy
    }

    /// Forgets an uncommitted verified tree (drops its KV rows).
    pub fn discard_pending(&mut self) {
        if std::mem::take(&mut self.pending.active) {
            let len = self.len;
            for l in &mut self.layers {
                l.discard_pending(len);
            }
        }
    }
}
