//! Text in, text out: renders chat prompts through the model's template, generates with a
//! `Session`, and streams the answer as text that respects UTF-8 boundaries and stop strings.

#![warn(missing_docs)]

use serde_json::Map;

use super::loader::LoadedModel;
use super::session::{EngineError, Flow, GenerateOptions, Generation, Session};
use super::stop::StopMatcher;
use crate::tokenizer::{ChatMessage, TokenizerError};

/// How to turn a conversation into prompt tokens.
#[derive(Clone, Debug, Default)]
pub struct PromptOptions {
    /// Skip the chat template: the last user message is the prompt text.
    pub raw: bool,
    /// `enable_thinking` for templates that support it.
    pub think: bool,
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
}

/// The prompt tokens for a conversation (ending with a user turn), ready for generation.
pub fn prompt_tokens(
    model: &LoadedModel,
    messages: &[ChatMessage],
    options: &PromptOptions,
) -> Result<Vec<u32>, TextError> {
    let tokenizer = &model.tokenizer;
    if options.raw {
        let text: String = messages
            .last()
            .map(|m| m.content.clone())
            .unwrap_or_default();
        return Ok(tokenizer.encode_with_bos(&text, true)?);
    }
    let template = model.template.as_ref().ok_or(TextError::NoTemplate)?;
    let mut extra = Map::new();
    extra.insert("enable_thinking".into(), options.think.into());
    let text = template.render(messages, true, &extra)?;
    Ok(tokenizer.encode_with_bos(&text, true)?)
}

/// The end-of-generation tokens of a model: the tokenizer's, plus generation_config.json's.
pub fn stop_tokens(model: &LoadedModel) -> Vec<u32> {
    let mut ids = model.tokenizer.eos_ids().to_vec();
    if let Some(d) = &model.defaults {
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
    let mut decoder = model.tokenizer.stream_decoder().skip_special(true);
    let mut stops = StopMatcher::new(stop_strings);
    let mut answer = String::new();
    let mut emit = |piece: &str, answer: &mut String| {
        if !piece.is_empty() {
            answer.push_str(piece);
            on_text(piece);
        }
    };
    let generation = session.generate(prompt, options, &mut |token| {
        let piece = decoder.push(token);
        let released = stops.push(&piece);
        emit(&released, &mut answer);
        if stops.stopped() {
            Flow::Stop
        } else {
            Flow::Continue
        }
    })?;
    if !stops.stopped() {
        let tail = stops.push(&decoder.flush());
        emit(&tail, &mut answer);
        if !stops.stopped() {
            let held = stops.flush();
            emit(&held, &mut answer);
        }
    }
    Ok((generation, answer))
}
