//! Loading everything a conversation needs from one checkpoint path: the model weights, its
//! tokenizer, its chat template and the generation defaults its authors shipped.

#![warn(missing_docs)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::context::{available_memory, ContextRequest, MIN_DEFAULT_CONTEXT};
use super::session::{GenerateOptions, Session};
use super::text::stop_tokens;
use crate::format::checkpoint::GGUF_META;
use crate::format::gguf::GgufFile;
use crate::format::hf_config::GenerationDefaults;
use crate::model::{Footprint, KvType, Model, ModelError};
use crate::quant::Target;
use crate::sampler::SamplingParams;
use crate::tokenizer::{ChatTemplate, Tokenizer, TokenizerError};

/// A model ready to serve: weights, tokenizer and template, all shareable.
pub struct LoadedModel {
    /// The checkpoint it was loaded from.
    pub path: PathBuf,
    /// The weights (any number of sessions share them).
    pub model: Arc<Model>,
    /// The tokenizer that came with the checkpoint.
    pub tokenizer: Arc<Tokenizer>,
    /// `None` when the checkpoint ships no chat template (then only raw prompts work).
    pub template: Option<Arc<ChatTemplate>>,
    /// Sampling defaults from generation_config.json (HF directories only).
    pub defaults: Option<GenerationDefaults>,
}

/// Why a checkpoint could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The weights or their configuration.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The tokenizer.
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// The model cannot fit in the memory available (the message has the numbers).
    #[error("{path}: {reason}")]
    Memory {
        /// The checkpoint.
        path: String,
        /// What does not fit, with the numbers.
        reason: String,
    },
    /// The tokenizer knows more tokens than the model has rows for.
    #[error("{path}: tokenizer has {tokenizer} tokens but the model's vocabulary is {model}")]
    VocabMismatch {
        /// The checkpoint.
        path: String,
        /// Tokens the tokenizer knows.
        tokenizer: usize,
        /// Rows of the model's embedding.
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
        LoadedModel::load_within(path, kv_type, available_memory())
    }

    /// [`LoadedModel::load_with`], checking first ([`check_memory`]) that the model fits in
    /// `available` bytes (`None`: unchecked).
    pub fn load_within(
        path: impl AsRef<Path>,
        kv_type: KvType,
        available: Option<u64>,
    ) -> Result<LoadedModel, LoadError> {
        LoadedModel::load_converted(path, kv_type, None, available)
    }

    /// [`LoadedModel::load_with`], converting the matrices to `target` as they load (see
    /// [`LoadedModel::load_converted`]).
    pub fn load_as(
        path: impl AsRef<Path>,
        kv_type: KvType,
        target: Option<Target>,
    ) -> Result<LoadedModel, LoadError> {
        LoadedModel::load_converted(path, kv_type, target, available_memory())
    }

    /// [`LoadedModel::load_within`], converting the matrices to `target` as they load (e.g.
    /// `--quantize m`: kasoku's formats, `quant::kasoku::Recipe`).
    pub fn load_converted(
        path: impl AsRef<Path>,
        kv_type: KvType,
        target: Option<Target>,
        available: Option<u64>,
    ) -> Result<LoadedModel, LoadError> {
        let path = path.as_ref();
        check_memory(path, target, kv_type, available)?;
        let meta = if path.is_dir() {
            let meta = path.join(GGUF_META);
            meta.exists().then_some(meta)
        } else {
            Some(path.to_path_buf())
        };
        let (tokenizer, template, defaults) = match meta {
            None => {
                let template = ChatTemplate::from_hf_dir(path).ok();
                let defaults = GenerationDefaults::load(path).ok();
                (Tokenizer::from_hf_dir(path)?, template, defaults)
            }
            Some(meta) => {
                let gguf = GgufFile::open(meta).map_err(ModelError::from)?;
                (
                    Tokenizer::from_gguf(&gguf)?,
                    ChatTemplate::from_gguf(&gguf).ok(),
                    None,
                )
            }
        };
        let mut model = Model::load_with(path, target)?;
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

    /// A new conversation over these weights with room for `ctx_size` tokens (prompt and
    /// answer; at most the model's own context is useful, [`LoadedModel::max_context`]).
    pub fn session(&self, ctx_size: usize) -> Session {
        Session::new(Arc::clone(&self.model), ctx_size)
    }

    /// The context length the model was trained for (its config's).
    pub fn max_context(&self) -> usize {
        self.model.config.max_context
    }

    /// Options for an answer of at most `max_tokens` tokens that ends at the model's
    /// end-of-generation tokens, sampled with `sampling` (`SamplingParams::default()` is
    /// greedy).
    pub fn options(&self, sampling: SamplingParams, max_tokens: usize) -> GenerateOptions {
        GenerateOptions {
            sampling,
            max_tokens,
            stop_tokens: stop_tokens(self),
            ..GenerateOptions::default()
        }
    }
}

/// Refuses, with the numbers, a checkpoint whose weights (packed as [`Model::load_with`] with
/// `matrix_format` packs them), one pass's scratch and a KV cache of the shortest context a
/// default may shrink to ([`MIN_DEFAULT_CONTEXT`], or the model's own when shorter) cannot fit
/// in `available` bytes, before anything is allocated. The context itself is planned once the
/// model is in ([`ContextRequest::plan`]).
pub fn check_memory(
    path: &Path,
    matrix_format: Option<Target>,
    kv_type: KvType,
    available: Option<u64>,
) -> Result<(), LoadError> {
    if available.is_none() {
        return Ok(());
    }
    let footprint = Footprint::of_path(path, matrix_format, kv_type)?;
    ContextRequest {
        requested: Some(MIN_DEFAULT_CONTEXT.min(footprint.max_context.max(1))),
        model_max: footprint.max_context,
        kv_bytes_per_token: footprint.kv_bytes_per_token,
        kv_type,
        sessions: 1,
        other_bytes: 0,
        weight_bytes: footprint.weight_bytes,
        scratch_bytes: footprint.scratch_bytes,
        available,
    }
    .plan()
    .map(drop)
    .map_err(|e| LoadError::Memory {
        path: path.display().to_string(),
        reason: format!("cannot load: {}", e.0),
    })
}
