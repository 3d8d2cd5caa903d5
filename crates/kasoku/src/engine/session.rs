//! `Session`: one conversation's state over shared model weights. It feeds prompts (reusing
//! the longest prefix already in its cache), samples, and reports statistics. Plain decoding
//! is the loop below; with a [`Speculator`] the decode loop of `speculative` runs instead.

#![warn(missing_docs)]

use std::sync::Arc;
use std::time::Instant;

use super::logprobs::{token_logprobs, TokenLogprobs, MAX_TOP_LOGPROBS};
use super::speculative::Speculator;
use super::stats::GenerationStats;
use crate::constraint::{Constraint, ConstraintError, TokenConstraint};
use crate::model::{Batch, Logits, Model, ModelError, ModelState, Output};
use crate::sampler::{self, ParamError, SamplingParams};

/// What to generate.
#[derive(Clone, Debug, Default)]
pub struct GenerateOptions {
    /// How each token is drawn.
    pub sampling: SamplingParams,
    /// Most tokens to generate (the answer ends with finish reason `Length` there).
    pub max_tokens: usize,
    /// Tokens that end the answer (the model's end-of-generation tokens); not emitted.
    pub stop_tokens: Vec<u32>,
    /// Constrained decoding: every sampled token is drawn from what this allows.
    pub constraint: Option<Constraint>,
    /// Log-probabilities of the emitted tokens with this many alternatives each
    /// (0..=[`MAX_TOP_LOGPROBS`]); `None`: none are computed.
    pub logprobs: Option<usize>,
}

/// A token as it is emitted: what `on_token` sees.
#[derive(Clone, Copy, Debug)]
pub struct Emitted<'a> {
    /// The token.
    pub token: u32,
    /// Its log-probabilities, when [`GenerateOptions::logprobs`] asked for them.
    pub logprobs: Option<&'a TokenLogprobs>,
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
    /// Go on generating.
    Continue,
    /// Stop now (e.g. a stop string was seen); finish reason `Stop`.
    Stop,
}

/// The result of one generation.
#[derive(Clone, Debug)]
pub struct Generation {
    /// The answer's tokens (a stop token is not included).
    pub tokens: Vec<u32>,
    /// One entry per token of `tokens` when [`GenerateOptions::logprobs`] asked for them.
    pub logprobs: Vec<TokenLogprobs>,
    /// Why it ended.
    pub finish: FinishReason,
    /// Counters and timings.
    pub stats: GenerationStats,
}

/// Why a generation failed.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The model refused a pass (a token outside its vocabulary, a full context, ...).
    #[error(transparent)]
    Model(#[from] ModelError),
    /// A sampling parameter is out of range.
    #[error(transparent)]
    Param(#[from] ParamError),
    /// The prompt does not fit in the session's context.
    #[error("the prompt has {prompt} tokens, but the context holds {ctx}")]
    PromptTooLong {
        /// Tokens in the prompt.
        prompt: usize,
        /// The session's context.
        ctx: usize,
    },
    /// No prompt tokens.
    #[error("the prompt is empty")]
    EmptyPrompt,
    /// The drafter of speculative decoding failed.
    #[error("{0}")]
    Draft(String),
    /// The constraint of constrained decoding failed.
    #[error(transparent)]
    Constraint(#[from] ConstraintError),
    /// The device running the passes failed (a GPU error, with the driver's words).
    #[error("the device failed: {0}")]
    Device(String),
    /// More log-probability alternatives asked for than [`MAX_TOP_LOGPROBS`].
    #[error("logprobs: at most {MAX_TOP_LOGPROBS} alternatives per token, asked for {0}")]
    TooManyLogprobs(usize),
}

/// A conversation's state. Cheap to create; the weights are shared.
pub struct Session {
    pub(super) model: Arc<Model>,
    pub(super) state: ModelState,
    /// The tokens whose effects are in `state`, in order.
    pub(super) tokens: Vec<u32>,
    /// Speculative decoding, when enabled.
    pub(super) spec: Option<Speculator>,
    /// What the last pass returned (its buffers reused from pass to pass).
    pub(super) out: Output,
}

impl Session {
    /// A conversation over `model` with room for `ctx_size` tokens.
    pub fn new(model: Arc<Model>, ctx_size: usize) -> Self {
        let state = model.new_state(ctx_size);
        Session {
            model,
            state,
            tokens: Vec::new(),
            spec: None,
            out: Output::default(),
        }
    }

    /// Turns speculative decoding on (with this drafter and policy) or off.
    pub fn set_speculator(&mut self, spec: Option<Speculator>) {
        self.spec = spec;
    }

    /// The speculator, when speculative decoding is on.
    pub fn speculator(&self) -> Option<&Speculator> {
        self.spec.as_ref()
    }

    /// The weights it runs on.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// Context capacity in tokens.
    pub fn ctx_size(&self) -> usize {
        self.state.max_len()
    }

    /// Tokens currently in the cache.
    pub fn cached_tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Forgets everything in the cache.
    pub fn reset(&mut self) {
        self.state = self.model.new_state(self.state.max_len());
        self.tokens.clear();
    }

    /// Prefills `prompt` (reusing the cached prefix) and generates. `on_token` sees each new
    /// token as it is sampled (not called for stop tokens) and may end generation.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        options: &GenerateOptions,
        on_token: &mut dyn FnMut(Emitted) -> Flow,
    ) -> Result<Generation, EngineError> {
        options.validate()?;
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
        // What the drafter reads of the target (hidden states, layer outputs), if anything.
        let (hidden, taps) = self.spec.as_ref().map_or((false, Vec::new()), |s| {
            (s.drafter.wants_hidden(), s.drafter.tap_layers())
        });
        let new = &prompt[reused..];
        let batch = Batch::chain(new).hidden(hidden).taps(&taps);
        self.model.run(&mut self.state, &batch, &mut self.out)?;
        self.tokens.extend_from_slice(new);
        stats.prefill_time = start.elapsed();

        let mut run = Run {
            options,
            on_token,
            start,
            generated: Vec::new(),
            logprobs: Vec::new(),
            history: prompt.to_vec(),
            first_token_at: None,
            stats,
            constraint: options.constraint.as_ref().map(Constraint::start),
        };
        let finish = if options.max_tokens == 0 {
            FinishReason::Length
        } else {
            let first = run.sample(&self.out.logits)?;
            match self.spec.take() {
                Some(mut spec) => {
                    let r = spec.decode(self, &mut run, first, prompt);
                    run.stats.spec = Some(spec.take_stats());
                    self.spec = Some(spec);
                    r?
                }
                None => self.decode_plain(&mut run, first)?,
            }
        };
        let end = Instant::now();
        let mut stats = run.stats;
        stats.generated_tokens = run.generated.len();
        stats.decode_time = run.first_token_at.map(|t| end - t).unwrap_or_default();
        stats.total_time = end - start;
        Ok(Generation {
            tokens: run.generated,
            logprobs: run.logprobs,
            finish,
            stats,
        })
    }

    /// Plain decoding: one forward pass per token.
    fn decode_plain(&mut self, run: &mut Run, first: u32) -> Result<FinishReason, EngineError> {
        let mut token = first;
        loop {
            if let Some(finish) = run.take(token, &self.out.logits)? {
                return Ok(finish);
            }
            if self.state.len() + 1 >= self.ctx_size() {
                return Ok(FinishReason::ContextFull);
            }
            self.feed(&[token])?;
            run.stats.decode_passes += 1;
            token = run.sample(&self.out.logits)?;
            run.stats.decode_tokens += 1;
        }
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

    /// Runs `tokens` through the model, appending them to the cache; leaves the last
    /// token's logits in `self.out`.
    fn feed(&mut self, tokens: &[u32]) -> Result<(), EngineError> {
        let batch = Batch::chain(tokens).logits(Logits::Last);
        self.model.run(&mut self.state, &batch, &mut self.out)?;
        self.tokens.extend_from_slice(tokens);
        Ok(())
    }
}

impl GenerateOptions {
    /// Checks the options before any work: sampling values that cannot be sampled, and
    /// more log-probability alternatives than are offered.
    pub fn validate(&self) -> Result<(), EngineError> {
        self.sampling.validate()?;
        match self.logprobs {
            Some(n) if n > MAX_TOP_LOGPROBS => Err(EngineError::TooManyLogprobs(n)),
            _ => Ok(()),
        }
    }
}

/// The answer being generated: emitted tokens, the history the sampler reads, statistics.
pub(super) struct Run<'a> {
    pub(super) options: &'a GenerateOptions,
    pub(super) on_token: &'a mut dyn FnMut(Emitted) -> Flow,
    pub(super) start: Instant,
    pub(super) generated: Vec<u32>,
    /// The emitted tokens' log-probabilities, when asked for.
    pub(super) logprobs: Vec<TokenLogprobs>,
    /// The prompt and every emitted token.
    pub(super) history: Vec<u32>,
    pub(super) first_token_at: Option<Instant>,
    pub(super) stats: GenerationStats,
    /// The constraint's state after the emitted tokens.
    pub(super) constraint: Option<Box<dyn TokenConstraint>>,
}

impl Run<'_> {
    /// Samples the token after `history` from `logits`, under the constraint if any.
    pub(super) fn sample(&mut self, logits: &[f32]) -> Result<u32, EngineError> {
        let mask = self.constraint.as_mut().map(|c| c.mask()).transpose()?;
        let position = self.history.len();
        Ok(sampler::sample_masked(
            &self.options.sampling,
            logits,
            &self.history,
            position,
            mask.as_ref(),
        ))
    }

    /// Takes the next sampled token, drawn from `logits`: emits it, or ends the answer (a stop
    /// token is not emitted). Returns why generation ends, if it does.
    pub(super) fn take(
        &mut self,
        token: u32,
        logits: &[f32],
    ) -> Result<Option<FinishReason>, EngineError> {
        if self.first_token_at.is_none() {
            self.first_token_at = Some(Instant::now());
            self.stats.time_to_first_token = self.start.elapsed();
        }
        if self.options.stop_tokens.contains(&token) {
            return Ok(Some(FinishReason::Stop));
        }
        if let Some(c) = self.constraint.as_mut() {
            c.advance(token)?;
        }
        self.generated.push(token);
        self.history.push(token);
        if let Some(top) = self.options.logprobs {
            self.logprobs.push(token_logprobs(logits, token, top));
        }
        let emitted = Emitted {
            token,
            logprobs: self
                .logprobs
                .last()
                .filter(|_| self.options.logprobs.is_some()),
        };
        if (self.on_token)(emitted) == Flow::Stop {
            return Ok(Some(FinishReason::Stop));
        }
        if self.generated.len() >= self.options.max_tokens {
            return Ok(Some(FinishReason::Length));
        }
        Ok(None)
    }
}
