//! Gated DeltaNet mixer (Qwen3.5 linear-attention layers).
//! Placeholder created by the model framework so the crate compiles; the Gated DeltaNet
//! engineer owns this file and replaces it. Loading a model with GDN layers fails cleanly.

use crate::format::Claims;

use super::super::{ModelConfig, ModelError};

/// Weights of one Gated DeltaNet layer (placeholder).
pub struct GatedDeltaNet;

/// Recurrent + conv state of one Gated DeltaNet layer (placeholder).
pub struct GdnState;

impl GatedDeltaNet {
    pub fn load(_claims: &Claims, layer: usize, _cfg: &ModelConfig) -> Result<Self, ModelError> {
        Err(ModelError::Unsupported(format!(
            "layer {layer}: Gated DeltaNet is not implemented yet"
        )))
    }

    pub fn new_state(&self) -> GdnState {
        GdnState
    }

    /// `x`: `n × hidden` (already normed); `out`: `n × hidden`.
    pub fn forward(&self, _state: &mut GdnState, _x: &[f32], _n: usize, _out: &mut [f32]) {
        unreachable!("a placeholder GatedDeltaNet is never constructed")
    }
}
