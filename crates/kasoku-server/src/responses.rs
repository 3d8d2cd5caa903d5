//! The Responses API, stateless: `POST /v1/responses` with `input` as text or items (messages,
//! function calls and their outputs, reasoning), `instructions`, function `tools`, `text.format`
//! and `reasoning.effort`, answered as one response object or as its stream of typed events.
//!
//! Nothing is stored: `store` is accepted and ignored (every response reports `store: false`),
//! and `previous_response_id` is refused, since clients such as Codex resend the whole
//! conversation each turn anyway. Tool types other than `function` (built-in tools such as
//! `web_search` or `local_shell`, and `custom` tools) are not offered to the model.

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

/// `POST /v1/responses`.
pub async fn create(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    respond(app, headers, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn respond(app: Arc<App>, headers: HeaderMap, body: Body) -> Result<Response, ApiError> {
    let object = routes::read_object(&app, &headers, body).await?;
    let envelope = Envelope::of(&object, routes::unique_id("resp"));
    let Started {
        request,
        first,
        mut rx,
        ..
    } = routes::start(&app, to_chat(object)?, Kind::Chat).await?;
    if request.stream {
        return Ok(sse::response(first, rx, ResponseStream::new(envelope)));
    }
    let (answer, done) = answer::collect(first, &mut rx).await?;
    let items = items(&envelope.id, answer);
    Ok(routes::json_response(
        StatusCode::OK,
        &envelope.response(Some(&done), items),
    ))
}

/// A Responses request as a chat completion request.
pub fn to_chat(body: Map<String, Value>) -> Result<Map<String, Value>, ApiError> {
    let get = |k: &str| body.get(k).filter(|v| !v.is_null());
    if get("previous_response_id").is_some() {
        return Err(ApiError::invalid(
            "previous_response_id",
            "this server keeps no responses (it is stateless): send the whole conversation in input",
        ));
    }
    let mut chat = Map::new();
    for key in [
        "model",
        "temperature",
        "top_p",
        "stream",
        "parallel_tool_calls",
    ] {
        if let Some(v) = get(key) {
            chat.insert(key.into(), v.clone());
        }
    }
    if let Some(n) = get("max_output_tokens") {
        chat.insert("max_tokens".into(), n.clone());
    }
    let mut messages = Vec::new();
    if let Some(instructions) = get("instructions") {
        let text = instructions
            .as_str()
            .ok_or_else(|| ApiError::invalid("instructions", "instructions must be a string"))?;
        messages.push(json!({"role": "system", "content": text}));
    }
    match get("input") {
        Some(Value::String(s)) => messages.push(json!({"role": "user", "content": s})),
        Some(Value::Array(items)) => {
            let mut reasoning = String::new();
            for (i, item) in items.iter().enumerate() {
                item_to_chat(i, item, &mut messages, &mut reasoning)?;
            }
        }
        _ => {
            return Err(ApiError::invalid(
                "input",
                "input must be a string or a list of items",
            ))
        }
    }
    chat.insert("messages".into(), Value::Array(messages));
    if let Some(tools) = get("tools") {
        let tools = tools
            .as_array()
            .ok_or_else(|| ApiError::invalid("tools", "tools must be a list"))?;
        let functions: Vec<Value> = tools
            .iter()
            .filter(|t| t["type"] == "function")
            .map(|t| {
                let mut f = json!({"name": t["name"]});
                for key in ["description", "parameters"] {
                    if let Some(v) = t.get(key).filter(|v| !v.is_null()) {
                        f[key] = v.clone();
                    }
                }
                json!({"type": "function", "function": f})
            })
            .collect();
        if !functions.is_empty() {
            chat.insert("tools".into(), Value::Array(functions));
        }
    }
    if let Some(choice) = get("tool_choice") {
        let mapped = match choice {
            Value::String(_) => choice.clone(),
            Value::Object(o) if o.get("type") == Some(&json!("function")) => {
                json!({"type": "function", "function": {"name": o.get("name").cloned().unwrap_or_default()}})
            }
            _ => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    "tool_choice must be auto, none, required or {\"type\": \"function\", \"name\": ...}",
                ))
            }
        };
        if chat.contains_key("tools") || mapped == "none" || mapped == "auto" {
            chat.insert("tool_choice".into(), mapped);
        }
    }
    if let Some(format) = get("text").and_then(|t| t.get("format")) {
        let rf = match format.get("type").and_then(Value::as_str) {
            Some("text") => json!({"type": "text"}),
            Some("json_object") => json!({"type": "json_object"}),
            Some("json_schema") => json!({"type": "json_schema", "json_schema": {
                "name": format.get("name").cloned().unwrap_or(json!("answer")),
                "schema": format.get("schema").cloned().unwrap_or(json!({})),
                "strict": format.get("strict").cloned().unwrap_or(json!(false)),
            }}),
            _ => {
                return Err(ApiError::invalid(
                    "text",
                    "text.format type must be text, json_object or json_schema",
                ))
            }
        };
        chat.insert("response_format".into(), rf);
    }
    if let Some(effort) = get("reasoning")
        .and_then(|r| r.get("effort"))
        .filter(|e| !e.is_null())
    {
        chat.insert("reasoning_effort".into(), effort.clone());
    }
    Ok(chat)
}

/// One input item as chat messages. Reasoning items wait for the assistant turn they precede.
fn item_to_chat(
    i: usize,
    item: &Value,
    out: &mut Vec<Value>,
    reasoning: &mut String,
) -> Result<(), ApiError> {
    let param = format!("input[{i}]");
    let bad = |msg: String| ApiError::invalid(&param, format!("{param}: {msg}"));
    let kind = item
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("message");
    match kind {
        "message" => {
            let role = item
                .get("role")
                .and_then(Value::as_str)
                .ok_or_else(|| bad("a message needs a role".into()))?;
            let content = match item.get("content") {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Array(parts)) => {
                    let mut text = String::new();
                    for p in parts {
                        match p.get("type").and_then(Value::as_str) {
                            Some("input_text" | "output_text" | "text") => {
                                text.push_str(p.get("text").and_then(Value::as_str).unwrap_or(""))
                            }
                            Some("refusal") => text
                                .push_str(p.get("refusal").and_then(Value::as_str).unwrap_or("")),
                            other => {
                                return Err(bad(format!(
                                    "content part type '{}' is not supported (text only)",
                                    other.unwrap_or("?")
                                )))
                            }
                        }
                    }
                    text
                }
                _ => return Err(bad("content must be a string or a list of parts".into())),
            };
            let mut m = json!({"role": role, "content": content});
            if role == "assistant" && !reasoning.is_empty() {
                m["reasoning_content"] = json!(std::mem::take(reasoning));
            }
            out.push(m);
        }
        "function_call" => {
            let name = item
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| bad("a function_call needs a name".into()))?;
            let call = json!({
                "id": item.get("call_id").and_then(Value::as_str).unwrap_or_default(),
                "type": "function",
                "function": {"name": name, "arguments": item.get("arguments").and_then(Value::as_str).unwrap_or("{}")},
            });
            // Calls made in one turn share one assistant message.
            match out.last_mut() {
                Some(last) if last["role"] == "assistant" && last.get("tool_calls").is_some() => {
                    if let Some(Value::Array(calls)) = last.get_mut("tool_calls") {
                        calls.push(call);
                    }
                }
                _ => {
                    let mut m = json!({"role": "assistant", "content": "", "tool_calls": [call]});
                    if !reasoning.is_empty() {
                        m["reasoning_content"] = json!(std::mem::take(reasoning));
                    }
                    out.push(m);
                }
            }
        }
        "function_call_output" => {
            let output = match item.get("output") {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Array(parts)) => parts
                    .iter()
                    .filter_map(|p| p.get("text").and_then(Value::as_str))
                    .collect(),
                _ => return Err(bad("function_call_output needs an output".into())),
            };
            out.push(json!({
                "role": "tool",
                "tool_call_id": item.get("call_id").and_then(Value::as_str).unwrap_or_default(),
                "content": output,
            }));
        }
        "reasoning" => {
            for key in ["content", "summary"] {
                for part in item
                    .get(key)
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    reasoning.push_str(part.get("text").and_then(Value::as_str).unwrap_or(""));
                }
                if !reasoning.is_empty() {
                    break;
                }
            }
        }
        "item_reference" => {
            return Err(bad(
                "item_reference needs stored items; this server is stateless".into(),
            ))
        }
        other => return Err(bad(format!("input item type '{other}' is not supported"))),
    }
    Ok(())
}

/// The request's fields a response echoes, and its id.
pub struct Envelope {
    id: String,
    created_at: u64,
    fields: Map<String, Value>,
}

impl Envelope {
    pub fn of(body: &Map<String, Value>, id: String) -> Envelope {
        let mut fields = Map::new();
        let echo = |k: &str, default: Value| {
            body.get(k)
                .filter(|v| !v.is_null())
                .cloned()
                .unwrap_or(default)
        };
        fields.insert("model".into(), echo("model", Value::Null));
        fields.insert("instructions".into(), echo("instructions", Value::Null));
        fields.insert(
            "max_output_tokens".into(),
            echo("max_output_tokens", Value::Null),
        );
        fields.insert(
            "parallel_tool_calls".into(),
            echo("parallel_tool_calls", json!(true)),
        );
        fields.insert("temperature".into(), echo("temperature", json!(1.0)));
        fields.insert("top_p".into(), echo("top_p", json!(1.0)));
        fields.insert("tool_choice".into(), echo("tool_choice", json!("auto")));
        fields.insert("tools".into(), echo("tools", json!([])));
        fields.insert(
            "text".into(),
            echo("text", json!({"format": {"type": "text"}})),
        );
        fields.insert(
            "reasoning".into(),
            echo("reasoning", json!({"effort": null, "summary": null})),
        );
        fields.insert("metadata".into(), echo("metadata", json!({})));
        Envelope {
            id,
            created_at: routes::unix_now(),
            fields,
        }
    }

    /// The response object: in progress (`done` is `None`), completed or incomplete.
    pub fn response(&self, done: Option<&Done>, output: Vec<Value>) -> Value {
        let mut r = Map::new();
        r.insert("id".into(), self.id.clone().into());
        r.insert("object".into(), "response".into());
        r.insert("created_at".into(), self.created_at.into());
        let (status, incomplete) = match done {
            None => ("in_progress", Value::Null),
            Some(d) if d.finish == "length" => {
                ("incomplete", json!({"reason": "max_output_tokens"}))
            }
            Some(_) => ("completed", Value::Null),
        };
        r.insert("status".into(), status.into());
        r.insert("error".into(), Value::Null);
        r.insert("incomplete_details".into(), incomplete);
        r.extend(self.fields.clone());
        r.insert("previous_response_id".into(), Value::Null);
        r.insert("store".into(), false.into());
        r.insert("truncation".into(), "disabled".into());
        let text: String = output
            .iter()
            .filter(|i| i["type"] == "message")
            .flat_map(|i| i["content"].as_array().cloned().unwrap_or_default())
            .filter_map(|p| p["text"].as_str().map(str::to_string))
            .collect();
        r.insert("output".into(), Value::Array(output));
        r.insert("output_text".into(), text.into());
        r.insert("usage".into(), done.map(usage).unwrap_or(Value::Null));
        Value::Object(r)
    }
}

fn usage(done: &Done) -> Value {
    json!({
        "input_tokens": done.prompt_tokens,
        "input_tokens_details": {"cached_tokens": done.stats.cached_tokens},
        "output_tokens": done.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": done.prompt_tokens + done.completion_tokens,
    })
}

fn reasoning_item(id: &str, text: &str, status: &str) -> Value {
    json!({"type": "reasoning", "id": id, "status": status, "summary": [],
           "content": [{"type": "reasoning_text", "text": text}]})
}

fn text_part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

fn message_item(id: &str, text: &str, status: &str) -> Value {
    let content = if status == "in_progress" {
        json!([])
    } else {
        json!([text_part(text)])
    };
    json!({"type": "message", "id": id, "status": status, "role": "assistant", "content": content})
}

fn call_item(id: &str, call_id: &str, name: &str, arguments: &str, status: &str) -> Value {
    json!({"type": "function_call", "id": id, "call_id": call_id, "name": name,
           "arguments": arguments, "status": status})
}

/// The output items of a whole answer.
fn items(response_id: &str, answer: Answer) -> Vec<Value> {
    let base = response_id.trim_start_matches("resp-");
    let mut out = Vec::new();
    if !answer.reasoning.is_empty() {
        out.push(reasoning_item(
            &format!("rs_{base}"),
            &answer.reasoning,
            "completed",
        ));
    }
    if !answer.content.is_empty() || answer.calls.is_empty() {
        out.push(message_item(
            &format!("msg_{base}"),
            &answer.content,
            "completed",
        ));
    }
    for (i, c) in answer.calls.iter().enumerate() {
        out.push(call_item(
            &format!("fc_{base}_{i}"),
            &c.id,
            &c.name,
            &c.arguments,
            "completed",
        ));
    }
    out
}

#[derive(Debug)]
enum Open {
    Reasoning {
        id: String,
        text: String,
    },
    Message {
        id: String,
        text: String,
    },
    Call {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
    },
}

/// The stream of typed events: `response.created`, `response.in_progress`, then per output
/// item `response.output_item.added`, its parts and deltas, `response.output_item.done`, and
/// `response.completed` (or `response.incomplete`) with the whole response.
pub struct ResponseStream {
    envelope: Envelope,
    sequence: u64,
    started: bool,
    open: Option<Open>,
    done_items: Vec<Value>,
    finished: bool,
}

impl ResponseStream {
    pub fn new(envelope: Envelope) -> ResponseStream {
        ResponseStream {
            envelope,
            sequence: 0,
            started: false,
            open: None,
            done_items: Vec::new(),
            finished: false,
        }
    }

    fn emit(&mut self, out: &mut String, kind: &str, mut data: Value) {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        out.push_str(&sse::record(kind, &data));
    }

    fn index(&self) -> usize {
        self.done_items.len()
    }

    fn item_id(&self, prefix: &str) -> String {
        let base = self.envelope.id.trim_start_matches("resp-");
        format!("{prefix}_{base}_{}", self.index())
    }

    fn close(&mut self, out: &mut String) {
        let Some(open) = self.open.take() else {
            return;
        };
        let index = self.index();
        let item = match open {
            Open::Reasoning { id, text } => {
                self.emit(
                    out,
                    "response.reasoning_text.done",
                    json!({"item_id": id, "output_index": index, "content_index": 0, "text": text}),
                );
                reasoning_item(&id, &text, "completed")
            }
            Open::Message { id, text } => {
                self.emit(out, "response.output_text.done", json!({"item_id": id, "output_index": index, "content_index": 0, "text": text, "logprobs": []}));
                self.emit(out, "response.content_part.done", json!({"item_id": id, "output_index": index, "content_index": 0, "part": text_part(&text)}));
                message_item(&id, &text, "completed")
            }
            Open::Call {
                id,
                call_id,
                name,
                arguments,
            } => {
                self.emit(
                    out,
                    "response.function_call_arguments.done",
                    json!({"item_id": id, "output_index": index, "arguments": arguments}),
                );
                call_item(&id, &call_id, &name, &arguments, "completed")
            }
        };
        self.emit(
            out,
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        );
        self.done_items.push(item);
    }

    fn reasoning(&mut self, text: &str, out: &mut String) {
        if !matches!(self.open, Some(Open::Reasoning { .. })) {
            self.close(out);
            let id = self.item_id("rs");
            let item = json!({"type": "reasoning", "id": id, "status": "in_progress", "summary": [], "content": []});
            self.emit(
                out,
                "response.output_item.added",
                json!({"output_index": self.index(), "item": item}),
            );
            self.open = Some(Open::Reasoning {
                id,
                text: String::new(),
            });
        }
        let index = self.index();
        if let Some(Open::Reasoning { id, text: all }) = &mut self.open {
            all.push_str(text);
            let data =
                json!({"item_id": id, "output_index": index, "content_index": 0, "delta": text});
            self.emit(out, "response.reasoning_text.delta", data);
        }
    }

    fn text(&mut self, text: &str, out: &mut String) {
        if !matches!(self.open, Some(Open::Message { .. })) {
            self.close(out);
            let id = self.item_id("msg");
            let index = self.index();
            self.emit(
                out,
                "response.output_item.added",
                json!({"output_index": index, "item": message_item(&id, "", "in_progress")}),
            );
            self.emit(out, "response.content_part.added", json!({"item_id": id, "output_index": index, "content_index": 0, "part": text_part("")}));
            self.open = Some(Open::Message {
                id,
                text: String::new(),
            });
        }
        let index = self.index();
        if let Some(Open::Message { id, text: all }) = &mut self.open {
            all.push_str(text);
            let data = json!({"item_id": id, "output_index": index, "content_index": 0, "delta": text, "logprobs": []});
            self.emit(out, "response.output_text.delta", data);
        }
    }

    fn tool(&mut self, e: &ToolEvent, out: &mut String) {
        match e {
            ToolEvent::Start {
                id: call_id, name, ..
            } => {
                self.close(out);
                let id = self.item_id("fc");
                let item = call_item(&id, call_id, name, "", "in_progress");
                self.emit(
                    out,
                    "response.output_item.added",
                    json!({"output_index": self.index(), "item": item}),
                );
                self.open = Some(Open::Call {
                    id,
                    call_id: call_id.clone(),
                    name: name.clone(),
                    arguments: String::new(),
                });
            }
            ToolEvent::Arguments { delta, .. } => {
                let index = self.index();
                if let Some(Open::Call { id, arguments, .. }) = &mut self.open {
                    arguments.push_str(delta);
                    let data = json!({"item_id": id, "output_index": index, "delta": delta});
                    self.emit(out, "response.function_call_arguments.delta", data);
                }
            }
            ToolEvent::Content(_) => {}
        }
    }
}

impl sse::Format for ResponseStream {
    fn event(&mut self, event: Option<Event>) -> String {
        let mut out = String::new();
        if !self.started {
            self.started = true;
            let r = self.envelope.response(None, Vec::new());
            self.emit(&mut out, "response.created", json!({"response": r}));
            let r = self.envelope.response(None, Vec::new());
            self.emit(&mut out, "response.in_progress", json!({"response": r}));
        }
        match event {
            Some(Event::Delta(d)) => {
                if !d.reasoning.is_empty() {
                    self.reasoning(&d.reasoning, &mut out);
                }
                if !d.content.is_empty() {
                    self.text(&d.content, &mut out);
                }
                for e in &d.tool_calls {
                    self.tool(e, &mut out);
                }
            }
            Some(Event::Done(done)) => {
                if self.done_items.is_empty() && self.open.is_none() {
                    self.text("", &mut out);
                }
                self.close(&mut out);
                let items = std::mem::take(&mut self.done_items);
                let r = self.envelope.response(Some(&done), items);
                let kind = if r["status"] == "incomplete" {
                    "response.incomplete"
                } else {
                    "response.completed"
                };
                self.emit(&mut out, kind, json!({"response": r}));
                self.finished = true;
            }
            Some(Event::Error(e)) => {
                let data = json!({"code": e.code, "message": e.message, "param": e.param});
                self.emit(&mut out, "error", data);
                self.finished = true;
            }
            None => {
                let data = json!({"code": "internal_error", "message": "generation ended without a result", "param": null});
                self.emit(&mut out, "error", data);
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
    fn items_become_chat_messages() {
        let chat = to_chat(obj(json!({
            "model": "m", "instructions": "Be brief.", "max_output_tokens": 50, "store": true,
            "reasoning": {"effort": "low"},
            "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}, "strict": true}},
            "tools": [
                {"type": "function", "name": "shell", "description": "Run", "parameters": {"type": "object"}},
                {"type": "web_search"}
            ],
            "tool_choice": {"type": "function", "name": "shell"},
            "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "List files."}]},
                {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Use ls."}]},
                {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{\"cmd\": \"ls\"}"},
                {"type": "function_call", "call_id": "c2", "name": "shell", "arguments": "{\"cmd\": \"pwd\"}"},
                {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
                {"type": "function_call_output", "call_id": "c2", "output": "/tmp"},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Done."}]}
            ]
        })))
        .unwrap();
        assert_eq!(chat["max_tokens"], 50);
        assert_eq!(chat["reasoning_effort"], "low");
        assert_eq!(chat["response_format"]["json_schema"]["strict"], true);
        assert_eq!(
            chat["tools"].as_array().unwrap().len(),
            1,
            "function tools only"
        );
        assert_eq!(chat["tool_choice"]["function"]["name"], "shell");
        let m = chat["messages"].as_array().unwrap();
        assert_eq!(m[0], json!({"role": "system", "content": "Be brief."}));
        assert_eq!(m[1], json!({"role": "user", "content": "List files."}));
        assert_eq!(m[2]["tool_calls"].as_array().unwrap().len(), 2);
        assert_eq!(m[2]["reasoning_content"], "Use ls.");
        assert_eq!(
            m[3],
            json!({"role": "tool", "tool_call_id": "c1", "content": "a.txt"})
        );
        assert_eq!(m[5], json!({"role": "assistant", "content": "Done."}));
        assert!(crate::request::chat(&chat, None).is_ok());
        let e = to_chat(obj(
            json!({"model": "m", "input": "x", "previous_response_id": "resp_1"}),
        ))
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("previous_response_id"));
        let e = to_chat(obj(
            json!({"model": "m", "input": [{"type": "item_reference", "id": "x"}]}),
        ))
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("input[0]"));
    }

    fn done(finish: &'static str) -> Box<Done> {
        Box::new(Done {
            finish,
            stop_sequence: None,
            prompt_tokens: 7,
            completion_tokens: 3,
            stats: Default::default(),
            queue_time: Default::default(),
        })
    }

    #[test]
    fn the_stream_and_the_whole_response_agree() {
        let body = obj(json!({"model": "m", "input": "hi", "tools": []}));
        let mut s = ResponseStream::new(Envelope::of(&body, "resp-1".into()));
        let mut text = String::new();
        let delta = |content: &str, tool_calls: Vec<ToolEvent>| {
            Event::Delta(Delta {
                content: content.into(),
                reasoning: String::new(),
                tool_calls,
                ..Delta::default()
            })
        };
        text += &s.event(Some(delta("Run", vec![])));
        text += &s.event(Some(delta("ning.", vec![])));
        text += &s.event(Some(delta(
            "",
            vec![
                ToolEvent::Start {
                    index: 0,
                    id: "call_0".into(),
                    name: "shell".into(),
                },
                ToolEvent::Arguments {
                    index: 0,
                    delta: "{\"cmd\":".into(),
                },
                ToolEvent::Arguments {
                    index: 0,
                    delta: " \"ls\"}".into(),
                },
            ],
        )));
        text += &s.event(Some(Event::Done(done("tool_calls"))));
        assert!(s.finished());
        let events: Vec<Value> = text
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(|d| serde_json::from_str(d).unwrap())
            .collect();
        let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(
            kinds,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        let seq: Vec<u64> = events
            .iter()
            .map(|e| e["sequence_number"].as_u64().unwrap())
            .collect();
        assert_eq!(seq, (0..15).collect::<Vec<_>>());
        let last = &events[14]["response"];
        assert_eq!(last["status"], "completed");
        assert_eq!(last["output_text"], "Running.");
        assert_eq!(last["output"][1]["arguments"], "{\"cmd\": \"ls\"}");
        assert_eq!(last["output"][1]["call_id"], "call_0");
        assert_eq!(last["usage"]["total_tokens"], 10);
        assert_eq!(last["store"], false);
        // The whole (non-streamed) response of the same answer has the same items.
        let answer = Answer {
            content: "Running.".into(),
            reasoning: String::new(),
            calls: vec![crate::tool_calls::ToolCall {
                id: "call_0".into(),
                name: "shell".into(),
                arguments: "{\"cmd\": \"ls\"}".into(),
            }],
            ..Answer::default()
        };
        let whole = Envelope::of(&body, "resp-1".into())
            .response(Some(&done("tool_calls")), items("resp-1", answer));
        let strip = |v: &Value| {
            v["output"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| {
                    let mut i = i.clone();
                    i.as_object_mut().unwrap().remove("id");
                    i
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(strip(&whole), strip(last));
        let r = Envelope::of(&body, "resp-2".into()).response(Some(&done("length")), vec![]);
        assert_eq!(r["status"], "incomplete");
        assert_eq!(r["incomplete_details"]["reason"], "max_output_tokens");
    }
}
