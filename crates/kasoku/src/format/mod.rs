//! Checkpoint formats: GGUF and safetensors readers (memory-mapped), Hugging Face config.json,
//! and strict tensor claiming (every tensor is taken by name, shape and type exactly once).
//!
//! Shapes are given outermost-first, as PyTorch and numpy write them: a linear layer's weight
//! is `[out_features, in_features]` and its rows are contiguous. (GGUF stores `ne` innermost
//! first; its reader reverses them.)

pub mod checkpoint;
pub mod claims;
pub mod error;
pub mod gguf;
pub mod hf_config;
pub mod hf_names;
pub mod kasoku_st;
pub mod kasoku_write;
pub mod limits;
pub mod safetensors;
pub mod tensor;
#[cfg(test)]
pub(crate) mod test_util;

pub use checkpoint::Checkpoint;
pub use claims::Claims;
pub use error::FormatError;
pub use gguf::{write_gguf, GgufFile, GgufTensorInfo, MetaValue};
pub use hf_config::{GenerationDefaults, HfConfig};
pub use safetensors::HfCheckpoint;
pub use tensor::{QuantizedTensor, RawTensor, SourceOrigin, TensorBytes, TensorSource};
