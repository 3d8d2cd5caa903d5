//! Token mixers: the part of a layer that moves information between positions. Each mixer
//! owns its weights and defines its per-sequence state type; each has one `run` over a pass
//! (a chain, a tree, or more nodes of a pending tree) and one `commit` of a tree path. This
//! file is the one place where a mixer meets its state.
//!
//! - [`attention`]: (gated) multi-head attention over a KV cache ([`kv_cache`]).
//! - [`gated_delta_net`]: Qwen3.5's linear-attention layers with recurrent + conv state.

pub mod attention;
pub mod gated_delta_net;
pub mod kv_cache;

pub use attention::Attention;
pub use gated_delta_net::{GatedDeltaNet, GdnState};
pub use kv_cache::{KvCache, KvType};

use super::batch::Pass;
use super::config::LayerKind;
use super::state::LayerState;
use super::trace::Trace;
use crate::kernels::matmul::{MatMulWeight, Prepared};

/// The mixer of one layer. (One per layer, so variant sizes do not matter.)
#[allow(clippy::large_enum_variant)]
pub enum Mixer {
    Attention(Attention),
    GatedDeltaNet(GatedDeltaNet),
}

impl Mixer {
    pub fn kind(&self) -> LayerKind {
        match self {
            Mixer::Attention(_) => LayerKind::Attention,
            Mixer::GatedDeltaNet(_) => LayerKind::GatedDeltaNet,
        }
    }

    /// A fresh (empty) state for this layer.
    pub(crate) fn new_state(&self) -> LayerState {
        match self {
            Mixer::Attention(a) => LayerState::Kv(a.new_cache()),
            Mixer::GatedDeltaNet(g) => LayerState::Gdn(g.new_state()),
        }
    }

    /// The matrix whose prepared rows this mixer reads instead of f32 ones (see
    /// [`Attention::prepared_input`]); `None` for f32 rows.
    pub(crate) fn prepared_input(&self) -> Option<&MatMulWeight> {
        match self {
            Mixer::Attention(a) => a.prepared_input(),
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
        state: &mut LayerState,
        x: &[f32],
        pass: &Pass,
        out: &mut [f32],
        work: &mut Vec<f32>,
        prepared: &mut Prepared,
        layer: usize,
        tr: &mut T,
    ) {
        match (self, state) {
            (Mixer::Attention(a), LayerState::Kv(cache)) => {
                a.run(cache, x, pass, out, work, prepared, layer, tr)
            }
            (Mixer::GatedDeltaNet(g), LayerState::Gdn(s)) => {
                g.run(s, x, pass, out, work, layer, tr)
            }
            _ => unreachable!("the model matched every layer with its state"),
        }
    }

    /// Keeps `path` (root first, each node a child of the one before) of the tree pending in
    /// `state` after the `base` committed positions, as plain decoding of its tokens would.
    pub(crate) fn commit(&self, state: &mut LayerState, base: usize, path: &[usize]) {
        match (self, state) {
            (Mixer::Attention(_), LayerState::Kv(cache)) => cache.commit(base, path),
            (Mixer::GatedDeltaNet(g), LayerState::Gdn(s)) => g.commit(s, path),
            _ => unreachable!("the model matched every layer with its state"),
        }
    }
}
