//! Architectures assembled from parts (embedding, mixers, MLP, head) and their per-layer
//! state.
//!
//! - [`config`]: `ModelConfig` from GGUF metadata or HF config.json.
//! - [`transformer`]: `Model` (load, forward) and `Layer`.
//! - [`mixer`]: attention (+ KV cache) and Gated DeltaNet (+ recurrent state).
//! - [`mlp`], [`norm`], [`embedding`]: the other parts; [`weights`]: claiming tensors.
//! - [`mtp`]: Qwen3.5's multi-token-prediction head (`Model::mtp`), a drafter's part.
//! - [`state`]: `ModelState`, one `LayerState` per layer.
//!
//! Tensors are addressed by GGUF names (`blk.N.attn_q.weight`, ...) whatever the source.

pub mod config;
pub mod embedding;
pub mod error;
pub mod mixer;
pub mod mlp;
pub mod mtp;
pub mod norm;
pub mod state;
pub mod transformer;
pub mod tree;
pub mod verify;
pub mod weights;

#[cfg(test)]
pub(crate) mod golden;
#[cfg(test)]
pub(crate) mod testing;

pub use config::{Arch, LayerKind, ModelConfig, SourceKind};
pub use error::ModelError;
pub use mixer::{Attention, GatedDeltaNet, GdnState, KvCache, Mixer};
pub use mtp::MtpHead;
pub use norm::RmsNorm;
pub use state::{LayerState, ModelState};
pub use transformer::{Layer, Logits, Model};
pub use tree::{TokenTree, TreeBuilder};
pub use verify::{Outputs, Verified};
