//! Sessions, sampling, the decode loop and its statistics, and the text layer over them
//! (chat templates, streaming, stop strings).

pub mod context;
pub mod device;
pub mod generator;
pub mod host_device;
pub mod loader;
pub mod logprobs;
pub mod prefix_cache;
pub mod session;
pub mod speculative;
pub mod stats;
pub mod stop;
pub mod text;

/// The sampler sits below `spec` and `engine` (see [`crate::sampler`]); re-exported here.
pub use crate::sampler;
pub use crate::sampler::SamplingParams;
pub use context::{available_memory, ContextError, ContextPlan, ContextRequest};
pub use device::{
    device_draft_speculator, device_speculator, DeviceModel, DeviceSession, DeviceState, LogitsRow,
};
pub use generator::Generator;
pub use host_device::HostDevice;
pub use loader::{check_memory, LoadError, LoadedModel};
pub use logprobs::{token_logprobs, TokenLogprobs, MAX_TOP_LOGPROBS};
pub use prefix_cache::PrefixCache;
pub use session::{Emitted, EngineError, FinishReason, Flow, GenerateOptions, Generation, Session};
pub use speculative::{build_speculator, build_speculator_from, DraftSource, SpecKind, Speculator};
pub use stats::GenerationStats;
pub use text::{
    end_tokens, generate_text, generate_text_on, prompt_tokens, render_prompt, stop_tokens,
    PromptOptions, TextError, TextStream, PROMPT_BYTES_PER_TOKEN,
};
