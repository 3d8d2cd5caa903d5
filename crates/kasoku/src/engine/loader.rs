//! Loading everything a conversation needs from one checkpoint path: the model weights, its
//! tokenizer, its chat template and the generation defaults its authors shipped.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::format::gguf::GgufFile;
use crate::format::hf_config::GenerationDefaults;
use crate::model::{KvType, Model, ModelError};
use crate::tokenizer::{ChatTemplate, Tokenizer, TokenizerError};

/// A model ready to serve: weights, tokenizer and template, all shareable.
pub struct LoadedModel {
    pub path: PathBuf,
    pub model: Arc<Model>,
    pub tokenizer: Arc<Tokenizer>,
    /// `None` when the checkpoint ships no chat template (then only raw prompts work).
    pub template: Option<Arc<ChatTemplate>>,
    /// Sampling defaults from generation_config.json (HF directories only).
    pub defaults: Option<GenerationDefaults>,
}

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error("{path}: tokenizer has {tokenizer} tokens but the model's vocabulary is {model}")]
    VocabMismatch {
        path: String,
        tokenizer: usize,
        model: usize,
    },
}

impl LoadedModel {
    /// Loads a GGUF file or a Hugging Face directory, with KV caches in f16 (the serving
    /// default; see [`LoadedModel::load_with`]).
    pub fn load(path: impl AsRef<Path>) -> Result<LoadedModel, LoadError> {
        LoadedModel::load_with(path, KvType::default())
    }

    /// [`LoadedModel::load`] with KV caches stored as `kv_type` (an error when the model's
    /// head size cannot be stored so: q8_0 needs a multiple of 32).
    pub fn load_with(path: impl AsRef<Path>, kv_type: KvType) -> Result<LoadedModel, LoadError> {
        let path = path.as_ref();
        let (tokenizer, template, defaults) = if path.is_dir() {
            let template = ChatTemplate::from_hf_dir(path).ok();
            let defaults = GenerationDefaults::load(path).ok();
            (Tokenizer::from_hf_dir(path)?, template, defaults)
        } else {
            let gguf = GgufFile::open(path).map_err(ModelError::from)?;
            (
                Tokenizer::from_gguf(&gguf)?,
                ChatTemplate::from_gguf(&gguf).ok(),
                None,
            )
        };
        let mut model = Model::load(path)?;
        model.set_kv_type(kv_type)?;
        // Vocabularies may be padded beyond the tokenizer (Qwen: 151936 rows, 151665 tokens),
        // never the other way round.
        if tokenizer.token_count() > model.config.vocab {
            return Err(LoadError::VocabMismatch {
                path: path.display().to_string(),
                tokenizer: tokenizer.token_count(),
                model: model.config.vocab,
            });
        }
        Ok(LoadedModel {
            path: path.to_path_buf(),
            model: Arc::new(model),
            tokenizer: Arc::new(tokenizer),
            template: template.map(Arc::new),
            defaults,
        })
    }
}
