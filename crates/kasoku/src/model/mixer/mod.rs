//! Token mixers: the part of a layer that moves information between positions. Each mixer
//! owns its weights and defines its per-sequence state type.
//!
//! - [`attention`]: (gated) multi-head attention with a KV cache.
//! - [`gated_delta_net`]: Qwen3.5's linear-attention layers with recurrent + conv state.

pub mod attention;
pub mod gated_delta_net;

pub use attention::{Attention, KvCache};
pub use gated_delta_net::{GatedDeltaNet, GdnPending, GdnState};

use super::config::LayerKind;
use super::state::LayerState;
use super::ModelError;

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
    pub fn new_state(&self) -> LayerState {
        match self {
            Mixer::Attention(a) => LayerState::Kv(a.new_cache()),
            Mixer::GatedDeltaNet(g) => LayerState::Gdn(g.new_state()),
        }
    }

    /// Mixes `n` new tokens (`x`: `n × hidden`, normed) into `out` (`n × hidden`), advancing
    /// `state` past them.
    pub fn forward(
        &self,
        state: &mut LayerState,
        x: &[f32],
        n: usize,
        out: &mut [f32],
    ) -> Result<(), ModelError> {
        match (self, state) {
            (Mixer::Attention(a), LayerState::Kv(cache)) => a.forward(cache, x, n, out),
            (Mixer::GatedDeltaNet(g), LayerState::Gdn(s)) => g.forward(s, x, n, out),
            (m, s) => {
                return Err(ModelError::StateMismatch(format!(
                    "a {:?} layer was given a {:?} state",
                    m.kind(),
                    s.kind()
                )))
            }
        }
        Ok(())
    }
}
