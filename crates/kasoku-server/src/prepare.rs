//! A request body made ready for a session: parsed and checked field by field (`request`),
//! its model name checked, its prompt bounded in bytes and tokenized (`prompt` keeps client
//! text that spells control tokens as text), and checked against the context. CPU work: the
//! routes run it on a blocking thread.

use serde_json::{json, Value};

use crate::error::ApiError;
use crate::pool::Engine;
use crate::prompt;
use crate::request::{self, PromptInput, Request};

/// The instruction added to chats that ask for `response_format: json_object`.
const JSON_INSTRUCTION: &str = "Respond with one valid JSON object only.";

/// Which endpoint a request came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Chat,
    Completion,
}

pub fn unknown_model(engine: &Engine, name: &str) -> ApiError {
    ApiError {
        param: Some("model".into()),
        ..ApiError::not_found(
            "model_not_found",
            format!(
                "the model '{name}' does not exist; this server serves '{}'",
                engine.id
            ),
        )
    }
}

/// A request made ready for a worker.
pub struct Prepared {
    pub request: Request,
    pub prompt: Vec<u32>,
    pub in_thinking: bool,
}

/// Parses, checks and tokenizes a request (CPU work: runs on a blocking thread).
pub fn prepare(engine: &Engine, body: &[u8], kind: Kind) -> Result<Prepared, ApiError> {
    let object = request::parse_object(body)?;
    let defaults = engine.model.defaults.as_ref();
    let request = match kind {
        Kind::Chat => request::chat(&object, defaults)?,
        Kind::Completion => request::completion(&object, defaults)?,
    };
    if !engine.names.contains(&request.model) {
        return Err(unknown_model(engine, &request.model));
    }
    let model = &engine.model;
    let tokenizer = &model.tokenizer;
    let ctx = engine.ctx;
    let max_bytes = ctx.saturating_mul(engine.prompt_bytes_per_token);
    let fits = |bytes: usize, param: &str| {
        if bytes <= max_bytes {
            return Ok(());
        }
        Err(ApiError {
            param: Some(param.into()),
            ..ApiError::bad_request(
                "context_length_exceeded",
                format!(
                    "the prompt has {bytes} bytes, more than the context of {ctx} tokens can hold \
                     ({max_bytes} bytes at {} per token); it was not tokenized",
                    engine.prompt_bytes_per_token
                ),
            )
        })
    };
    let mut in_thinking = false;
    let (prompt, param) = match &request.prompt {
        PromptInput::Chat {
            messages,
            template_kwargs,
        } => {
            let template = model.template.as_ref().ok_or_else(|| {
                ApiError::bad_request(
                    "no_chat_template",
                    "this model has no chat template; use /v1/completions with a raw prompt",
                )
            })?;
            let content: usize = messages
                .iter()
                .map(|m| m["content"].as_str().map_or(0, str::len))
                .sum();
            fits(content, "messages")?;
            let mut messages = messages.clone();
            if request.json_object {
                add_json_instruction(&mut messages);
            }
            let mut kwargs = template_kwargs.clone();
            engine.control.mark_conversation(&mut messages, &mut kwargs);
            let text = template
                .render_json(&Value::Array(messages), true, &kwargs)
                .map_err(|e| ApiError::invalid("messages", format!("chat template: {e}")))?;
            fits(text.len(), "messages")?;
            in_thinking = text.trim_end().ends_with("<think>");
            let ids = prompt::encode_rendered(tokenizer, &text).map_err(tokenizer_error)?;
            (ids, "messages")
        }
        // A raw prompt is the client's whole text, template included: its control-token
        // spellings are meant as control tokens.
        PromptInput::Text(text) => {
            fits(text.len(), "prompt")?;
            (encode(tokenizer, text)?, "prompt")
        }
        PromptInput::Tokens(ids) => {
            let vocab = model.model.config.vocab;
            if let Some(bad) = ids.iter().find(|&&t| t as usize >= vocab) {
                return Err(ApiError::invalid(
                    "prompt",
                    format!("token id {bad} is outside the vocabulary ({vocab})"),
                ));
            }
            (ids.clone(), "prompt")
        }
    };
    if prompt.is_empty() {
        return Err(ApiError::invalid(param, "the prompt is empty"));
    }
    if prompt.len() >= ctx {
        return Err(ApiError {
            param: Some(param.into()),
            ..ApiError::bad_request(
                "context_length_exceeded",
                format!(
                    "the prompt has {} tokens, but the context holds {ctx} (prompt and answer together)",
                    prompt.len()
                ),
            )
        });
    }
    Ok(Prepared {
        request,
        prompt,
        in_thinking,
    })
}

fn encode(tokenizer: &kasoku::tokenizer::Tokenizer, text: &str) -> Result<Vec<u32>, ApiError> {
    tokenizer
        .encode_with_bos(text, true)
        .map_err(tokenizer_error)
}

fn tokenizer_error(e: kasoku::tokenizer::TokenizerError) -> ApiError {
    ApiError::bad_request("tokenizer_error", format!("tokenizing: {e}"))
}

fn add_json_instruction(messages: &mut Vec<Value>) {
    match messages.first_mut() {
        Some(first) if first["role"] == "system" => {
            let content = first["content"].as_str().unwrap_or_default();
            first["content"] = Value::String(format!("{content}\n\n{JSON_INSTRUCTION}"));
        }
        _ => messages.insert(0, json!({"role": "system", "content": JSON_INSTRUCTION})),
    }
}
