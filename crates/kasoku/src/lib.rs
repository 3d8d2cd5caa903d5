//! kasoku: a local LLM inference engine.
//!
//! # Embedding it
//!
//! Load a checkpoint (a GGUF file or a Hugging Face directory) once, open a [`Session`] per
//! conversation, and generate: tokens or text pieces stream to a callback as they are
//! sampled, and every answer comes back with its [`GenerationStats`].
//!
//! ```no_run
//! use kasoku::{ChatMessage, LoadedModel, PromptOptions, SamplingParams};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let model = LoadedModel::load("qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")?;
//! let mut session = model.session(4096);
//! let chat = [ChatMessage::new("user", "What is the capital of France?")];
//! let prompt = kasoku::prompt_tokens(&model, &chat, &PromptOptions::default())?;
//! let options = model.options(SamplingParams::default(), 64); // greedy, 64 tokens at most
//! let (generation, _answer) =
//!     kasoku::generate_text(&mut session, &model, &prompt, &options, &[], &mut |piece| {
//!         print!("{piece}") // each piece of text as soon as it is final
//!     })?;
//! eprintln!("\n{}", generation.stats.summary());
//! # Ok(())
//! # }
//! ```
//!
//! `examples/embed.rs` is the same as a program. [`Session::generate`] streams tokens
//! ([`Emitted`]) instead of text; [`Session::generate_cached`] shares prompt prefixes between
//! sessions through a [`engine::PrefixCache`]; [`engine::build_speculator`] turns on speculative
//! decoding (the answer stays the one plain decoding gives). The items above are the facade;
//! the modules below are the engine's layers, public for the server, the CLI, the CUDA
//! backend and benchmarks.
//!
//! # Layers
//!
//! Bottom up (each may use only those above it in this list):
//! - [`quant`]: weight formats (GGUF block types), dequantisation references.
//! - [`format`](mod@format): GGUF and safetensors readers, HF config.json, strict tensor claiming.
//! - [`tokenizer`]: tokenizers from GGUF metadata or tokenizer.json, chat templates.
//! - [`kernels`]: CPU compute (quantized matmul, norms, RoPE, attention, Gated DeltaNet, conv1d).
//! - [`backend`]: the `Backend` trait (one method per kernel family), the CPU backend over
//!   `kernels` and the f64 reference backend the backends are tested against.
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

pub mod backend;
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

pub use engine::{
    generate_text, prompt_tokens, stop_tokens, Emitted, EngineError, FinishReason, Flow,
    GenerateOptions, Generation, GenerationStats, LoadError, LoadedModel, PromptOptions, Session,
    TextError,
};
pub use model::KvType;
pub use sampler::SamplingParams;
pub use tokenizer::ChatMessage;
