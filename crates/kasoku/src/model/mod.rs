//! Architectures assembled from parts (embedding, mixers, MLP, head) and their per-layer
//! state. The public surface is what a caller of a forward pass needs: [`Model`] (load,
//! [`Model::run`] a [`Batch`] on a [`ModelState`] into an [`Output`], [`Model::commit`] a
//! verified tree's path), the configuration types, [`TokenTree`], the [`Trace`] hook and
//! [`MtpHead`]. The parts stay inside; their files:
//!
//! - `config.rs`: `ModelConfig` from GGUF metadata or HF config.json.
//! - `transformer.rs`: `Model` (load) and `Layer`.
//! - `batch.rs`: `Batch`, what one pass computes (a chain, a tree, more nodes of a tree; the
//!   outputs wanted), and `Output`, what comes back to the host.
//! - `run.rs`: `Model::run`, the forward pass: the one layer loop.
//! - `verify.rs`: tree verification and `Model::commit` of an accepted path.
//! - `trace.rs`: the hook that sees every named step of a pass (the profiler's).
//! - `mixer/`: attention (+ KV cache) and Gated DeltaNet (+ recurrent state).
//! - `mlp.rs`, `norm.rs`, `embedding.rs`: the other parts; `weights.rs`: claiming tensors.
//! - `footprint.rs`: the memory a checkpoint will need, estimated before loading it.
//! - `mtp.rs`: Qwen3.5's multi-token-prediction head (`Model::mtp`), a drafter's part.
//! - `dflash.rs`: a DFlash block drafter's network (the target's layer outputs in, the
//!   marginals of the next block out), a drafter's part.
//! - `state.rs`: `ModelState`, one layer state per layer, behind methods; `scratch.rs`: the
//!   activation buffers a state's passes reuse.
//!
//! Everything that computes is generic over the backend (`Model<B: Backend = Cpu>`, see
//! `crate::backend`): weights are the backend's packed matrices, activations, recurrent states
//! and KV caches live in its memory, and results reach the host only where a batch asks.
//!
//! Tensors are addressed by GGUF names (`blk.N.attn_q.weight`, ...) whatever the source.

mod batch;
mod config;
pub mod dflash;
mod embedding;
mod error;
pub mod footprint;
mod mixer;
mod mlp;
mod mtp;
mod norm;
mod run;
pub(crate) mod scratch;
mod state;
mod trace;
mod transformer;
mod tree;
mod verify;
mod weights;

#[cfg(test)]
pub(crate) mod golden;
#[cfg(test)]
pub(crate) mod testing;

pub use batch::{Batch, Logits, Output, Shape};
pub use config::{Arch, LayerKind, ModelConfig, SourceKind};
pub use dflash::{is_dflash_checkpoint, DFlash, DFlashConfig, DFlashContext, DFLASH_ARCHITECTURE};
pub use error::ModelError;
pub use footprint::Footprint;
pub use mixer::KvType;
pub use mtp::MtpHead;
pub use run::CHUNK;
pub use state::{Checkpoint, ModelState};
pub use trace::{NoTrace, Op, Trace};
pub use transformer::Model;
pub use tree::{TokenTree, TreeBuilder, NO_PARENT};

pub(crate) use norm::RmsNorm;
