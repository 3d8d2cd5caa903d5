//! Opening any checkpoint path kasoku loads: a GGUF file, a Hugging Face directory
//! (`config.json` and safetensors, possibly holding matrices in kasoku's formats), or the
//! directory `kasoku quantize` writes from a GGUF file: safetensors under GGUF names beside
//! [`GGUF_META`], a GGUF file with the source's metadata (configuration, tokenizer, chat
//! template) and no tensors.

use std::path::Path;

use super::gguf::GgufFile;
use super::{FormatError, HfCheckpoint, TensorSource};

/// The metadata file of a directory quantized from a GGUF file.
pub const GGUF_META: &str = "kasoku.gguf";

/// An open checkpoint.
pub enum Checkpoint {
    Gguf(GgufFile),
    Hf(HfCheckpoint),
    /// Tensors under GGUF names, with the GGUF metadata beside them.
    GgufMeta {
        meta: GgufFile,
        tensors: HfCheckpoint,
    },
}

impl Checkpoint {
    /// Opens `path` (see the module documentation).
    pub fn open(path: impl AsRef<Path>) -> Result<Checkpoint, FormatError> {
        let path = path.as_ref();
        if !path.is_dir() {
            return Ok(Checkpoint::Gguf(GgufFile::open(path)?));
        }
        let meta = path.join(GGUF_META);
        if meta.exists() {
            return Ok(Checkpoint::GgufMeta {
                meta: GgufFile::open(&meta)?,
                tensors: HfCheckpoint::open_gguf_named(path)?,
            });
        }
        Ok(Checkpoint::Hf(HfCheckpoint::open(path)?))
    }

    /// Its tensors.
    pub fn tensors(&self) -> &dyn TensorSource {
        match self {
            Checkpoint::Gguf(f) => f,
            Checkpoint::Hf(c) => c,
            Checkpoint::GgufMeta { tensors, .. } => tensors,
        }
    }

    /// The GGUF metadata (configuration, tokenizer, template), where it comes from a GGUF.
    pub fn gguf_meta(&self) -> Option<&GgufFile> {
        match self {
            Checkpoint::Gguf(f) => Some(f),
            Checkpoint::GgufMeta { meta, .. } => Some(meta),
            Checkpoint::Hf(_) => None,
        }
    }
}
