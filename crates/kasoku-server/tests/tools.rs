//! Tool calls and structured output end to end on Qwen2.5-Coder-0.5B (a model that can drive
//! tools): calls forced by `tool_choice` and their arguments valid against the schema, streamed
//! as tool-call deltas with no markup in the content, a tool result answered in text,
//! `json_schema` answers that parse and match, schemas that cannot be enforced refused, and
//! fill-in-the-middle through `suffix`.

mod common;

use common::Running;
use kasoku_server::ServerConfig;
use serde_json::{json, Value};

fn qwen_coder() -> Option<Running> {
    let path = kasoku_fetch::ensure_for_test("qwen2.5-coder-0.5b")?;
    let config = ServerConfig {
        sessions: Some(1),
        context: Some(4096),
        model_id: Some("coder".into()),
        ..ServerConfig::default()
    };
    Some(Running::start_path(&path, config))
}

fn weather_tool() -> Value {
    json!({"type": "function", "function": {
        "name": "get_weather",
        "description": "The current weather of a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}
            },
            "required": ["city", "unit"],
            "additionalProperties": false
        }
    }})
}

fn time_tool() -> Value {
    json!({"type": "function", "function": {
        "name": "get_time",
        "description": "The current time in a time zone",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}
    }})
}

fn post(server: &Running, path: &str, body: &Value) -> (u16, Value) {
    let r = server.request("POST", path, Some(&body.to_string()));
    (r.status, r.json())
}

fn question(text: &str) -> Value {
    json!({
        "model": "coder",
        "messages": [{"role": "user", "content": text}],
        "tools": [weather_tool(), time_tool()],
        "temperature": 0,
        "max_tokens": 96,
    })
}

/// A call's arguments checked against get_weather's schema.
fn check_weather_call(call: &Value) {
    assert_eq!(call["type"], "function", "{call}");
    assert_eq!(call["function"]["name"], "get_weather", "{call}");
    assert!(call["id"].as_str().is_some_and(|id| !id.is_empty()));
    let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap())
        .unwrap_or_else(|e| panic!("arguments are not JSON ({e}): {call}"));
    assert!(args["city"].is_string(), "{args}");
    assert!(
        ["celsius", "fahrenheit"].contains(&args["unit"].as_str().unwrap()),
        "{args}"
    );
    assert_eq!(args.as_object().unwrap().len(), 2, "{args}");
}

#[test]
fn forced_tool_calls_streamed_calls_and_a_tool_round_trip() {
    let Some(server) = qwen_coder() else { return };
    // Named: the call is enforced, whatever the model would rather say.
    let mut body = question("Tell me a joke.");
    body["tool_choice"] = json!({"type": "function", "function": {"name": "get_weather"}});
    let (status, v) = post(&server, "/v1/chat/completions", &body);
    assert_eq!(status, 200, "{v}");
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    let calls = choice["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{v}");
    check_weather_call(&calls[0]);
    assert!(choice["message"]["content"].is_null(), "{v}");

    // Required, streamed: deltas rebuild the same kind of call; no content carries markup.
    let mut body = question("What is the weather in Paris, in celsius?");
    body["tool_choice"] = json!("required");
    body["parallel_tool_calls"] = json!(false);
    body["stream"] = json!(true);
    let r = server.request("POST", "/v1/chat/completions", Some(&body.to_string()));
    assert_eq!(r.status, 200, "{}", r.body);
    let mut content = String::new();
    let mut calls: Vec<Value> = Vec::new();
    let mut finish = Value::Null;
    let mut argument_deltas = 0;
    for data in r.events() {
        if data == "[DONE]" {
            break;
        }
        let chunk: Value = serde_json::from_str(&data).unwrap();
        let choice = &chunk["choices"][0];
        let delta = &choice["delta"];
        if let Some(t) = delta["content"].as_str() {
            content.push_str(t);
        }
        for d in delta["tool_calls"].as_array().into_iter().flatten() {
            let i = d["index"].as_u64().unwrap() as usize;
            if d["id"].is_string() {
                assert_eq!(i, calls.len());
                calls.push(json!({"id": d["id"], "type": d["type"], "function": {"name": d["function"]["name"], "arguments": ""}}));
            } else {
                argument_deltas += 1;
            }
            let piece = d["function"]["arguments"].as_str().unwrap_or_default();
            let args = calls[i]["function"]["arguments"]
                .as_str()
                .unwrap()
                .to_string()
                + piece;
            calls[i]["function"]["arguments"] = json!(args);
        }
        if !choice["finish_reason"].is_null() {
            finish = choice["finish_reason"].clone();
        }
    }
    assert!(
        !content.contains('<') && !content.contains('{'),
        "markup in content: {content:?}"
    );
    assert_eq!(finish, "tool_calls");
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert!(argument_deltas > 2, "arguments should stream in pieces");
    check_weather_call(&calls[0]);
    let args: Value =
        serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args["city"], "Paris");

    // The tool's result goes back through the template; the model answers in text.
    let body = json!({
        "model": "coder",
        "messages": [
            {"role": "user", "content": "What is the weather in Paris, in celsius?"},
            {"role": "assistant", "content": null, "tool_calls": [calls[0]]},
            {"role": "tool", "tool_call_id": calls[0]["id"], "content": "{\"temperature\": 21, \"sky\": \"sunny\"}"}
        ],
        "tools": [weather_tool(), time_tool()],
        "temperature": 0,
        "max_tokens": 48,
    });
    let (status, v) = post(&server, "/v1/chat/completions", &body);
    assert_eq!(status, 200, "{v}");
    let message = &v["choices"][0]["message"];
    let text = message["content"].as_str().unwrap_or_default();
    assert!(
        text.contains("21"),
        "the answer should use the tool's result: {v}"
    );
    assert!(message.get("tool_calls").is_none(), "{v}");
    assert!(!text.contains("<tool"), "{text}");

    // tool_choice none: the tools are not offered, and nothing is parsed as a call.
    let mut body = question("Say hello.");
    body["tool_choice"] = json!("none");
    let (_, v) = post(&server, "/v1/chat/completions", &body);
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
}

#[test]
fn json_schema_answers_match_and_unenforceable_schemas_are_refused() {
    let Some(server) = qwen_coder() else { return };
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "year": {"type": "integer"},
            "languages": {"type": "array", "items": {"type": "string"}, "maxItems": 3}
        },
        "required": ["name", "year", "languages"],
        "additionalProperties": false
    });
    let body = json!({
        "model": "coder",
        "messages": [{"role": "user", "content": "Describe the Rust programming language."}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "lang", "schema": schema, "strict": true}},
        "temperature": 0,
        "max_tokens": 120,
    });
    let (status, v) = post(&server, "/v1/chat/completions", &body);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    let text = v["choices"][0]["message"]["content"].as_str().unwrap();
    let answer: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert!(
        answer["name"].is_string() && answer["year"].is_i64(),
        "{answer}"
    );
    assert!(
        answer["languages"].as_array().unwrap().len() <= 3,
        "{answer}"
    );
    assert_eq!(answer.as_object().unwrap().len(), 3, "{answer}");
    // json_object: one object, nothing around it. (The schema above bounds the answer; a bare
    // object does not, so this asks for a short one and leaves room for it to close.)
    let mut body = body.clone();
    body["messages"] = json!([{"role": "user",
        "content": "Give the name and first release year of the Rust programming language."}]);
    body["response_format"] = json!({"type": "json_object"});
    body["max_tokens"] = json!(200);
    let (_, v) = post(&server, "/v1/chat/completions", &body);
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    let text = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(
        serde_json::from_str::<Value>(text)
            .unwrap_or_else(|e| panic!("{e}: {v}"))
            .is_object(),
        "{text}"
    );
    // A schema the engine cannot enforce: 400, saying why.
    body["response_format"] = json!({"type": "json_schema", "json_schema": {"name": "x", "strict": true,
        "schema": {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}}});
    let (status, v) = post(&server, "/v1/chat/completions", &body);
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["param"], "response_format");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("cannot be enforced"), "{message}");
}

#[test]
fn fill_in_the_middle_with_suffix() {
    let Some(server) = qwen_coder() else { return };
    let body = json!({
        "model": "coder",
        "prompt": "def add(a, b):\n    ",
        "suffix": "\n\nprint(add(2, 3))\n",
        "temperature": 0,
        "max_tokens": 16,
    });
    let (status, v) = post(&server, "/v1/completions", &body);
    assert_eq!(status, 200, "{v}");
    let text = v["choices"][0]["text"].as_str().unwrap();
    // The middle: the body the suffix calls for (the model may go on past it).
    assert!(text.starts_with("return a + b"), "{text:?}");
}

/// The Anthropic Messages API and the Responses API over the same model: a forced tool call
/// comes back as a `tool_use` block / a `function_call` item, the result round trip answers in
/// text, streams follow their event sequences, and /tokenize, /detokenize and count_tokens agree.
#[test]
fn anthropic_and_responses_apis_and_tokenize() {
    let Some(server) = qwen_coder() else { return };
    let tool = json!({"name": "get_weather", "description": "The current weather of a city",
        "input_schema": weather_tool()["function"]["parameters"]});
    let ask = json!({
        "model": "coder", "max_tokens": 96, "temperature": 0,
        "system": "You are a helpful assistant.",
        "messages": [{"role": "user", "content": "What is the weather in Oslo, in celsius?"}],
        "tools": [tool], "tool_choice": {"type": "any"},
    });
    let (status, v) = post(&server, "/v1/messages", &ask);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["type"], "message");
    assert_eq!(v["stop_reason"], "tool_use", "{v}");
    let block = v["content"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["type"] == "tool_use")
        .unwrap()
        .clone();
    assert_eq!(block["name"], "get_weather");
    assert_eq!(block["input"]["city"], "Oslo", "{block}");
    // The result goes back as a tool_result block.
    let mut follow = ask.clone();
    follow["messages"] = json!([
        ask["messages"][0],
        {"role": "assistant", "content": [block]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": block["id"], "content": "{\"temperature\": -3}"}]},
    ]);
    follow["tool_choice"] = json!({"type": "auto"});
    follow["max_tokens"] = json!(40);
    let (status, v) = post(&server, "/v1/messages", &follow);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["stop_reason"], "end_turn", "{v}");
    assert!(
        v["content"][0]["text"].as_str().unwrap().contains("-3"),
        "{v}"
    );
    // Streamed: the event sequence.
    let mut stream = follow.clone();
    stream["stream"] = json!(true);
    let r = server.request("POST", "/v1/messages", Some(&stream.to_string()));
    assert_eq!(r.status, 200);
    let kinds: Vec<String> = r
        .events()
        .iter()
        .map(|d| {
            serde_json::from_str::<Value>(d).unwrap()["type"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(kinds.first().map(String::as_str), Some("message_start"));
    assert_eq!(kinds.last().map(String::as_str), Some("message_stop"));
    assert!(
        kinds.iter().any(|k| k == "content_block_delta"),
        "{kinds:?}"
    );
    // count_tokens equals the prompt tokens the answer reported.
    let (_, count) = post(&server, "/v1/messages/count_tokens", &follow);
    let (_, answer) = post(&server, "/v1/messages", &follow);
    let u = &answer["usage"];
    let prompt =
        u["input_tokens"].as_u64().unwrap() + u["cache_read_input_tokens"].as_u64().unwrap();
    assert_eq!(
        count["input_tokens"].as_u64().unwrap(),
        prompt,
        "{count} {u}"
    );
    assert!(
        u["cache_read_input_tokens"].as_u64().unwrap() > 0,
        "the repeated prefix is cached: {u}"
    );

    // Responses: a forced function call, then its output answered in text.
    let fc_tool = json!({"type": "function", "name": "get_weather",
        "description": "The current weather of a city", "parameters": weather_tool()["function"]["parameters"]});
    let body = json!({
        "model": "coder", "instructions": "You are a helpful assistant.", "temperature": 0,
        "max_output_tokens": 96, "input": "What is the weather in Rome, in celsius?",
        "tools": [fc_tool], "tool_choice": "required", "store": false,
    });
    let (status, v) = post(&server, "/v1/responses", &body);
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "response");
    assert_eq!(v["status"], "completed", "{v}");
    let call = v["output"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["type"] == "function_call")
        .unwrap()
        .clone();
    let args: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args["city"], "Rome", "{call}");
    let follow = json!({
        "model": "coder", "instructions": "You are a helpful assistant.", "temperature": 0,
        "max_output_tokens": 40, "tools": [fc_tool], "stream": true,
        "input": [
            {"role": "user", "content": "What is the weather in Rome, in celsius?"},
            {"type": "function_call", "call_id": call["call_id"], "name": "get_weather", "arguments": call["arguments"]},
            {"type": "function_call_output", "call_id": call["call_id"], "output": "{\"temperature\": 30}"},
        ],
    });
    let r = server.request("POST", "/v1/responses", Some(&follow.to_string()));
    assert_eq!(r.status, 200, "{}", r.body);
    let events: Vec<Value> = r
        .events()
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(events[0]["type"], "response.created");
    let last = events.last().unwrap();
    assert_eq!(last["type"], "response.completed", "{last}");
    assert!(
        last["response"]["output_text"]
            .as_str()
            .unwrap()
            .contains("30"),
        "{last}"
    );

    // /tokenize and /detokenize round-trip; messages count as count_tokens does.
    let (_, t) = post(
        &server,
        "/tokenize",
        &json!({"content": "fn main() {}", "add_special": false}),
    );
    let ids = t["tokens"].clone();
    assert!(t["count"].as_u64().unwrap() > 2, "{t}");
    let (_, d) = post(&server, "/detokenize", &json!({"tokens": ids}));
    assert_eq!(d["content"], "fn main() {}");
    let (status, _) = post(&server, "/detokenize", &json!({"tokens": [u32::MAX]}));
    assert_eq!(status, 400);
}

/// Speculative decoding under a grammar answers exactly as plain decoding under it.
#[test]
fn speculative_serving_under_a_grammar_equals_plain_serving() {
    let Some(path) = kasoku_fetch::ensure_for_test("qwen2.5-coder-0.5b") else {
        return;
    };
    let config = |kind| ServerConfig {
        sessions: Some(1),
        context: Some(2048),
        model_id: Some("coder".into()),
        prefix_cache: None,
        speculation: kasoku_server::Speculation {
            kind,
            ..Default::default()
        },
        ..ServerConfig::default()
    };
    let body = json!({
        "model": "coder",
        "messages": [{"role": "user", "content": "List three prime numbers and their squares as JSON: {\"primes\": [{\"p\": 2, \"square\": 4}, ...]}. Repeat the same list twice under keys a and b."}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "strict": true, "schema": {
            "type": "object",
            "properties": {"a": {"type": "array", "maxItems": 3, "items": {"type": "object", "properties": {"p": {"type": "integer"}, "square": {"type": "integer"}}, "required": ["p", "square"], "additionalProperties": false}},
                           "b": {"type": "array", "maxItems": 3, "items": {"type": "object", "properties": {"p": {"type": "integer"}, "square": {"type": "integer"}}, "required": ["p", "square"], "additionalProperties": false}}},
            "required": ["a", "b"], "additionalProperties": false}}},
        "temperature": 0.7, "seed": 11, "max_tokens": 160,
    });
    let plain = Running::start_path(&path, config(kasoku::engine::SpecKind::None));
    let (s1, a) = post(&plain, "/v1/chat/completions", &body);
    drop(plain);
    let spec = Running::start_path(&path, config(kasoku::engine::SpecKind::Ngram));
    let (s2, b) = post(&spec, "/v1/chat/completions", &body);
    assert_eq!((s1, s2), (200, 200), "{a} {b}");
    let text = |v: &Value| {
        v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(text(&a), text(&b));
    serde_json::from_str::<Value>(&text(&a)).unwrap_or_else(|e| panic!("{e}: {}", text(&a)));
    assert!(
        b["usage"]["spec_accepted_tokens"].as_u64().unwrap() > 0,
        "{b}"
    );
}
