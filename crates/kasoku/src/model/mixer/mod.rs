//! Token mixers: the part of a layer that moves information between positions. Each mixer
//! owns its weights and defines its per-sequence state type; each has one `run` over a pass
//! (a chain, a tree, or more nodes of a pending tree) and one `commit` of a tree path. This
//! file is the one place where a mixer meets its state.
//!
//! - [`attention`]: (gated) multi-head attention over a KV cache (the backend's).
//! - [`gated_delta_net`]: Qwen3.5's linear-attention layers with recurrent + conv state.

pub mod attention;
pub mod gated_delta_net;

pub use crate::backend::KvType;
pub use attention::Attention;
pub use gated_delta_net::{GatedDeltaNet, GdnState};

use crate::backend::{Backend, Cpu, KvStore};

use super::batch::Pass;
use super::config::LayerKind;
use super::state::LayerState;
use super::trace::Trace;

/// The mixer of one layer. (One per layer, so variant sizes do not matter.)
#[allow(clippy::large_enum_variant)]
pub enum Mixer<B: Backend = Cpu> {
    Attention(Attention<B>),
    GatedDeltaNet(GatedDeltaNet<B>),
}

impl<B: Backend> Mixer<B> {
    pub fn kind(&self) -> LayerKind {
        match self {
            Mixer::Attention(_) => LayerKind::Attention,
            Mixer::GatedDeltaNet(_) => LayerKind::GatedDeltaNet,
        }
    }

    /// A fresh (empty) state for this layer on `b`.
    pub(crate) fn new_state(&self, b: &B) -> LayerState<B> {
        match self {
            Mixer::Attention(a) => LayerState::Kv(a.new_cache(b)),
            Mixer::GatedDeltaNet(g) => LayerState::Gdn(g.new_state()),
        }
    }

    /// The matrix whose prepared rows this mixer reads instead of f32 ones on `b` (see
    /// [`Attention::prepared_input`]); `None` for f32 rows.
    pub(crate) fn prepared_input(&self, b: &B) -> Option<&B::Weight> {
        match self {
            Mixer::Attention(a) => a.prepared_input(b),
            Mixer::GatedDeltaNet(_) => None,
        }
    }

    /// Mixes the pass's rows (`x`: `n × hidden`, normed; or in `prepared` when
    /// [`Mixer::prepared_input`] says so) into `out` (`n × hidden`): a chain advances `state`
    /// past them, tree nodes wait in it for [`Mixer::commit`]. Intermediates are carved from
    /// `work` (and `prepared`). The model checked that `state` belongs to this layer and that
    /// the pass suits it.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn run<T: Trace>(
        &self,
        b: &B,
        state: &mut LayerState<B>,
        x: &B::Buffer,
        pass: &Pass,
        out: &mut B::Buffer,
        work: &mut B::Vec,
        prepared: &mut B::Prepared,
        layer: usize,
        tr: &mut T,
    ) {
        match (self, state) {
            (Mixer::Attention(a), LayerState::Kv(cache)) => {
                a.run(b, cache, x, pass, out, work, prepared, layer, tr)
            }
            (Mixer::GatedDeltaNet(g), LayerState::Gdn(s)) => {
                g.run(b, s, x, pass, out, work, layer, tr)
            }
            _ => unreachable!("the model matched every layer with its state"),
        }
    }

    /// Keeps `path` (root first, each node a child of the one before) of the tree pending in
    /// `state` after the `base` committed positions, as plain decoding of its tokens would.
    pub(crate) fn commit(&self, b: &B, state: &mut LayerState<B>, base: usize, path: &[usize]) {
        match (self, state) {
            (Mixer::Attention(_), LayerState::Kv(cache)) => cache.commit(base, path),
            (Mixer::GatedDeltaNet(g), LayerState::Gdn(s)) => g.commit(b, s, path),
            _ => unreachable!("the model matched every layer with its state"),
        }
    }
}
