//! Request bodies of /v1/chat/completions and /v1/completions, parsed and checked field by
//! field so that every bad value is a 400 naming its parameter. Every field is either read
//! or refused: [`FIELDS`] is the allow-list, and a field it does not list, or lists as not
//! supported, is a 400 naming it (unless its value is null or empty, which asks for nothing),
//! so that no client believes a setting was honoured when it was ignored.

use serde_json::{Map, Value};

use kasoku::engine::{SamplingParams, MAX_TOP_LOGPROBS};
use kasoku::format::hf_config::GenerationDefaults;

use crate::error::ApiError;

/// Stop strings accepted per request.
const MAX_STOPS: usize = 16;

/// Temperatures below this sample greedily (as vLLM does): dividing logits by less overflows
/// f32 to infinity (1e-38 gives NaN probabilities), and no distribution that close to the
/// argmax differs from it.
pub const GREEDY_BELOW: f32 = 1e-5;

/// The smallest repetition penalty accepted. Below 1 a penalty favours repeated tokens (their
/// positive logits are divided by it); at 0.01 that is a factor of 100 already, and tinier
/// values overflow logits to infinity, which samples nonsense.
pub const MIN_REPETITION_PENALTY: f64 = 0.01;

/// Which endpoints read a field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum On {
    Both,
    Chat,
    Completion,
}

/// What the server does with a field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rule {
    /// Parsed and honoured (its value checked where it is read).
    Read,
    /// Not implemented: refused unless its value asks for nothing (null, false, 0, empty).
    Refused(&'static str),
}

/// The allow-list of request fields. Implementing a field means moving it from `Refused` to
/// `Read` and reading it in [`chat`], [`completion`] or [`common`].
const FIELDS: &[(&str, On, Rule)] = &[
    ("model", On::Both, Rule::Read),
    ("temperature", On::Both, Rule::Read),
    ("top_p", On::Both, Rule::Read),
    ("top_k", On::Both, Rule::Read),
    ("min_p", On::Both, Rule::Read),
    ("presence_penalty", On::Both, Rule::Read),
    ("frequency_penalty", On::Both, Rule::Read),
    ("repetition_penalty", On::Both, Rule::Read),
    ("seed", On::Both, Rule::Read),
    ("max_tokens", On::Both, Rule::Read),
    ("stop", On::Both, Rule::Read),
    ("stream", On::Both, Rule::Read),
    ("stream_options", On::Both, Rule::Read),
    // Only n = 1 (one choice per request).
    ("n", On::Both, Rule::Read),
    // llama.cpp's extensions.
    ("ignore_eos", On::Both, Rule::Read),
    ("cache_prompt", On::Both, Rule::Read),
    // An end-user id for the caller's own records: it asks nothing of generation.
    ("user", On::Both, Rule::Read),
    ("messages", On::Chat, Rule::Read),
    ("max_completion_tokens", On::Chat, Rule::Read),
    ("response_format", On::Chat, Rule::Read),
    ("chat_template_kwargs", On::Chat, Rule::Read),
    ("enable_thinking", On::Chat, Rule::Read),
    ("tools", On::Chat, Rule::Read),
    ("tool_choice", On::Chat, Rule::Read),
    ("parallel_tool_calls", On::Chat, Rule::Read),
    // Thinking on or off, where the template has the switch.
    ("reasoning_effort", On::Chat, Rule::Read),
    ("prompt", On::Completion, Rule::Read),
    // Only best_of = 1 and echo = false; suffix is fill-in-the-middle.
    ("best_of", On::Completion, Rule::Read),
    ("echo", On::Completion, Rule::Read),
    ("suffix", On::Completion, Rule::Read),
    // Chat: logprobs true/false with top_logprobs alternatives; completions: logprobs = N.
    ("logprobs", On::Both, Rule::Read),
    ("top_logprobs", On::Chat, Rule::Read),
    (
        "logit_bias",
        On::Both,
        Rule::Refused("logit_bias is not supported"),
    ),
    (
        "functions",
        On::Chat,
        Rule::Refused("function calling is not supported"),
    ),
    (
        "function_call",
        On::Chat,
        Rule::Refused("function calling is not supported"),
    ),
    ("audio", On::Chat, Rule::Refused("audio is not supported")),
    (
        "modalities",
        On::Chat,
        Rule::Refused("only text is supported"),
    ),
    (
        "prediction",
        On::Chat,
        Rule::Refused("predicted outputs are not supported"),
    ),
    (
        "web_search_options",
        On::Chat,
        Rule::Refused("web search is not supported"),
    ),
    (
        "store",
        On::Chat,
        Rule::Refused("stored completions are not supported"),
    ),
    (
        "metadata",
        On::Chat,
        Rule::Refused("stored completions are not supported"),
    ),
    (
        "service_tier",
        On::Both,
        Rule::Refused("service tiers are not supported"),
    ),
];

/// Fields of a chat message: read, or refused unless empty.
const MESSAGE_FIELDS: &[(&str, Rule)] = &[
    ("role", Rule::Read),
    ("content", Rule::Read),
    // Passed to the template (Qwen3's shows it for the last assistant turn).
    ("reasoning_content", Rule::Read),
    ("name", Rule::Refused("participant names are not supported")),
    ("refusal", Rule::Refused("refusals are not supported")),
    ("tool_calls", Rule::Read),
    ("tool_call_id", Rule::Read),
    (
        "function_call",
        Rule::Refused("function calling is not supported"),
    ),
    ("audio", Rule::Refused("audio is not supported")),
];

/// Fields of `stream_options`.
const STREAM_OPTION_FIELDS: &[(&str, Rule)] = &[("include_usage", Rule::Read)];

/// A value that asks for nothing: null, false, 0, "", [] or {}.
fn asks_nothing(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
    }
}

/// Refuses the fields of `object` (named `{prefix}{name}` in errors) that `allowed` does not
/// read, unless they ask for nothing.
fn check_fields(
    object: &Map<String, Value>,
    prefix: &str,
    allowed: &mut dyn Iterator<Item = (&'static str, Rule)>,
) -> Result<(), ApiError> {
    let rules: Vec<(&str, Rule)> = allowed.collect();
    for (name, value) in object {
        let rule = rules.iter().find(|(n, _)| n == name).map(|&(_, r)| r);
        let why = match rule {
            Some(Rule::Read) => continue,
            Some(Rule::Refused(why)) => why.to_string(),
            None => "kasoku does not know this parameter".to_string(),
        };
        if asks_nothing(value) {
            continue;
        }
        let param = format!("{prefix}{name}");
        return Err(ApiError {
            code: Some("unsupported_parameter"),
            ..ApiError::invalid(&param, format!("unsupported parameter '{param}': {why}"))
        });
    }
    Ok(())
}

/// The top-level fields of a request to the endpoint `on`.
fn check_request_fields(body: &Map<String, Value>, on: On) -> Result<(), ApiError> {
    let mut allowed = FIELDS
        .iter()
        .filter(|(_, o, _)| *o == On::Both || *o == on)
        .map(|&(n, _, r)| (n, r));
    check_fields(body, "", &mut allowed)
}

/// What the prompt is made of.
#[derive(Clone, Debug, PartialEq)]
pub enum PromptInput {
    /// Chat messages as the template expects them (`role`, `content` string).
    Chat {
        messages: Vec<Value>,
        template_kwargs: Map<String, Value>,
    },
    Text(String),
    Tokens(Vec<u32>),
}

/// Which tools the model may (or must) call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolChoice {
    /// Answer or call, as the model decides.
    Auto,
    /// No calls: the tools are not shown to the model.
    None,
    /// At least one call (enforced by the grammar).
    Required,
    /// A call of this function (enforced by the grammar).
    Named(String),
}

/// The shape the answer must have.
#[derive(Clone, Debug, PartialEq)]
pub enum ResponseFormat {
    Text,
    JsonObject,
    JsonSchema { schema: Value, strict: bool },
}

/// One function the model may call.
#[derive(Clone, Debug, PartialEq)]
pub struct Tool {
    pub name: String,
    pub description: Option<String>,
    pub parameters: Option<Value>,
}

impl Tool {
    /// The tool in OpenAI's shape, as chat templates take it.
    pub fn to_openai(&self) -> Value {
        let mut function = Map::new();
        function.insert("name".into(), self.name.clone().into());
        if let Some(d) = &self.description {
            function.insert("description".into(), d.clone().into());
        }
        function.insert(
            "parameters".into(),
            self.parameters
                .clone()
                .unwrap_or_else(|| serde_json::json!({"type": "object", "properties": {}})),
        );
        serde_json::json!({"type": "function", "function": function})
    }
}

/// A checked request.
#[derive(Clone, Debug)]
pub struct Request {
    pub model: String,
    pub prompt: PromptInput,
    pub sampling: SamplingParams,
    pub max_tokens: Option<usize>,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    pub response_format: ResponseFormat,
    pub tools: Vec<Tool>,
    pub tool_choice: ToolChoice,
    pub parallel_tool_calls: bool,
    /// Fill-in-the-middle: the text after the completion (`/v1/completions`).
    pub suffix: Option<String>,
    /// llama.cpp's extension: keep generating past end-of-text tokens.
    pub ignore_eos: bool,
    /// llama.cpp's `cache_prompt`: false = compute the whole prompt (no prefix reuse).
    pub cache_prompt: bool,
    /// Log-probabilities of the answer's tokens, with this many alternatives each.
    pub logprobs: Option<usize>,
}

/// The body as a JSON object (400 when it is not JSON or not an object).
pub fn parse_object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request("invalid_json", format!("the body is not valid JSON: {e}"))
    })?;
    match value {
        Value::Object(map) => Ok(map),
        _ => Err(ApiError::bad_request(
            "invalid_json",
            "the body must be a JSON object",
        )),
    }
}

/// Typed access to a request's fields; `null` counts as absent.
struct Fields<'a>(&'a Map<String, Value>);

impl<'a> Fields<'a> {
    fn get(&self, name: &str) -> Option<&'a Value> {
        self.0.get(name).filter(|v| !v.is_null())
    }

    fn f32(&self, name: &str, lo: f64, hi: f64) -> Result<Option<f32>, ApiError> {
        let Some(v) = self.get(name) else {
            return Ok(None);
        };
        match v.as_f64() {
            Some(x) if x.is_finite() && x >= lo && x <= hi => Ok(Some(x as f32)),
            Some(x) => Err(ApiError::invalid(
                name,
                format!("{name} = {x} is out of range: expected a number in [{lo}, {hi}]"),
            )),
            None => Err(ApiError::invalid(name, format!("{name} must be a number"))),
        }
    }

    fn uint(&self, name: &str) -> Result<Option<u64>, ApiError> {
        let Some(v) = self.get(name) else {
            return Ok(None);
        };
        v.as_u64()
            .or_else(|| v.as_i64().map(|i| i as u64))
            .map(Some)
            .ok_or_else(|| ApiError::invalid(name, format!("{name} must be an integer")))
    }

    fn bool(&self, name: &str) -> Result<Option<bool>, ApiError> {
        let Some(v) = self.get(name) else {
            return Ok(None);
        };
        v.as_bool()
            .map(Some)
            .ok_or_else(|| ApiError::invalid(name, format!("{name} must be true or false")))
    }

    fn string(&self, name: &str) -> Result<Option<&'a str>, ApiError> {
        let Some(v) = self.get(name) else {
            return Ok(None);
        };
        v.as_str()
            .map(Some)
            .ok_or_else(|| ApiError::invalid(name, format!("{name} must be a string")))
    }

    fn object(&self, name: &str) -> Result<Option<&'a Map<String, Value>>, ApiError> {
        let Some(v) = self.get(name) else {
            return Ok(None);
        };
        v.as_object()
            .map(Some)
            .ok_or_else(|| ApiError::invalid(name, format!("{name} must be an object")))
    }
}

/// Parses a chat completion request.
pub fn chat(
    body: &Map<String, Value>,
    defaults: Option<&GenerationDefaults>,
) -> Result<Request, ApiError> {
    check_request_fields(body, On::Chat)?;
    let f = Fields(body);
    let messages = match f.get("messages") {
        Some(Value::Array(list)) if !list.is_empty() => list
            .iter()
            .enumerate()
            .map(|(i, m)| message(i, m))
            .collect::<Result<Vec<_>, _>>()?,
        Some(Value::Array(_)) => {
            return Err(ApiError::invalid("messages", "messages must not be empty"))
        }
        Some(_) => return Err(ApiError::invalid("messages", "messages must be an array")),
        None => {
            return Err(ApiError::invalid(
                "messages",
                "missing required parameter: messages",
            ))
        }
    };
    let tools = tools(&f)?;
    let tool_choice = tool_choice(&f, &tools)?;
    let parallel_tool_calls = f.bool("parallel_tool_calls")?.unwrap_or(true);
    let mut template_kwargs = f
        .object("chat_template_kwargs")?
        .cloned()
        .unwrap_or_default();
    // Some clients put enable_thinking at the top level.
    if let Some(think) = f.bool("enable_thinking")? {
        template_kwargs
            .entry("enable_thinking")
            .or_insert(Value::Bool(think));
    }
    // reasoning_effort: thinking off for "none"/"minimal", on otherwise (templates without a
    // thinking switch ignore it).
    if let Some(effort) = f.string("reasoning_effort")? {
        let think = match effort {
            "none" | "minimal" => false,
            "low" | "medium" | "high" => true,
            other => {
                return Err(ApiError::invalid(
                    "reasoning_effort",
                    format!(
                        "reasoning_effort '{other}' is not one of none, minimal, low, medium, high"
                    ),
                ))
            }
        };
        template_kwargs
            .entry("enable_thinking")
            .or_insert(Value::Bool(think));
    }
    let response_format = response_format(&f)?;
    let max_tokens = match f.uint("max_completion_tokens")? {
        Some(n) => Some(n),
        None => f.uint("max_tokens")?,
    };
    let mut request = common(&f, defaults)?;
    request.prompt = PromptInput::Chat {
        messages,
        template_kwargs,
    };
    request.max_tokens = positive(max_tokens, "max_tokens")?;
    request.response_format = response_format;
    request.tools = tools;
    request.tool_choice = tool_choice;
    request.parallel_tool_calls = parallel_tool_calls;
    request.logprobs = chat_logprobs(&f)?;
    Ok(request)
}

/// Chat's `logprobs` (true/false) and `top_logprobs` (0..=20, only with `logprobs: true`).
fn chat_logprobs(f: &Fields) -> Result<Option<usize>, ApiError> {
    let on = f.bool("logprobs")?.unwrap_or(false);
    let top = top_count(f, "top_logprobs")?;
    match (on, top) {
        (false, Some(n)) if n > 0 => Err(ApiError::invalid(
            "top_logprobs",
            "top_logprobs needs logprobs: true",
        )),
        (false, _) => Ok(None),
        (true, top) => Ok(Some(top.unwrap_or(0))),
    }
}

/// A count of log-probability alternatives, 0..=[`MAX_TOP_LOGPROBS`].
fn top_count(f: &Fields, name: &str) -> Result<Option<usize>, ApiError> {
    match f.uint(name)? {
        // (Negative values arrive as huge ones.)
        Some(n) if n > MAX_TOP_LOGPROBS as u64 => Err(ApiError::invalid(
            name,
            format!("{name} must be between 0 and {MAX_TOP_LOGPROBS}"),
        )),
        other => Ok(other.map(|n| n as usize)),
    }
}

/// Parses a (raw) completion request.
pub fn completion(
    body: &Map<String, Value>,
    defaults: Option<&GenerationDefaults>,
) -> Result<Request, ApiError> {
    check_request_fields(body, On::Completion)?;
    let f = Fields(body);
    let prompt = match f.get("prompt") {
        Some(Value::String(s)) => PromptInput::Text(s.clone()),
        Some(Value::Array(list)) => match list.as_slice() {
            [Value::String(s)] => PromptInput::Text(s.clone()),
            items if !items.is_empty() && items.iter().all(|v| v.is_u64()) => PromptInput::Tokens(
                items
                    .iter()
                    .map(|v| v.as_u64().unwrap_or(u64::MAX).min(u32::MAX as u64) as u32)
                    .collect(),
            ),
            _ => {
                return Err(ApiError::invalid(
                    "prompt",
                    "prompt must be a string, a list of one string, or a list of token ids",
                ))
            }
        },
        Some(_) => {
            return Err(ApiError::invalid(
                "prompt",
                "prompt must be a string or a list of token ids",
            ))
        }
        None => {
            return Err(ApiError::invalid(
                "prompt",
                "missing required parameter: prompt",
            ))
        }
    };
    if f.bool("echo")? == Some(true) {
        return Err(ApiError::invalid("echo", "echo is not supported"));
    }
    let suffix = f.string("suffix")?.map(str::to_string);
    if suffix.is_some() && !matches!(prompt, PromptInput::Text(_)) {
        return Err(ApiError::invalid(
            "suffix",
            "suffix needs the prompt as text (fill-in-the-middle)",
        ));
    }
    let mut request = common(&f, defaults)?;
    request.prompt = prompt;
    request.suffix = suffix;
    request.max_tokens = positive(f.uint("max_tokens")?.or(Some(16)), "max_tokens")?;
    // Completions: logprobs = N asks for the chosen token and N alternatives.
    request.logprobs = top_count(&f, "logprobs")?;
    Ok(request)
}

fn positive(n: Option<u64>, name: &str) -> Result<Option<usize>, ApiError> {
    match n {
        Some(0) => Err(ApiError::invalid(
            name,
            format!("{name} must be at least 1"),
        )),
        Some(n) => Ok(Some(n.min(usize::MAX as u64) as usize)),
        None => Ok(None),
    }
}

/// Fields shared by both endpoints.
fn common(f: &Fields, defaults: Option<&GenerationDefaults>) -> Result<Request, ApiError> {
    let model = match f.string("model")? {
        Some(m) => m.to_string(),
        None => {
            return Err(ApiError::invalid(
                "model",
                "missing required parameter: model",
            ))
        }
    };
    if let Some(n) = f.uint("n")? {
        if n != 1 {
            return Err(ApiError::invalid(
                "n",
                format!("n = {n} is not supported: only one choice per request (n = 1)"),
            ));
        }
    }
    if f.get("best_of").is_some_and(|v| v.as_u64() != Some(1)) {
        return Err(ApiError::invalid("best_of", "best_of is not supported"));
    }
    let d = defaults;
    let default_f = |get: fn(&GenerationDefaults) -> Option<f64>, fallback: f32| {
        d.and_then(get).map(|x| x as f32).unwrap_or(fallback)
    };
    let mut s = SamplingParams {
        temperature: default_f(|d| d.temperature, 1.0),
        top_p: default_f(|d| d.top_p, 1.0),
        min_p: default_f(|d| d.min_p, 0.0),
        top_k: d.and_then(|d| d.top_k).unwrap_or(0),
        repetition_penalty: default_f(|d| d.repetition_penalty, 1.0),
        ..SamplingParams::default()
    };
    if d.and_then(|d| d.do_sample) == Some(false) {
        s.temperature = 0.0;
    }
    if let Some(t) = f.f32("temperature", 0.0, 2.0)? {
        s.temperature = t;
    }
    if s.temperature < GREEDY_BELOW {
        s.temperature = 0.0;
    }
    if let Some(p) = f.f32("top_p", 0.0, 1.0)? {
        if p == 0.0 {
            return Err(ApiError::invalid("top_p", "top_p must be greater than 0"));
        }
        s.top_p = p;
    }
    if let Some(k) = f.uint("top_k")? {
        s.top_k = k.min(u32::MAX as u64) as usize;
    }
    if let Some(p) = f.f32("min_p", 0.0, 1.0)? {
        s.min_p = p;
    }
    if let Some(p) = f.f32("presence_penalty", -2.0, 2.0)? {
        s.presence_penalty = p;
    }
    if let Some(p) = f.f32("frequency_penalty", -2.0, 2.0)? {
        s.frequency_penalty = p;
    }
    if let Some(p) = f.f32("repetition_penalty", MIN_REPETITION_PENALTY, 10.0)? {
        s.repetition_penalty = p;
    }
    s.seed = match f.get("seed") {
        None => random_seed(),
        Some(v) => v
            .as_u64()
            .or_else(|| v.as_i64().map(|i| i as u64))
            .ok_or_else(|| ApiError::invalid("seed", "seed must be an integer"))?,
    };
    s.validate()
        .map_err(|e| ApiError::invalid(e.name, e.to_string()))?;
    let stop = match f.get("stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(list)) => list
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                ApiError::invalid("stop", "stop must be a string or a list of strings")
            })?,
        Some(_) => {
            return Err(ApiError::invalid(
                "stop",
                "stop must be a string or a list of strings",
            ))
        }
    };
    if stop.len() > MAX_STOPS {
        return Err(ApiError::invalid(
            "stop",
            format!("at most {MAX_STOPS} stop strings"),
        ));
    }
    let stream = f.bool("stream")?.unwrap_or(false);
    let include_usage = match f.object("stream_options")? {
        Some(o) => {
            let mut allowed = STREAM_OPTION_FIELDS.iter().copied();
            check_fields(o, "stream_options.", &mut allowed)?;
            Fields(o).bool("include_usage")?.unwrap_or(false)
        }
        None => false,
    };
    let ignore_eos = f.bool("ignore_eos")?.unwrap_or(false);
    let cache_prompt = f.bool("cache_prompt")?.unwrap_or(true);
    Ok(Request {
        ignore_eos,
        cache_prompt,
        model,
        prompt: PromptInput::Text(String::new()),
        sampling: s,
        max_tokens: None,
        stop,
        stream,
        include_usage,
        response_format: ResponseFormat::Text,
        tools: Vec::new(),
        tool_choice: ToolChoice::Auto,
        parallel_tool_calls: true,
        suffix: None,
        logprobs: None,
    })
}

/// One chat message, normalized for the template: `{role, content: string}`, plus an
/// assistant's `tool_calls` (arguments as JSON objects) and `reasoning_content`, or a tool
/// message's `tool_call_id`.
fn message(i: usize, m: &Value) -> Result<Value, ApiError> {
    let param = format!("messages[{i}]");
    let bad = |msg: &str| ApiError::invalid(&param, format!("{param}: {msg}"));
    let obj = m.as_object().ok_or_else(|| bad("must be an object"))?;
    check_fields(
        obj,
        &format!("{param}."),
        &mut MESSAGE_FIELDS.iter().copied(),
    )?;
    let role = match obj.get("role").and_then(Value::as_str) {
        Some("developer") | Some("system") => "system",
        Some("user") => "user",
        Some("assistant") => "assistant",
        Some("tool") => "tool",
        Some(other) => {
            return Err(bad(&format!(
                "role '{other}' is not supported (system, developer, user, assistant, tool)"
            )))
        }
        None => return Err(bad("needs a role")),
    };
    let content = match obj.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => text_parts(parts).map_err(|e| bad(&e))?,
        Some(Value::Null) | None if role == "assistant" => String::new(),
        _ => return Err(bad("content must be a string or a list of text parts")),
    };
    let mut out = Map::new();
    out.insert("role".into(), role.into());
    out.insert("content".into(), content.into());
    match role {
        "assistant" => {
            if let Some(calls) = obj.get("tool_calls").filter(|v| !v.is_null()) {
                let calls = calls
                    .as_array()
                    .ok_or_else(|| bad("tool_calls must be an array"))?;
                let calls = calls
                    .iter()
                    .map(|c| history_call(c).map_err(|e| bad(&e)))
                    .collect::<Result<Vec<_>, _>>()?;
                out.insert("tool_calls".into(), Value::Array(calls));
            }
            match obj.get("reasoning_content") {
                None | Some(Value::Null) => {}
                Some(Value::String(r)) => {
                    out.insert("reasoning_content".into(), r.clone().into());
                }
                Some(_) => return Err(bad("reasoning_content must be a string")),
            }
        }
        "tool" => {
            let id = obj
                .get("tool_call_id")
                .and_then(Value::as_str)
                .unwrap_or_default();
            out.insert("tool_call_id".into(), id.into());
        }
        _ => {}
    }
    Ok(Value::Object(out))
}

/// The text of a content given as parts (text only).
fn text_parts(parts: &[Value]) -> Result<String, String> {
    let mut text = String::new();
    for part in parts {
        match (
            part.get("type").and_then(Value::as_str),
            part.get("text").and_then(Value::as_str),
        ) {
            (Some("text" | "input_text" | "output_text"), Some(t)) => text.push_str(t),
            (Some(kind), _) if !matches!(kind, "text" | "input_text" | "output_text") => {
                return Err(format!(
                    "content part type '{kind}' is not supported (text only)"
                ))
            }
            _ => return Err("content parts must be {\"type\": \"text\", \"text\": ...}".into()),
        }
    }
    Ok(text)
}

/// An assistant's earlier tool call, with its arguments parsed (templates print them with
/// `tojson`); arguments that are not a JSON object stay as written.
fn history_call(call: &Value) -> Result<Value, String> {
    let f = call
        .get("function")
        .ok_or("each tool call needs a function")?;
    let name = f
        .get("name")
        .and_then(Value::as_str)
        .ok_or("each tool call's function needs a name")?;
    let arguments = match f.get("arguments") {
        Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
            Ok(v @ Value::Object(_)) => v,
            _ => Value::String(s.clone()),
        },
        Some(v @ Value::Object(_)) => v.clone(),
        None | Some(Value::Null) => Value::Object(Map::new()),
        Some(_) => return Err("tool call arguments must be a JSON string".into()),
    };
    let id = call.get("id").and_then(Value::as_str).unwrap_or_default();
    Ok(serde_json::json!({
        "id": id,
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }))
}

/// `tools`: function tools only.
fn tools(f: &Fields) -> Result<Vec<Tool>, ApiError> {
    let Some(list) = f.get("tools") else {
        return Ok(Vec::new());
    };
    let list = list
        .as_array()
        .ok_or_else(|| ApiError::invalid("tools", "tools must be an array"))?;
    let mut tools = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let param = format!("tools[{i}]");
        let bad = |msg: &str| ApiError::invalid(&param, format!("{param}: {msg}"));
        match t.get("type").and_then(Value::as_str) {
            Some("function") | None => {}
            Some(other) => {
                return Err(bad(&format!(
                    "tool type '{other}' is not supported (function)"
                )))
            }
        }
        let function = t
            .get("function")
            .and_then(Value::as_object)
            .ok_or_else(|| bad("needs a function object"))?;
        let name = function
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| bad("the function needs a name"))?;
        let parameters = match function.get("parameters") {
            None | Some(Value::Null) => None,
            Some(p @ Value::Object(_)) => Some(p.clone()),
            Some(_) => {
                return Err(bad(
                    "the function's parameters must be a JSON Schema object",
                ))
            }
        };
        if tools.iter().any(|t: &Tool| t.name == name) {
            return Err(bad(&format!("two tools are named '{name}'")));
        }
        tools.push(Tool {
            name: name.to_string(),
            description: function
                .get("description")
                .and_then(Value::as_str)
                .map(str::to_string),
            parameters,
        });
    }
    Ok(tools)
}

fn tool_choice(f: &Fields, tools: &[Tool]) -> Result<ToolChoice, ApiError> {
    let bad = |msg: String| ApiError::invalid("tool_choice", msg);
    let choice = match f.get("tool_choice") {
        None => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" | "any" => ToolChoice::Required,
            other => {
                return Err(bad(format!(
                    "tool_choice '{other}' is not one of auto, none, required"
                )))
            }
        },
        Some(Value::Object(o)) => {
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .or_else(|| o.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| bad("tool_choice must name a function".into()))?;
            ToolChoice::Named(name.to_string())
        }
        Some(_) => return Err(bad("tool_choice must be a string or an object".into())),
    };
    match &choice {
        ToolChoice::Required if tools.is_empty() => {
            Err(bad("tool_choice 'required' needs tools".into()))
        }
        ToolChoice::Named(name) if !tools.iter().any(|t| &t.name == name) => Err(bad(format!(
            "tool_choice names '{name}', which is not among the tools"
        ))),
        _ => Ok(choice),
    }
}

fn response_format(f: &Fields) -> Result<ResponseFormat, ApiError> {
    let bad = |msg: String| ApiError::invalid("response_format", msg);
    let Some(rf) = f.object("response_format")? else {
        return Ok(ResponseFormat::Text);
    };
    match rf.get("type").and_then(Value::as_str) {
        Some("text") => Ok(ResponseFormat::Text),
        Some("json_object") => Ok(ResponseFormat::JsonObject),
        Some("json_schema") => {
            let js = rf
                .get("json_schema")
                .and_then(Value::as_object)
                .ok_or_else(|| {
                    bad("response_format json_schema needs a json_schema object".into())
                })?;
            let schema = match js.get("schema") {
                Some(s @ (Value::Object(_) | Value::Bool(_))) => s.clone(),
                None | Some(Value::Null) => serde_json::json!({}),
                Some(_) => {
                    return Err(bad("json_schema.schema must be a JSON Schema object".into()))
                }
            };
            let strict = js.get("strict").and_then(Value::as_bool).unwrap_or(false);
            Ok(ResponseFormat::JsonSchema { schema, strict })
        }
        Some(other) => Err(bad(format!(
            "response_format type '{other}' is not supported (text, json_object, json_schema)"
        ))),
        None => Err(bad("response_format needs a type".into())),
    }
}

/// A seed for requests that give none: different per request.
fn random_seed() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let mut x = nanos ^ COUNTER.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed);
    // splitmix64 finalizer
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn parses_a_full_chat_request() {
        let r = chat(
            &obj(json!({
                "model": "m",
                "messages": [
                    {"role": "developer", "content": "be brief"},
                    {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]}
                ],
                "temperature": 0.5, "top_k": 20, "seed": 7, "max_completion_tokens": 9,
                "stop": ["\n\n", "END"], "stream": true, "stream_options": {"include_usage": true},
                "chat_template_kwargs": {"enable_thinking": false},
                "response_format": {"type": "json_object"}, "n": 1
            })),
            None,
        )
        .unwrap();
        assert_eq!(r.sampling.temperature, 0.5);
        assert_eq!(r.sampling.top_k, 20);
        assert_eq!(r.sampling.seed, 7);
        assert_eq!(r.max_tokens, Some(9));
        assert_eq!(r.stop, vec!["\n\n".to_string(), "END".to_string()]);
        assert!(r.stream && r.include_usage);
        assert_eq!(r.response_format, ResponseFormat::JsonObject);
        let PromptInput::Chat {
            messages,
            template_kwargs,
        } = r.prompt
        else {
            panic!("not chat")
        };
        assert_eq!(
            messages[0],
            json!({"role": "system", "content": "be brief"})
        );
        assert_eq!(messages[1]["content"], "hi there");
        assert_eq!(template_kwargs["enable_thinking"], false);
    }

    #[test]
    fn bad_values_name_their_parameter() {
        let cases = [
            (json!({"model": "m"}), "messages"),
            (json!({"model": "m", "messages": []}), "messages"),
            (
                json!({"model": "m", "messages": [{"role": "wizard", "content": "x"}]}),
                "messages[0]",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": 3}]}),
                "messages[0]",
            ),
            (
                json!({"messages": [{"role": "user", "content": "x"}]}),
                "model",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": -1}),
                "temperature",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": "hot"}),
                "temperature",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 3}),
                "n",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}),
                "max_tokens",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "top_p": 0}),
                "top_p",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "stop": [1]}),
                "stop",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}}),
                "response_format",
            ),
        ];
        for (body, param) in cases {
            let e = chat(&obj(body.clone()), None).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}");
            assert_eq!(e.status, 400);
        }
        assert!(parse_object(b"{not json").is_err());
        assert!(parse_object(b"[1]").is_err());
    }

    #[test]
    fn logprobs_are_read_per_endpoint_and_bounded() {
        let chat_with = |extra: Value| {
            let mut b = json!({"model": "m", "messages": [{"role": "user", "content": "x"}]});
            for (k, v) in extra.as_object().unwrap() {
                b[k] = v.clone();
            }
            chat(&obj(b), None)
        };
        assert_eq!(chat_with(json!({})).unwrap().logprobs, None);
        assert_eq!(
            chat_with(json!({"logprobs": true})).unwrap().logprobs,
            Some(0)
        );
        assert_eq!(
            chat_with(json!({"logprobs": true, "top_logprobs": 5}))
                .unwrap()
                .logprobs,
            Some(5)
        );
        assert_eq!(
            chat_with(json!({"logprobs": false, "top_logprobs": 0}))
                .unwrap()
                .logprobs,
            None
        );
        for (extra, param) in [
            (json!({"top_logprobs": 2}), "top_logprobs"),
            (
                json!({"logprobs": true, "top_logprobs": 21}),
                "top_logprobs",
            ),
            (
                json!({"logprobs": true, "top_logprobs": -1}),
                "top_logprobs",
            ),
            (json!({"logprobs": 3}), "logprobs"),
        ] {
            let e = chat_with(extra.clone()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{extra}");
        }
        let completion_with = |lp: Value| {
            completion(
                &obj(json!({"model": "m", "prompt": "x", "logprobs": lp})),
                None,
            )
        };
        assert_eq!(completion_with(json!(2)).unwrap().logprobs, Some(2));
        assert_eq!(completion_with(Value::Null).unwrap().logprobs, None);
        assert!(completion_with(json!(99)).is_err());
        // top_logprobs is chat's: on completions it is unknown.
        let e = completion(
            &obj(json!({"model": "m", "prompt": "x", "top_logprobs": 2})),
            None,
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("top_logprobs"));
    }

    /// One regression test per class of field: not implemented (refused unless empty),
    /// unknown, inside a message, inside stream_options.
    #[test]
    fn every_field_is_read_or_refused_by_name() {
        let base = || json!({"model": "m", "messages": [{"role": "user", "content": "x"}]});
        let with = |key: &str, value: Value| {
            let mut b = base();
            b[key] = value;
            b
        };
        let refused = [
            (with("logit_bias", json!({"15": 10})), "logit_bias"),
            (
                with("functions", json!([{"name": "f", "parameters": {}}])),
                "functions",
            ),
            (with("function_call", json!("auto")), "function_call"),
            (with("frobnicate", json!(1)), "frobnicate"),
            (
                with(
                    "messages",
                    json!([{"role": "user", "content": "x", "name": "bob"}]),
                ),
                "messages[0].name",
            ),
            (
                with(
                    "stream_options",
                    json!({"include_usage": true, "include_obfuscation": true}),
                ),
                "stream_options.include_obfuscation",
            ),
        ];
        for (body, param) in refused {
            let e = chat(&obj(body.clone()), None).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}");
            assert_eq!(e.status, 400);
            assert_eq!(e.code, Some("unsupported_parameter"), "{body}");
            assert!(e.message.contains(param), "{}", e.message);
        }
        // Values that ask for nothing are fine (SDKs send such defaults).
        for (key, value) in [
            ("logit_bias", json!({})),
            ("logprobs", json!(false)),
            ("top_logprobs", json!(0)),
            ("tools", json!([])),
            ("functions", Value::Null),
            ("user", json!("user-1234")),
        ] {
            assert!(
                chat(&obj(with(key, value.clone())), None).is_ok(),
                "{key}: {value}"
            );
        }
        let e = completion(
            &obj(json!({"model": "m", "prompt": "x", "logit_bias": {"1": 1}})),
            None,
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("logit_bias"));
        // A chat-only field on the completion endpoint is unknown there.
        let e = completion(
            &obj(json!({"model": "m", "prompt": "x", "messages": [1]})),
            None,
        )
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("messages"));
    }

    #[test]
    fn values_that_cannot_be_sampled() {
        let body = |key: &str, value: Value| {
            let mut b = json!({"model": "m", "prompt": "x"});
            b[key] = value;
            obj(b)
        };
        // A temperature too small to divide by is greedy.
        for t in [1e-38, 1e-9, 9e-6] {
            let r = completion(&body("temperature", json!(t)), None).unwrap();
            assert_eq!(r.sampling.temperature, 0.0, "{t}");
        }
        let r = completion(&body("temperature", json!(0.2)), None).unwrap();
        assert_eq!(r.sampling.temperature, 0.2);
        // Non-positive and vanishing repetition penalties are 400s.
        for p in [0.0, -1.0, 1e-30, 0.001] {
            let e = completion(&body("repetition_penalty", json!(p)), None).unwrap_err();
            assert_eq!(e.param.as_deref(), Some("repetition_penalty"), "{p}");
        }
        assert!(completion(&body("repetition_penalty", json!(0.5)), None).is_ok());
    }

    #[test]
    fn completion_prompts_and_defaults() {
        let r = completion(&obj(json!({"model": "m", "prompt": ["abc"]})), None).unwrap();
        assert_eq!(r.prompt, PromptInput::Text("abc".into()));
        assert_eq!(r.max_tokens, Some(16));
        assert_eq!(r.sampling.temperature, 1.0);
        let r = completion(&obj(json!({"model": "m", "prompt": [1, 2, 3]})), None).unwrap();
        assert_eq!(r.prompt, PromptInput::Tokens(vec![1, 2, 3]));
        assert!(completion(&obj(json!({"model": "m", "prompt": 5})), None).is_err());
        // Two requests without a seed get different seeds.
        let a = completion(&obj(json!({"model": "m", "prompt": "x"})), None).unwrap();
        let b = completion(&obj(json!({"model": "m", "prompt": "x"})), None).unwrap();
        assert_ne!(a.sampling.seed, b.sampling.seed);
    }

    #[test]
    fn tools_tool_history_and_schemas() {
        let weather = json!({"type": "function", "function": {
            "name": "get_weather", "description": "Weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}});
        let r = chat(
            &obj(json!({
                "model": "m",
                "messages": [
                    {"role": "user", "content": "Weather in Paris?"},
                    {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                    {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "sunny"}]}
                ],
                "tools": [weather],
                "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
                "parallel_tool_calls": false,
                "reasoning_effort": "none",
                "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}, "strict": true}}
            })),
            None,
        )
        .unwrap();
        assert_eq!(r.tools.len(), 1);
        assert_eq!(r.tools[0].to_openai(), weather);
        assert_eq!(r.tool_choice, ToolChoice::Named("get_weather".into()));
        assert!(!r.parallel_tool_calls);
        assert_eq!(
            r.response_format,
            ResponseFormat::JsonSchema {
                schema: json!({"type": "object"}),
                strict: true
            }
        );
        let PromptInput::Chat {
            messages,
            template_kwargs,
        } = r.prompt
        else {
            panic!("not chat")
        };
        assert_eq!(template_kwargs["enable_thinking"], false);
        // Arguments become an object for the template; the tool result is text.
        assert_eq!(
            messages[1]["tool_calls"][0]["function"]["arguments"],
            json!({"city": "Paris"})
        );
        assert_eq!(messages[1]["content"], "");
        assert_eq!(
            messages[2],
            json!({"role": "tool", "content": "sunny", "tool_call_id": "call_1"})
        );
        let base = |extra: Value| {
            let mut b = json!({"model": "m", "messages": [{"role": "user", "content": "x"}]});
            for (k, v) in extra.as_object().unwrap() {
                b[k] = v.clone();
            }
            chat(&obj(b), None)
        };
        for (extra, param) in [
            (json!({"tool_choice": "required"}), "tool_choice"),
            (
                json!({"tools": [weather], "tool_choice": {"type": "function", "function": {"name": "other"}}}),
                "tool_choice",
            ),
            (json!({"tools": [{"type": "retrieval"}]}), "tools[0]"),
            (
                json!({"tools": [{"type": "function", "function": {}}]}),
                "tools[0]",
            ),
            (json!({"tools": [weather, weather]}), "tools[1]"),
            (json!({"reasoning_effort": "max"}), "reasoning_effort"),
            (
                json!({"response_format": {"type": "json_schema"}}),
                "response_format",
            ),
        ] {
            let e = base(extra.clone()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{extra}");
        }
        let c = completion(
            &obj(json!({"model": "m", "prompt": "def f(", "suffix": "\n    return x"})),
            None,
        )
        .unwrap();
        assert_eq!(c.suffix.as_deref(), Some("\n    return x"));
    }
}
