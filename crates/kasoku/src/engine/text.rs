//! Text in, text out: renders chat prompts through the model's template, generates with a
//! `Session`, and streams the answer as text that respects UTF-8 boundaries and stop strings.

#![warn(missing_docs)]

use serde_json::Map;

use super::generator::Generator;
use super::loader::LoadedModel;
use super::session::{EngineError, Flow, GenerateOptions, Generation, Session};
use super::stop::StopMatcher;
use crate::format::hf_config::GenerationDefaults;
use crate::tokenizer::{ChatMessage, ChatTemplate, StreamDecoder, Tokenizer, TokenizerError};

/// A prompt's bytes are bounded before it is tokenized: at most this many per token of the
/// context. Real text averages 3-5 bytes per token (CJK ~3, code 3-6); only long runs of one
/// character (Qwen2.5's longest token is 128 spaces) average more than 16. So a prompt that
/// could fit is not refused in practice, while a 4 MB prompt costs nothing (tokenizing runs at
/// about 1 MB/s on one core here, and a prompt of 8192 tokens is at most 128 KiB).
pub const PROMPT_BYTES_PER_TOKEN: usize = 16;

/// How to turn a conversation into prompt tokens.
#[derive(Clone, Debug, Default)]
pub struct PromptOptions {
    /// Skip the chat template: the last user message is the prompt text.
    pub raw: bool,
    /// `enable_thinking` for templates that support it.
    pub think: bool,
    /// The context the prompt must fit in, in tokens: a prompt text (messages, then the
    /// rendered template) longer than [`PROMPT_BYTES_PER_TOKEN`] bytes per context token is
    /// refused before it is tokenized. `None`: unbounded.
    pub context: Option<usize>,
}

/// Why a text generation failed.
#[derive(Debug, thiserror::Error)]
pub enum TextError {
    /// Generating.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// Rendering or tokenizing the prompt.
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// A chat was asked of a model that ships no chat template.
    #[error("this model has no chat template; use a raw prompt (--raw)")]
    NoTemplate,
    #[error(
        "the prompt has {bytes} bytes, more than a context of {context} tokens can hold \
         ({} bytes at {PROMPT_BYTES_PER_TOKEN} per token); it was not tokenized",
        context.saturating_mul(PROMPT_BYTES_PER_TOKEN)
    )]
    /// The prompt's text is longer than the context could hold in any tokenization.
    PromptTooLong {
        /// Bytes of the prompt's text.
        bytes: usize,
        /// The context, in tokens.
        context: usize,
    },
}

/// The prompt tokens for a conversation (ending with a user turn), ready for generation.
pub fn prompt_tokens(
    model: &LoadedModel,
    messages: &[ChatMessage],
    options: &PromptOptions,
) -> Result<Vec<u32>, TextError> {
    render_prompt(
        &model.tokenizer,
        model.template.as_deref(),
        messages,
        options,
    )
}

/// [`prompt_tokens`] from a tokenizer and a chat template alone (for a model whose weights
/// live elsewhere, e.g. on a GPU).
pub fn render_prompt(
    tokenizer: &Tokenizer,
    template: Option<&ChatTemplate>,
    messages: &[ChatMessage],
    options: &PromptOptions,
) -> Result<Vec<u32>, TextError> {
    let fits = |bytes: usize| match options.context {
        Some(context) if bytes > context.saturating_mul(PROMPT_BYTES_PER_TOKEN) => {
            Err(TextError::PromptTooLong { bytes, context })
        }
        _ => Ok(()),
    };
    if options.raw {
        let text: String = messages
            .last()
            .map(|m| m.content.clone())
            .unwrap_or_default();
        fits(text.len())?;
        return Ok(tokenizer.encode_with_bos(&text, true)?);
    }
    let template = template.ok_or(TextError::NoTemplate)?;
    fits(messages.iter().map(|m| m.content.len()).sum())?;
    let mut extra = Map::new();
    extra.insert("enable_thinking".into(), options.think.into());
    let text = template.render(messages, true, &extra)?;
    fits(text.len())?;
    Ok(tokenizer.encode_with_bos(&text, true)?)
}

/// The end-of-generation tokens of a model: the tokenizer's, plus generation_config.json's.
pub fn stop_tokens(model: &LoadedModel) -> Vec<u32> {
    end_tokens(&model.tokenizer, model.defaults.as_ref())
}

/// [`stop_tokens`] from a tokenizer and generation defaults alone (for a model whose weights
/// live elsewhere, e.g. on a GPU).
pub fn end_tokens(tokenizer: &Tokenizer, defaults: Option<&GenerationDefaults>) -> Vec<u32> {
    let mut ids = tokenizer.eos_ids().to_vec();
    if let Some(d) = defaults {
        ids.extend(&d.eos_token_ids);
    }
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// Generates from `prompt`, calling `on_text` with each piece of answer text as soon as it is
/// final. Returns the generation (tokens, finish reason, statistics) and the whole answer text.
pub fn generate_text(
    session: &mut Session,
    model: &LoadedModel,
    prompt: &[u32],
    options: &GenerateOptions,
    stop_strings: &[String],
    on_text: &mut dyn FnMut(&str),
) -> Result<(Generation, String), TextError> {
    generate_text_on(
        session,
        &model.tokenizer,
        prompt,
        options,
        stop_strings,
        on_text,
    )
}

/// [`generate_text`] on any [`Generator`] (a CPU session, or a session on a device), its
/// tokens decoded by `tokenizer`.
pub fn generate_text_on(
    generator: &mut dyn Generator,
    tokenizer: &Tokenizer,
    prompt: &[u32],
    options: &GenerateOptions,
    stop_strings: &[String],
    on_text: &mut dyn FnMut(&str),
) -> Result<(Generation, String), TextError> {
    let mut text = TextStream::new(tokenizer, stop_strings);
    let mut answer = String::new();
    let mut emit = |piece: &str, answer: &mut String| {
        if !piece.is_empty() {
            answer.push_str(piece);
            on_text(piece);
        }
    };
    let generation = generator.generate(prompt, options, &mut |emitted| {
        let released = text.push(emitted.token);
        emit(&released, &mut answer);
        if text.stopped() {
            Flow::Stop
        } else {
            Flow::Continue
        }
    })?;
    let tail = text.finish();
    emit(&tail, &mut answer);
    Ok((generation, answer))
}

/// Answer tokens to answer text as it becomes final: decoded without splitting UTF-8
/// characters (special tokens skipped), then held back while it may be the start of a stop
/// string; nothing from a stop string on is ever released.
pub struct TextStream {
    decoder: StreamDecoder,
    stops: StopMatcher,
}

impl TextStream {
    /// A stream over `tokenizer`'s tokens that ends at any of `stop_strings`.
    pub fn new(tokenizer: &Tokenizer, stop_strings: &[String]) -> TextStream {
        TextStream {
            decoder: tokenizer.stream_decoder().skip_special(true),
            stops: StopMatcher::new(stop_strings),
        }
    }

    /// The text `token` makes final (often empty).
    pub fn push(&mut self, token: u32) -> String {
        let piece = self.decoder.push(token);
        self.stops.push(&piece)
    }

    /// Whether a stop string was seen (the answer ends there).
    pub fn stopped(&self) -> bool {
        self.stops.stopped()
    }

    /// At the end of the answer, the text still held back (none after a stop string).
    pub fn finish(&mut self) -> String {
        if self.stops.stopped() {
            return String::new();
        }
        let mut out = self.stops.push(&self.decoder.flush());
        if !self.stops.stopped() {
            out.push_str(&self.stops.flush());
        }
        out
    }
}
