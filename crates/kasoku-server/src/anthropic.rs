//! The Anthropic Messages API: `POST /v1/messages` (JSON or its streaming event sequence) and
//! `POST /v1/messages/count_tokens`, served by translating the request into a chat completion
//! request (system, text, `tool_use`/`tool_result` and thinking blocks, tools and
//! `tool_choice`, `stop_sequences`, `thinking`) and the answer back into content blocks.
//! Errors come in Anthropic's shape (`{"type": "error", "error": {"type", "message"}}`).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};

use crate::answer::{self, Answer};
use crate::error::ApiError;
use crate::pool::{Done, Event};
use crate::routes::{self, App, Kind, Started};
use crate::sse;
use crate::tool_calls::ToolEvent;

/// `POST /v1/messages`.
pub async fn messages(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    match respond(app, headers, body).await {
        Ok(r) => r,
        Err(e) => error_response(&e),
    }
}

async fn respond(app: Arc<App>, headers: HeaderMap, body: Body) -> Result<Response, ApiError> {
    let object = routes::read_object(&app, &headers, body).await?;
    let Started {
        request,
        first,
        mut rx,
        prompt_tokens,
    } = routes::start(&app, to_chat(object)?, Kind::Chat).await?;
    let id = routes::unique_id("msg");
    let model = request.model.clone();
    if request.stream {
        let stream = MessageStream::new(id, model, prompt_tokens);
        return Ok(sse::response(first, rx, stream));
    }
    let (answer, done) = answer::collect(first, &mut rx).await?;
    Ok(routes::json_response(
        StatusCode::OK,
        &message(&id, &model, answer, &done),
    ))
}

/// `POST /v1/messages/count_tokens`: the prompt's length, as the request would be rendered.
pub async fn count_tokens(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    let counted = async {
        let mut object = routes::read_object(&app, &headers, body).await?;
        // max_tokens is not part of a count request.
        object.entry("max_tokens").or_insert(json!(1));
        let chat = to_chat(object)?;
        let app = Arc::clone(&app);
        tokio::task::spawn_blocking(move || {
            crate::prepare::prepare_object(&app.engine, &chat, Kind::Chat).map(|p| p.prompt.len())
        })
        .await
        .map_err(|_| ApiError::internal("counting failed"))?
    };
    match counted.await {
        Ok(n) => routes::json_response(StatusCode::OK, &json!({"input_tokens": n})),
        Err(e) => error_response(&e),
    }
}

/// An error in Anthropic's shape, with its HTTP status.
pub fn error_response(e: &ApiError) -> Response {
    (
        e.status,
        [("content-type", "application/json")],
        error_body(e).to_string(),
    )
        .into_response()
}

fn error_body(e: &ApiError) -> Value {
    let kind = match e.status.as_u16() {
        400 | 413 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        429 => "rate_limit_error",
        503 => "overloaded_error",
        _ => "api_error",
    };
    json!({"type": "error", "error": {"type": kind, "message": e.message}})
}

/// A Messages request as a chat completion request.
pub fn to_chat(body: Map<String, Value>) -> Result<Map<String, Value>, ApiError> {
    let get = |k: &str| body.get(k).filter(|v| !v.is_null());
    let mut chat = Map::new();
    for key in [
        "model",
        "temperature",
        "top_p",
        "top_k",
        "stream",
        "metadata",
    ] {
        if let Some(v) = get(key) {
            if key != "metadata" {
                chat.insert(key.into(), v.clone());
            }
        }
    }
    match get("max_tokens") {
        Some(n) => chat.insert("max_tokens".into(), n.clone()),
        None => {
            return Err(ApiError::invalid(
                "max_tokens",
                "missing required parameter: max_tokens",
            ))
        }
    };
    if let Some(stops) = get("stop_sequences") {
        chat.insert("stop".into(), stops.clone());
    }
    let mut messages = Vec::new();
    match get("system") {
        None => {}
        Some(Value::String(s)) => messages.push(json!({"role": "system", "content": s})),
        Some(Value::Array(blocks)) => {
            let text = blocks_text(blocks, "system")?;
            messages.push(json!({"role": "system", "content": text}));
        }
        Some(_) => {
            return Err(ApiError::invalid(
                "system",
                "system must be a string or a list of text blocks",
            ))
        }
    }
    let list = match get("messages") {
        Some(Value::Array(list)) => list,
        _ => {
            return Err(ApiError::invalid(
                "messages",
                "messages must be a list of messages",
            ))
        }
    };
    for (i, m) in list.iter().enumerate() {
        message_to_chat(i, m, &mut messages)?;
    }
    chat.insert("messages".into(), Value::Array(messages));
    if let Some(tools) = get("tools") {
        let tools = tools
            .as_array()
            .ok_or_else(|| ApiError::invalid("tools", "tools must be a list"))?;
        let tools = tools
            .iter()
            .enumerate()
            .map(|(i, t)| tool_to_chat(i, t))
            .collect::<Result<Vec<_>, _>>()?;
        chat.insert("tools".into(), Value::Array(tools));
    }
    if let Some(choice) = get("tool_choice") {
        let bad = || {
            ApiError::invalid(
                "tool_choice",
                "tool_choice must be {\"type\": auto, any, tool or none}",
            )
        };
        let kind = choice.get("type").and_then(Value::as_str).ok_or_else(bad)?;
        let mapped = match kind {
            "auto" => json!("auto"),
            "any" => json!("required"),
            "none" => json!("none"),
            "tool" => {
                let name = choice.get("name").and_then(Value::as_str).ok_or_else(bad)?;
                json!({"type": "function", "function": {"name": name}})
            }
            _ => return Err(bad()),
        };
        chat.insert("tool_choice".into(), mapped);
        if choice.get("disable_parallel_tool_use") == Some(&Value::Bool(true)) {
            chat.insert("parallel_tool_calls".into(), json!(false));
        }
    }
    if let Some(thinking) = get("thinking") {
        let on = match thinking.get("type").and_then(Value::as_str) {
            Some("enabled") | Some("adaptive") => true,
            Some("disabled") => false,
            _ => {
                return Err(ApiError::invalid(
                    "thinking",
                    "thinking must be {\"type\": \"enabled\"} or {\"type\": \"disabled\"}",
                ))
            }
        };
        chat.insert(
            "chat_template_kwargs".into(),
            json!({"enable_thinking": on}),
        );
    }
    Ok(chat)
}

/// The text of a list of text blocks.
fn blocks_text(blocks: &[Value], param: &str) -> Result<String, ApiError> {
    let mut text = String::new();
    for b in blocks {
        match (b.get("type").and_then(Value::as_str), b.get("text")) {
            (Some("text"), Some(Value::String(t))) => text.push_str(t),
            (kind, _) => {
                return Err(ApiError::invalid(
                    param,
                    format!(
                        "{param}: block type '{}' is not supported here (text)",
                        kind.unwrap_or("?")
                    ),
                ))
            }
        }
    }
    Ok(text)
}

/// One Anthropic message as chat messages: a user turn's `tool_result` blocks become `tool`
/// messages (before its text), an assistant's `tool_use` blocks its `tool_calls` and its
/// `thinking` blocks its `reasoning_content`.
fn message_to_chat(i: usize, m: &Value, out: &mut Vec<Value>) -> Result<(), ApiError> {
    let param = format!("messages[{i}]");
    let bad = |msg: String| ApiError::invalid(&param, format!("{param}: {msg}"));
    let role = match m.get("role").and_then(Value::as_str) {
        Some(r @ ("user" | "assistant")) => r,
        other => {
            return Err(bad(format!(
                "role {} is not supported (user, assistant)",
                other.unwrap_or("missing")
            )))
        }
    };
    let blocks = match m.get("content") {
        Some(Value::String(s)) => vec![json!({"type": "text", "text": s})],
        Some(Value::Array(blocks)) => blocks.clone(),
        _ => return Err(bad("content must be a string or a list of blocks".into())),
    };
    let (mut text, mut reasoning, mut calls) = (String::new(), String::new(), Vec::new());
    for b in &blocks {
        match b.get("type").and_then(Value::as_str) {
            Some("text") => text.push_str(b.get("text").and_then(Value::as_str).unwrap_or("")),
            Some("thinking") if role == "assistant" => {
                reasoning.push_str(b.get("thinking").and_then(Value::as_str).unwrap_or(""))
            }
            Some("redacted_thinking") => {}
            Some("tool_use") if role == "assistant" => {
                let name = b
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad("a tool_use block needs a name".into()))?;
                let input = b.get("input").cloned().unwrap_or_else(|| json!({}));
                calls.push(json!({
                    "id": b.get("id").and_then(Value::as_str).unwrap_or_default(),
                    "type": "function",
                    "function": {"name": name, "arguments": input.to_string()},
                }));
            }
            Some("tool_result") if role == "user" => {
                let content = match b.get("content") {
                    None | Some(Value::Null) => String::new(),
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Array(parts)) => blocks_text(parts, &param)?,
                    Some(_) => return Err(bad("tool_result content must be text".into())),
                };
                let content = if b.get("is_error") == Some(&Value::Bool(true)) {
                    format!("Error: {content}")
                } else {
                    content
                };
                out.push(json!({
                    "role": "tool",
                    "tool_call_id": b.get("tool_use_id").and_then(Value::as_str).unwrap_or_default(),
                    "content": content,
                }));
            }
            Some(kind) => {
                return Err(bad(format!(
                    "content block type '{kind}' is not supported in a {role} message"
                )))
            }
            None => return Err(bad("each content block needs a type".into())),
        }
    }
    if role == "assistant" {
        let mut msg = json!({"role": "assistant", "content": text});
        if !reasoning.is_empty() {
            msg["reasoning_content"] = json!(reasoning);
        }
        if !calls.is_empty() {
            msg["tool_calls"] = Value::Array(calls);
        }
        out.push(msg);
    } else if !text.is_empty() || !blocks.iter().any(|b| b["type"] == "tool_result") {
        out.push(json!({"role": "user", "content": text}));
    }
    Ok(())
}

fn tool_to_chat(i: usize, t: &Value) -> Result<Value, ApiError> {
    let param = format!("tools[{i}]");
    match t.get("type").and_then(Value::as_str) {
        None | Some("custom") => {}
        Some(kind) => {
            return Err(ApiError::invalid(
                &param,
                format!("{param}: server tool type '{kind}' is not supported (custom tools only)"),
            ))
        }
    }
    let name = t
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::invalid(&param, format!("{param}: a tool needs a name")))?;
    let mut function = json!({"name": name});
    if let Some(d) = t.get("description").and_then(Value::as_str) {
        function["description"] = json!(d);
    }
    if let Some(schema) = t.get("input_schema").filter(|s| !s.is_null()) {
        function["parameters"] = schema.clone();
    }
    Ok(json!({"type": "function", "function": function}))
}

/// Why the answer ended, in Anthropic's words.
fn stop_reason(done: &Done) -> &'static str {
    match done.finish {
        "tool_calls" => "tool_use",
        "length" => "max_tokens",
        _ if done.stop_sequence.is_some() => "stop_sequence",
        _ => "end_turn",
    }
}

fn usage(done: &Done) -> Value {
    let cached = done.stats.cached_tokens;
    json!({
        "input_tokens": done.prompt_tokens.saturating_sub(cached),
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
        "output_tokens": done.completion_tokens,
    })
}

/// A tool call's arguments as a `tool_use` block's input (an object).
fn input_of(arguments: &str) -> Value {
    match serde_json::from_str::<Value>(arguments) {
        Ok(v @ Value::Object(_)) => v,
        _ => json!({}),
    }
}

/// The whole answer as a Messages response.
pub fn message(id: &str, model: &str, answer: Answer, done: &Done) -> Value {
    let mut content = Vec::new();
    if !answer.reasoning.is_empty() {
        content.push(json!({"type": "thinking", "thinking": answer.reasoning, "signature": ""}));
    }
    if !answer.content.is_empty() || answer.calls.is_empty() {
        content.push(json!({"type": "text", "text": answer.content}));
    }
    for c in &answer.calls {
        content.push(json!({"type": "tool_use", "id": c.id, "name": c.name, "input": input_of(&c.arguments)}));
    }
    json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason(done),
        "stop_sequence": done.stop_sequence,
        "usage": usage(done),
    })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Block {
    Thinking,
    Text,
    ToolUse,
}

/// The streaming event sequence: `message_start`, then per content block
/// `content_block_start`, its deltas and `content_block_stop`, then `message_delta` (stop
/// reason, usage) and `message_stop`.
pub struct MessageStream {
    id: String,
    model: String,
    prompt_tokens: usize,
    started: bool,
    open: Option<Block>,
    /// Index of the open (or next) block.
    index: usize,
    finished: bool,
}

impl MessageStream {
    pub fn new(id: String, model: String, prompt_tokens: usize) -> MessageStream {
        MessageStream {
            id,
            model,
            prompt_tokens,
            started: false,
            open: None,
            index: 0,
            finished: false,
        }
    }

    fn start(&mut self, out: &mut String) {
        if self.started {
            return;
        }
        self.started = true;
        let message = json!({
            "id": self.id, "type": "message", "role": "assistant", "model": self.model,
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": self.prompt_tokens, "output_tokens": 0},
        });
        out.push_str(&sse::record(
            "message_start",
            &json!({"type": "message_start", "message": message}),
        ));
        out.push_str(&sse::record("ping", &json!({"type": "ping"})));
    }

    fn close(&mut self, out: &mut String) {
        if self.open.take().is_some() {
            out.push_str(&sse::record(
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": self.index}),
            ));
            self.index += 1;
        }
    }

    /// Makes `kind` the open block (closing another), starting it with `block`.
    fn open(&mut self, kind: Block, block: Value, out: &mut String) {
        if self.open == Some(kind) && kind != Block::ToolUse {
            return;
        }
        self.close(out);
        self.open = Some(kind);
        out.push_str(&sse::record(
            "content_block_start",
            &json!({"type": "content_block_start", "index": self.index, "content_block": block}),
        ));
    }

    fn delta(&self, delta: Value) -> String {
        sse::record(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": self.index, "delta": delta}),
        )
    }

    fn pieces(&mut self, d: &crate::output::Delta, out: &mut String) {
        if !d.reasoning.is_empty() {
            self.open(
                Block::Thinking,
                json!({"type": "thinking", "thinking": "", "signature": ""}),
                out,
            );
            out.push_str(&self.delta(json!({"type": "thinking_delta", "thinking": d.reasoning})));
        }
        if !d.content.is_empty() {
            self.open(Block::Text, json!({"type": "text", "text": ""}), out);
            out.push_str(&self.delta(json!({"type": "text_delta", "text": d.content})));
        }
        for e in &d.tool_calls {
            match e {
                ToolEvent::Start { id, name, .. } => self.open(
                    Block::ToolUse,
                    json!({"type": "tool_use", "id": id, "name": name, "input": {}}),
                    out,
                ),
                ToolEvent::Arguments { delta, .. } => out.push_str(
                    &self.delta(json!({"type": "input_json_delta", "partial_json": delta})),
                ),
                ToolEvent::Content(_) => {}
            }
        }
    }
}

impl sse::Format for MessageStream {
    fn event(&mut self, event: Option<Event>) -> String {
        let mut out = String::new();
        self.start(&mut out);
        match event {
            Some(Event::Delta(d)) => self.pieces(&d, &mut out),
            Some(Event::Done(done)) => {
                if self.index == 0 && self.open.is_none() {
                    // No content at all: one empty text block, as the API always has one.
                    self.open(Block::Text, json!({"type": "text", "text": ""}), &mut out);
                }
                self.close(&mut out);
                out.push_str(&sse::record(
                    "message_delta",
                    &json!({
                        "type": "message_delta",
                        "delta": {"stop_reason": stop_reason(&done), "stop_sequence": done.stop_sequence},
                        "usage": usage(&done),
                    }),
                ));
                out.push_str(&sse::record(
                    "message_stop",
                    &json!({"type": "message_stop"}),
                ));
                self.finished = true;
            }
            Some(Event::Error(e)) => {
                out.push_str(&sse::record("error", &error_body(&e)));
                self.finished = true;
            }
            None => {
                let e = ApiError::internal("generation ended without a result");
                out.push_str(&sse::record("error", &error_body(&e)));
                self.finished = true;
            }
        }
        out
    }

    fn finished(&self) -> bool {
        self.finished
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::Delta;
    use crate::sse::Format;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn a_request_with_tools_thinking_and_results_becomes_a_chat_request() {
        let chat = to_chat(obj(json!({
            "model": "m", "max_tokens": 100, "stream": true,
            "system": [{"type": "text", "text": "Be brief."}],
            "stop_sequences": ["END"],
            "thinking": {"type": "disabled"},
            "tools": [{"name": "get_weather", "description": "Weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
            "tool_choice": {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": true},
            "messages": [
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "Use the tool.", "signature": "x"},
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}]},
                    {"type": "text", "text": "And tomorrow?"}
                ]}
            ]
        })))
        .unwrap();
        assert_eq!(chat["max_tokens"], 100);
        assert_eq!(chat["stop"], json!(["END"]));
        assert_eq!(chat["stream"], true);
        assert_eq!(chat["chat_template_kwargs"]["enable_thinking"], false);
        assert_eq!(
            chat["tools"][0]["function"]["parameters"]["properties"]["city"]["type"],
            "string"
        );
        assert_eq!(chat["tool_choice"]["function"]["name"], "get_weather");
        assert_eq!(chat["parallel_tool_calls"], false);
        let m = chat["messages"].as_array().unwrap();
        assert_eq!(m[0], json!({"role": "system", "content": "Be brief."}));
        assert_eq!(m[2]["content"], "Checking.");
        assert_eq!(m[2]["reasoning_content"], "Use the tool.");
        assert_eq!(
            m[2]["tool_calls"][0]["function"]["arguments"],
            "{\"city\":\"Paris\"}"
        );
        assert_eq!(
            m[3],
            json!({"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"})
        );
        assert_eq!(m[4], json!({"role": "user", "content": "And tomorrow?"}));
        // The translated request is one the chat parser accepts.
        let r = crate::request::chat(&chat, None).unwrap();
        assert_eq!(r.tools.len(), 1);
        // What cannot be translated names its parameter.
        for (body, param) in [
            (json!({"model": "m", "messages": []}), "max_tokens"),
            (
                json!({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": [{"type": "image"}]}]}),
                "messages[0]",
            ),
            (
                json!({"model": "m", "max_tokens": 1, "messages": [], "tools": [{"type": "web_search_20250305", "name": "w"}]}),
                "tools[0]",
            ),
            (
                json!({"model": "m", "max_tokens": 1, "messages": [], "tool_choice": {"type": "maybe"}}),
                "tool_choice",
            ),
        ] {
            let e = to_chat(obj(body.clone())).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}");
        }
    }

    fn done(finish: &'static str) -> Box<Done> {
        Box::new(Done {
            finish,
            stop_sequence: None,
            prompt_tokens: 10,
            completion_tokens: 4,
            stats: Default::default(),
            queue_time: Default::default(),
        })
    }

    #[test]
    fn answers_become_content_blocks() {
        let answer = Answer {
            content: "Let me look.".into(),
            reasoning: "hmm".into(),
            calls: vec![crate::tool_calls::ToolCall {
                id: "call_1".into(),
                name: "f".into(),
                arguments: "{\"a\": 1}".into(),
            }],
            ..Answer::default()
        };
        let m = message("msg_1", "m", answer, &done("tool_calls"));
        assert_eq!(m["stop_reason"], "tool_use");
        let kinds: Vec<&str> = m["content"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["type"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, ["thinking", "text", "tool_use"]);
        assert_eq!(m["content"][2]["input"], json!({"a": 1}));
        assert_eq!(m["usage"]["input_tokens"], 10);
        let m = message("msg_2", "m", Answer::default(), &done("length"));
        assert_eq!(m["stop_reason"], "max_tokens");
        assert_eq!(m["content"], json!([{"type": "text", "text": ""}]));
    }

    #[test]
    fn the_stream_follows_the_event_sequence() {
        let mut s = MessageStream::new("msg_1".into(), "m".into(), 10);
        let mut text = String::new();
        let delta = |content: &str, reasoning: &str, tool_calls: Vec<ToolEvent>| {
            Event::Delta(Delta {
                content: content.into(),
                reasoning: reasoning.into(),
                tool_calls,
                ..Delta::default()
            })
        };
        text += &s.event(Some(delta("", "think", vec![])));
        text += &s.event(Some(delta("Hi", "", vec![])));
        text += &s.event(Some(delta(" there", "", vec![])));
        text += &s.event(Some(delta(
            "",
            "",
            vec![
                ToolEvent::Start {
                    index: 0,
                    id: "c0".into(),
                    name: "f".into(),
                },
                ToolEvent::Arguments {
                    index: 0,
                    delta: "{\"a\"".into(),
                },
            ],
        )));
        text += &s.event(Some(delta(
            "",
            "",
            vec![ToolEvent::Arguments {
                index: 0,
                delta: ": 1}".into(),
            }],
        )));
        assert!(!s.finished());
        text += &s.event(Some(Event::Done(done("tool_calls"))));
        assert!(s.finished());
        let events: Vec<Value> = text
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(|d| serde_json::from_str(d).unwrap())
            .collect();
        let names: Vec<String> = events
            .iter()
            .map(|e| {
                let t = e["type"].as_str().unwrap().to_string();
                match e["delta"]["type"]
                    .as_str()
                    .or(e["content_block"]["type"].as_str())
                {
                    Some(sub) => format!("{t}:{sub}"),
                    None => t,
                }
            })
            .collect();
        assert_eq!(
            names,
            [
                "message_start",
                "ping",
                "content_block_start:thinking",
                "content_block_delta:thinking_delta",
                "content_block_stop",
                "content_block_start:text",
                "content_block_delta:text_delta",
                "content_block_delta:text_delta",
                "content_block_stop",
                "content_block_start:tool_use",
                "content_block_delta:input_json_delta",
                "content_block_delta:input_json_delta",
                "content_block_stop",
                "message_delta",
                "message_stop",
            ]
        );
        let indexes: Vec<u64> = events.iter().filter_map(|e| e["index"].as_u64()).collect();
        assert_eq!(indexes, [0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2]);
        assert_eq!(events[13]["delta"]["stop_reason"], "tool_use");
        // Every record names its event type as its data's type.
        for record in text.split("\n\n").filter(|r| !r.is_empty()) {
            let mut lines = record.lines();
            let event = lines.next().unwrap().strip_prefix("event: ").unwrap();
            let data: Value =
                serde_json::from_str(lines.next().unwrap().strip_prefix("data: ").unwrap())
                    .unwrap();
            assert_eq!(data["type"], event);
        }
    }
}
