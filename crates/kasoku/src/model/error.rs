//! Errors of model loading and running. Loading errors name the file, the tensor or the
//! configuration key; running errors name the offending input.

use crate::format::FormatError;
use crate::kernels::matmul::MatMulError;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Format(#[from] FormatError),
    /// A configuration key is missing or has an unusable value.
    #[error("{source_path}: config: {reason}")]
    Config { source_path: String, reason: String },
    /// The checkpoint's architecture is not one kasoku runs.
    #[error("{source_path}: unsupported architecture '{arch}'")]
    UnsupportedArch { source_path: String, arch: String },
    /// A tensor's bytes could not be used as a weight matrix.
    #[error("tensor '{tensor}': {source}")]
    Weight {
        tensor: String,
        #[source]
        source: MatMulError,
    },
    /// A tensor has a type the model cannot use for it.
    #[error("tensor '{tensor}': {reason}")]
    Tensor { tensor: String, reason: String },
    /// A token id outside the vocabulary.
    #[error("token id {token} is outside the vocabulary of {vocab}")]
    TokenOutOfRange { token: u32, vocab: usize },
    /// Appending the tokens would pass the state's capacity.
    #[error("context full: {len} tokens in the state + {new} new > capacity {max_len}")]
    ContextFull {
        len: usize,
        new: usize,
        max_len: usize,
    },
    /// The state was not made by this model (layer count or kinds differ).
    #[error("state does not match the model: {0}")]
    StateMismatch(String),
    /// A feature this build does not implement yet.
    #[error("not supported: {0}")]
    Unsupported(String),
}
