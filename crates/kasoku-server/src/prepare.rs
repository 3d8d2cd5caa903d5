//! A request body made ready for a session: parsed and checked field by field (`request`),
//! its model name checked, its tools shown to the template (`tools`), its prompt bounded in
//! bytes and tokenized (`prompt` keeps client text that spells control tokens as text), checked
//! against the context, and what it asks of the answer's form (forced tool calls, JSON)
//! compiled into a grammar constraint. CPU work: the routes run it on a blocking thread.

use serde_json::{Map, Value};

use kasoku::constraint::Constraint;
use kasoku_grammar::GrammarSpec;

use crate::error::ApiError;
use crate::pool::Engine;
use crate::prompt;
use crate::request::{self, PromptInput, Request, ResponseFormat};
use crate::tool_calls::ToolSyntax;
use crate::tools::{self, TemplateTools, ToolPlan};

/// The instruction added to chats that ask for `response_format: json_object` (the grammar
/// enforces it; the words help a small model write what it means).
const JSON_INSTRUCTION: &str = "Respond with one valid JSON object only.";
/// The same for `json_schema`, followed by the schema.
const JSON_SCHEMA_INSTRUCTION: &str =
    "Respond with one valid JSON object only, matching this JSON Schema:";

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
    /// Parse tool calls in this syntax.
    pub tools: Option<ToolSyntax>,
    /// What the answer is held to.
    pub constraint: Option<Constraint>,
}

/// Refuses, before it is tokenized, prompt text of `bytes` bytes that the context cannot hold
/// (more than the engine's bytes per context token): a 400 naming `param`.
pub fn prompt_fits(engine: &Engine, bytes: usize, param: &str) -> Result<(), ApiError> {
    let ctx = engine.ctx;
    let max_bytes = ctx.saturating_mul(engine.prompt_bytes_per_token);
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
}

/// Checks and tokenizes a request body already parsed, or translated from another API (CPU
/// work: runs on a blocking thread).
pub fn prepare_object(
    engine: &Engine,
    object: &Map<String, Value>,
    kind: Kind,
) -> Result<Prepared, ApiError> {
    let defaults = engine.model.defaults.as_ref();
    let request = match kind {
        Kind::Chat => request::chat(object, defaults)?,
        Kind::Completion => request::completion(object, defaults)?,
    };
    if !engine.names.contains(&request.model) {
        return Err(unknown_model(engine, &request.model));
    }
    let model = &engine.model;
    let tokenizer = &model.tokenizer;
    let ctx = engine.ctx;
    let fits = |bytes: usize, param: &str| prompt_fits(engine, bytes, param);
    let mut in_thinking = false;
    let mut plan = ToolPlan::default();
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
            let mut kwargs = template_kwargs.clone();
            // Client text (tools included) keeps its control-token spellings as text; what
            // kasoku adds below is its own.
            plan = tools::plan(
                TemplateTools::of(template.source()),
                &request.tools,
                &request.tool_choice,
                request.parallel_tool_calls,
                &mut messages,
                &mut kwargs,
            );
            engine.control.mark_conversation(&mut messages, &mut kwargs);
            match &request.response_format {
                ResponseFormat::Text => {}
                ResponseFormat::JsonObject => tools::add_system(&mut messages, JSON_INSTRUCTION),
                ResponseFormat::JsonSchema { schema, .. } => tools::add_system(
                    &mut messages,
                    &format!("{JSON_SCHEMA_INSTRUCTION}\n{schema}"),
                ),
            }
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
            let suffix = request.suffix.as_deref();
            fits(text.len() + suffix.map_or(0, str::len), "prompt")?;
            match suffix {
                Some(suffix) => (fill_in_the_middle(tokenizer, text, suffix)?, "prompt"),
                None => (encode(tokenizer, text)?, "prompt"),
            }
        }
        PromptInput::Tokens(ids) => {
            let vocab = model.vocab;
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
    // What the answer is held to: the tool calls `required` asks for, else the format.
    let (grammar, grammar_param) = match plan.grammar.take() {
        Some(g) => (Some(g), "tool_choice"),
        None => (
            match &request.response_format {
                ResponseFormat::Text => None,
                ResponseFormat::JsonObject => Some(GrammarSpec::JsonObject),
                ResponseFormat::JsonSchema { schema, strict } => Some(GrammarSpec::JsonSchema {
                    schema: schema.clone(),
                    strict: *strict,
                }),
            },
            "response_format",
        ),
    };
    let constraint = match grammar {
        None => None,
        Some(spec) => Some(engine.grammars()?.compile(&spec).map_err(|e| {
            ApiError::invalid(
                grammar_param,
                format!("{grammar_param} cannot be enforced: {e}"),
            )
        })?),
    };
    if constraint.is_some() && in_thinking {
        return Err(ApiError::invalid(
            grammar_param,
            format!(
                "{grammar_param} cannot be enforced while the model thinks first; \
                 turn thinking off (reasoning_effort: none, or chat_template_kwargs.enable_thinking: false)"
            ),
        ));
    }
    Ok(Prepared {
        request,
        prompt,
        in_thinking,
        tools: plan.syntax,
        constraint,
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

/// A fill-in-the-middle prompt, `<|fim_prefix|>prefix<|fim_suffix|>suffix<|fim_middle|>`, for
/// vocabularies that have those tokens (Qwen2.5-Coder; StarCoder's `<fim_*>` spelling too).
fn fill_in_the_middle(
    tokenizer: &kasoku::tokenizer::Tokenizer,
    prefix: &str,
    suffix: &str,
) -> Result<Vec<u32>, ApiError> {
    let spellings = [
        ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"],
        ["<fim_prefix>", "<fim_suffix>", "<fim_middle>"],
    ];
    let ids = spellings.iter().find_map(|names| {
        Some([
            tokenizer.piece_to_id(names[0])?,
            tokenizer.piece_to_id(names[1])?,
            tokenizer.piece_to_id(names[2])?,
        ])
    });
    let Some([pre, suf, mid]) = ids else {
        return Err(ApiError::invalid(
            "suffix",
            "this model's vocabulary has no fill-in-the-middle tokens (<|fim_prefix|>, <|fim_suffix|>, <|fim_middle|>)",
        ));
    };
    let plain = |t: &str| tokenizer.encode(t, false).map_err(tokenizer_error);
    let mut prompt = Vec::new();
    if let (true, Some(bos)) = (tokenizer.add_bos(), tokenizer.bos()) {
        prompt.push(bos);
    }
    prompt.push(pre);
    prompt.extend(plain(prefix)?);
    prompt.push(suf);
    prompt.extend(plain(suffix)?);
    prompt.push(mid);
    Ok(prompt)
}
