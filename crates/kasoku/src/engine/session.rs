//! `Session`: one conversation's state over shared model weights. It feeds prompts (reusing
//! the longest prefix already in its cache), samples, and reports statistics. Plain decoding
//! is the loop below; speculative decoding will plug its drafter into the same loop.

use std::sync::Arc;
use std::time::Instant;

use super::sampler::{self, ParamError, SamplingParams};
use super::stats::GenerationStats;
use crate::model::{Logits, Model, ModelError, ModelState};

/// What to generate.
#[derive(Clone, Debug)]
pub struct GenerateOptions {
    pub sampling: SamplingParams,
    pub max_tokens: usize,
    /// Tokens that end the answer (the model's end-of-generation tokens); not emitted.
    pub stop_tokens: Vec<u32>,
}

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token or a stop string.
    Stop,
    /// `max_tokens` reached.
    Length,
    /// The context is full.
    ContextFull,
}

impl FinishReason {
    /// The OpenAI name (`stop` or `length`).
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length | FinishReason::ContextFull => "length",
        }
    }
}

/// What the caller says after each token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    Continue,
    /// Stop now (e.g. a stop string was seen); finish reason `Stop`.
    Stop,
}

/// The result of one generation.
#[derive(Clone, Debug)]
pub struct Generation {
    pub tokens: Vec<u32>,
    pub finish: FinishReason,
    pub stats: GenerationStats,
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Param(#[from] ParamError),
    #[error("the prompt has {prompt} tokens, but the context holds {ctx}")]
    PromptTooLong { prompt: usize, ctx: usize },
    #[error("the prompt is empty")]
    EmptyPrompt,
}

/// A conversation's state. Cheap to create; the weights are shared.
pub struct Session {
    pub(super) model: Arc<Model>,
    pub(super) state: ModelState,
    /// The tokens whose effects are in `state`, in order.
    pub(super) tokens: Vec<u32>,
}

impl Session {
    pub fn new(model: Arc<Model>, ctx_size: usize) -> Self {
        let state = model.new_state(ctx_size);
        Session {
            model,
            state,
            tokens: Vec::new(),
        }
    }

    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// Context capacity in tokens.
    pub fn ctx_size(&self) -> usize {
        self.state.max_len
    }

    /// Tokens currently in the cache.
    pub fn cached_tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Forgets everything in the cache.
    pub fn reset(&mut self) {
        self.state = self.model.new_state(self.state.max_len);
        self.tokens.clear();
    }

    /// Prefills `prompt` (reusing the cached prefix) and generates. `on_token` sees each new
    /// token as it is sampled (not called for stop tokens) and may end generation.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        options: &GenerateOptions,
        on_token: &mut dyn FnMut(u32) -> Flow,
    ) -> Result<Generation, EngineError> {
        options.sampling.validate()?;
        if prompt.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        if prompt.len() >= self.ctx_size() {
            return Err(EngineError::PromptTooLong {
                prompt: prompt.len(),
                ctx: self.ctx_size(),
            });
        }
        let start = Instant::now();
        let mut stats = GenerationStats::default();

        let reused = self.reuse_prefix(prompt);
        stats.cached_tokens = reused;
        stats.prompt_tokens = prompt.len() - reused;
        let mut logits = self.feed(&prompt[reused..])?;
        stats.prefill_time = start.elapsed();

        let mut generated = Vec::new();
        let mut history: Vec<u32> = prompt.to_vec();
        let mut first_token_at = None;
        let finish = loop {
            if generated.len() >= options.max_tokens {
                break FinishReason::Length;
            }
            let token = sampler::sample(&options.sampling, &logits, &history, history.len());
            if stats.decode_passes > 0 {
                stats.decode_tokens += 1;
            }
            if first_token_at.is_none() {
                first_token_at = Some(Instant::now());
                stats.time_to_first_token = start.elapsed();
            }
            if options.stop_tokens.contains(&token) {
                break FinishReason::Stop;
            }
            generated.push(token);
            history.push(token);
            if on_token(token) == Flow::Stop {
                break FinishReason::Stop;
            }
            if generated.len() >= options.max_tokens {
                break FinishReason::Length;
            }
            if self.state.len() + 1 >= self.ctx_size() {
                break FinishReason::ContextFull;
            }
            logits = self.feed(&[token])?;
            stats.decode_passes += 1;
        };
        let end = Instant::now();
        stats.generated_tokens = generated.len();
        stats.decode_time = first_token_at.map(|t| end - t).unwrap_or_default();
        stats.total_time = end - start;
        Ok(Generation {
            tokens: generated,
            finish,
            stats,
        })
    }

    /// Keeps the longest common prefix of the cache and `prompt` (at most `prompt.len() - 1`
    /// tokens, so that the last prompt token is computed and yields logits). Returns its length.
    fn reuse_prefix(&mut self, prompt: &[u32]) -> usize {
        let common = self
            .tokens
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count();
        let keep = common.min(prompt.len() - 1);
        if keep == self.tokens.len() {
            return keep;
        }
        if keep > 0 && self.state.truncate(keep) {
            self.tokens.truncate(keep);
            return keep;
        }
        // A recurrent state cannot be rewound: start over.
        self.reset();
        0
    }

    /// Runs `tokens` through the model, appending them to the cache; returns the last logits.
    fn feed(&mut self, tokens: &[u32]) -> Result<Vec<f32>, EngineError> {
        let logits = self.model.forward(&mut self.state, tokens, Logits::Last)?;
        self.tokens.extend_from_slice(tokens);
        Ok(logits)
    }
}
