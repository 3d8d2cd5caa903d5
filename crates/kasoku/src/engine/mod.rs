//! Sessions, sampling, the decode loop and its statistics.

pub mod sampler;
pub mod session;
pub mod stats;
pub mod stop;

pub use sampler::SamplingParams;
pub use session::{EngineError, FinishReason, Flow, GenerateOptions, Generation, Session};
pub use stats::GenerationStats;
