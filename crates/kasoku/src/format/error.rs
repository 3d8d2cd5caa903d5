//! Errors of checkpoint reading and tensor claiming. Each names the file and, where there is
//! one, the tensor.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file's structure is invalid: bad magic, truncated header, impossible counts...
    #[error("{path}: corrupt file: {reason}")]
    Corrupt { path: PathBuf, reason: String },
    #[error("{path}: tensor '{tensor}' has unsupported type {type_name}")]
    UnsupportedType {
        path: PathBuf,
        tensor: String,
        type_name: String,
    },
    #[error("{path}: tensor '{tensor}' extends past the end of the file (truncated file?)")]
    Truncated { path: PathBuf, tensor: String },
    #[error("{path}: missing tensor '{tensor}'")]
    MissingTensor { path: PathBuf, tensor: String },
    #[error("{path}: tensor '{tensor}' has shape {found:?}, expected {expected:?}")]
    WrongShape {
        path: PathBuf,
        tensor: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    #[error("{path}: tensor '{tensor}' has type {found}, expected one of {expected}")]
    WrongType {
        path: PathBuf,
        tensor: String,
        expected: String,
        found: String,
    },
    #[error("{path}: tensor(s) not used by the model: {tensors}")]
    Unclaimed { path: PathBuf, tensors: String },
    #[error("{path}: metadata: {reason}")]
    Metadata { path: PathBuf, reason: String },
}
