//! Errors of tokenizer loading, encoding and chat-template rendering.

use std::path::PathBuf;

use crate::format::FormatError;

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error(transparent)]
    Format(#[from] FormatError),
    /// The tokenizer description (GGUF metadata, tokenizer.json...) is missing or invalid.
    #[error("{path}: tokenizer: {reason}")]
    Invalid { path: PathBuf, reason: String },
    /// The `tokenizers` library failed while encoding.
    #[error("tokenizer: encoding failed: {0}")]
    Encode(String),
    /// The chat template is missing, does not compile, or failed while rendering
    /// (including `raise_exception` calls in the template).
    #[error("chat template ({source_name}): {reason}")]
    Template { source_name: String, reason: String },
}
