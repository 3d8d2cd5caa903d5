//! kasoku: a local LLM inference engine.
//!
//! Layers, bottom up (each may use only those above it in this list):
//! - [`quant`]: weight formats (GGUF block types), dequantisation references.
//! - [`format`]: GGUF and safetensors readers, HF config.json, strict tensor claiming.
//! - [`tokenizer`]: tokenizers from GGUF metadata or tokenizer.json, chat templates.
//! - [`kernels`]: CPU compute (quantized matmul, norms, RoPE, attention, Gated DeltaNet, conv1d).
//! - [`model`]: architectures assembled from parts, per-layer state, tree verification.
//! - [`constraint`]: the hook of constrained decoding (which tokens may come next).
//! - [`sampler`]: the pure sampler (penalties, top-k/p, min-p, temperature, a draw keyed by
//!   seed and position), below both of the next two.
//! - [`spec`]: speculative decoding's drafters, acceptance rule and budget policy (its
//!   acceptance walk calls the sampler).
//! - [`engine`]: sessions, the decode loop, statistics.
//!
//! Fetching models by name lives in the `kasoku-fetch` crate, serving them over HTTP in
//! `kasoku-server`.

pub mod constraint;
pub mod engine;
pub mod format;
pub mod kernels;
pub mod model;
pub mod quant;
pub mod sampler;
pub mod spec;
#[cfg(test)]
mod test_util;
pub mod tokenizer;
