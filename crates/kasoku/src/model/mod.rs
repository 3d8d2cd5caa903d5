//! Architectures assembled from parts (embedding, mixers, MLP, head) and their per-layer
//! state.
//!
//! - [`config`]: `ModelConfig` from GGUF metadata or HF config.json.
//! - [`transformer`]: `Model` (load) and `Layer`.
//! - [`batch`]: `Batch`, what one pass computes (a chain, a tree, more nodes of a tree; the
//!   outputs wanted), and `Output`, what comes back to the host.
//! - [`run`]: `Model::run`, the forward pass: the one layer loop.
//! - [`verify`]: tree verification and `Model::commit` of an accepted path.
//! - [`trace`]: the hook that sees every named step of a pass (the profiler's).
//! - [`mixer`]: attention (+ KV cache) and Gated DeltaNet (+ recurrent state).
//! - [`mlp`], [`norm`], [`embedding`]: the other parts; [`weights`]: claiming tensors.
//! - [`footprint`]: the memory a checkpoint will need, estimated before loading it.
//! - [`mtp`]: Qwen3.5's multi-token-prediction head (`Model::mtp`), a drafter's part.
//! - [`state`]: `ModelState`, one `LayerState` per layer.
//!
//! Tensors are addressed by GGUF names (`blk.N.attn_q.weight`, ...) whatever the source.

pub mod batch;
pub mod config;
pub mod embedding;
pub mod error;
pub mod footprint;
pub mod mixer;
pub mod mlp;
pub mod mtp;
pub mod norm;
pub mod run;
pub mod state;
pub mod trace;
pub mod transformer;
pub mod tree;
pub mod verify;
pub mod weights;

#[cfg(test)]
pub(crate) mod golden;
#[cfg(test)]
pub(crate) mod testing;

pub use batch::{Batch, Logits, Output, Shape};
pub use config::{Arch, LayerKind, ModelConfig, SourceKind};
pub use error::ModelError;
pub use footprint::Footprint;
pub use mixer::{Attention, GatedDeltaNet, GdnState, KvCache, KvType, Mixer};
pub use mtp::MtpHead;
pub use norm::RmsNorm;
pub use run::CHUNK;
pub use state::{LayerState, ModelState};
pub use trace::{NoTrace, Op, Trace};
pub use transformer::{Layer, Model};
pub use tree::{TokenTree, TreeBuilder};
