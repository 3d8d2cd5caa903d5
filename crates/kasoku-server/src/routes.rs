//! HTTP routes: /v1/chat/completions and /v1/completions (JSON or Server-Sent Events; tool
//! calls as `tool_calls` and their deltas), /v1/messages and /v1/responses (through
//! `anthropic` and `responses`), /tokenize and /detokenize, /v1/models, /health, /metrics; who may call (Host, Origin: `access`) before any route,
//! API-key checks, body limits (size, time, memory of all bodies together), prompt limits, and
//! OpenAI-shaped errors for unknown routes and methods.

use std::cell::Cell;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};
use tokio::sync::Semaphore;

use kasoku::engine::GenerateOptions;

use crate::access::Access;
use crate::answer;
use crate::anthropic;
use crate::error::ApiError;
use crate::logprobs;
use crate::metrics::{add, Gauges};
use crate::output::Delta;
use crate::pool::{Done, Engine, Event, Job, Pool};
pub(crate) use crate::prepare::Kind;
use crate::prepare::{prepare_object, prompt_fits, unknown_model, Prepared};
use crate::request::{self, Request};
use crate::responses;
use crate::tool_calls::ToolEvent;

/// What the handlers share.
pub struct App {
    pub engine: Arc<Engine>,
    pub pool: Pool,
    pub api_key: Option<String>,
    pub max_body: usize,
    /// Time a body has to arrive once its headers are in.
    pub body_timeout: std::time::Duration,
    /// KiB of bodies being received at once, all requests together.
    pub body_memory: Arc<Semaphore>,
    pub access: Access,
    pub connections: crate::connections::Connections,
    pub created: u64,
}

pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completion))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/v1/responses", post(responses::create))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/v1/models", get(models))
        .route("/v1/models/{*id}", get(model))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&app),
            guard,
        ))
        .with_state(app)
}

/// Runs [`Access::check`] before any route, and adds the CORS header for an allowed origin.
async fn guard(
    State(app): State<Arc<App>>,
    request: axum::extract::Request,
    next: Next,
) -> Response {
    let passed = match app.access.check(&request) {
        Ok(p) => p,
        Err(refused) => return *refused,
    };
    let mut response = next.run(request).await;
    if let Some(origin) = passed.allow_origin {
        let h = response.headers_mut();
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
        h.insert(header::VARY, HeaderValue::from_static("Origin"));
    }
    response
}

async fn not_found() -> ApiError {
    ApiError::not_found("unknown_url", "no such route")
}

async fn method_not_allowed() -> ApiError {
    ApiError::method_not_allowed()
}

/// `POST /tokenize`: `content` (or `prompt`) as text, or `messages` rendered by the chat
/// template; `add_special` (default true) adds BOS where the model wants it, `with_pieces`
/// gives each id with its text.
async fn tokenize(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    let run = async {
        let object = read_object(&app, &headers, body).await?;
        let app = Arc::clone(&app);
        tokio::task::spawn_blocking(move || tokenize_object(&app, &object))
            .await
            .map_err(|_| ApiError::internal("tokenizing failed"))?
    };
    match run.await {
        Ok(v) => json_response(StatusCode::OK, &v),
        Err(e) => e.into_response(),
    }
}

fn tokenize_object(app: &App, object: &Map<String, Value>) -> Result<Value, ApiError> {
    let tokenizer = &app.engine.model.tokenizer;
    let add_special = object
        .get("add_special")
        .or(object.get("add_special_tokens"))
        .and_then(Value::as_bool)
        .unwrap_or(true);
    let ids = if let Some(text) = object.get("content").or(object.get("prompt")) {
        let text = text
            .as_str()
            .ok_or_else(|| ApiError::invalid("content", "content must be a string"))?;
        prompt_fits(&app.engine, text.len(), "content")?;
        let encoded = if add_special {
            tokenizer.encode_with_bos(text, true)
        } else {
            tokenizer.encode(text, true)
        };
        encoded.map_err(|e| ApiError::bad_request("tokenizer_error", format!("tokenizing: {e}")))?
    } else if object.contains_key("messages") {
        let mut chat = object.clone();
        chat.entry("model")
            .or_insert_with(|| app.engine.id.clone().into());
        prepare_object(&app.engine, &chat, Kind::Chat)?.prompt
    } else {
        return Err(ApiError::invalid(
            "content",
            "missing required parameter: content (or messages)",
        ));
    };
    let with_pieces = object.get("with_pieces").and_then(Value::as_bool) == Some(true);
    let tokens: Vec<Value> = ids
        .iter()
        .map(|&id| {
            if with_pieces {
                json!({"id": id, "piece": tokenizer.decode(&[id])})
            } else {
                json!(id)
            }
        })
        .collect();
    Ok(json!({"tokens": tokens, "count": ids.len(), "max_model_len": app.engine.ctx}))
}

/// `POST /detokenize`: `tokens` (ids) back to text.
async fn detokenize(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    let run = async {
        let object = read_object(&app, &headers, body).await?;
        let bad = || ApiError::invalid("tokens", "tokens must be a list of token ids");
        let list = object
            .get("tokens")
            .and_then(Value::as_array)
            .ok_or_else(bad)?;
        let vocab = app.engine.model.tokenizer.token_count();
        let ids = list
            .iter()
            .map(|v| match v.as_u64() {
                Some(id) if (id as usize) < vocab => Ok(id as u32),
                Some(id) => Err(ApiError::invalid(
                    "tokens",
                    format!("token id {id} is outside the vocabulary ({vocab})"),
                )),
                None => Err(bad()),
            })
            .collect::<Result<Vec<u32>, _>>()?;
        Ok::<_, ApiError>(json!({"content": app.engine.model.tokenizer.decode(&ids)}))
    };
    match run.await {
        Ok(v) => json_response(StatusCode::OK, &v),
        Err(e) => e.into_response(),
    }
}

async fn health() -> Response {
    json_response(StatusCode::OK, &json!({"status": "ok"}))
}

async fn metrics(State(app): State<Arc<App>>, headers: HeaderMap) -> Result<Response, ApiError> {
    authorize(&app, &headers)?;
    let cache = app
        .engine
        .cache
        .as_ref()
        .map(|c| c.lock().unwrap_or_else(|e| e.into_inner()).stats())
        .unwrap_or_default();
    let text = app.engine.metrics.render(&Gauges {
        device: app.engine.target.device(),
        queue_depth: app.pool.queue_depth(),
        running: app.pool.running(),
        sessions: app.pool.sessions(),
        connections: app.connections.open(),
        cache_bytes: cache.bytes,
        cache_entries: cache.entries,
        cache_hits: cache.hits,
        cache_lookups: cache.lookups,
    });
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response())
}

fn model_object(app: &App) -> Value {
    json!({
        "id": app.engine.id,
        "object": "model",
        "created": app.created,
        "owned_by": "kasoku",
        "meta": {
            "n_ctx": app.engine.ctx,
            "n_vocab": app.engine.model.vocab,
            "device": app.engine.target.device(),
            "path": app.engine.model.path.display().to_string(),
        }
    })
}

async fn models(State(app): State<Arc<App>>, headers: HeaderMap) -> Result<Response, ApiError> {
    authorize(&app, &headers)?;
    Ok(json_response(
        StatusCode::OK,
        &json!({"object": "list", "data": [model_object(&app)]}),
    ))
}

async fn model(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    authorize(&app, &headers)?;
    if !app.engine.names.contains(&id) {
        return Err(unknown_model(&app.engine, &id));
    }
    Ok(json_response(StatusCode::OK, &model_object(&app)))
}

async fn chat(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    generate(app, headers, body, Kind::Chat)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn completion(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    generate(app, headers, body, Kind::Completion)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

pub(crate) fn json_response(status: StatusCode, value: &Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        value.to_string(),
    )
        .into_response()
}

fn authorize(app: &App, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(key) = &app.api_key else {
        return Ok(());
    };
    // OpenAI clients send `Authorization: Bearer`, Anthropic's `x-api-key`.
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()));
    match given {
        Some(g) if g.trim() == key => Ok(()),
        Some(_) => Err(ApiError::unauthorized("incorrect API key provided")),
        None => Err(ApiError::unauthorized(
            "missing API key: send Authorization: Bearer <key> (or x-api-key: <key>)",
        )),
    }
}

/// Reads a body within the limits: at most `max_body` bytes, within `body_timeout`, and only
/// while the bodies being received together stay within the server's body memory (the
/// declared length is reserved first, or `max_body` for a body of unknown length; a body that
/// does not fit is refused at once rather than waiting, so slow clients cannot queue up).
async fn read_body(app: &App, headers: &HeaderMap, body: Body) -> Result<Bytes, ApiError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > app.max_body as u64) {
        return Err(ApiError::too_large(app.max_body));
    }
    let reserve = declared.map_or(app.max_body, |n| n as usize);
    let kib = reserve.div_ceil(1024).min(u32::MAX as usize) as u32;
    let _memory = Arc::clone(&app.body_memory)
        .try_acquire_many_owned(kib)
        .map_err(|_| {
            ApiError::overloaded(
                "the server is receiving too many request bodies at once; retry later",
            )
        })?;
    let read = axum::body::to_bytes(body, app.max_body);
    match tokio::time::timeout(app.body_timeout, read).await {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(_)) => Err(ApiError::too_large(app.max_body)),
        Err(_) => Err(ApiError::timeout(format!(
            "the request body did not arrive within {} s",
            app.body_timeout.as_secs_f64()
        ))),
    }
}

/// A request on its way: the checked request and its answer's events.
pub(crate) struct Started {
    pub request: Request,
    /// The first event (never an error: that is returned instead).
    pub first: Event,
    pub rx: UnboundedReceiver<Event>,
    /// The prompt's length in tokens.
    pub prompt_tokens: usize,
}

/// Checks the key and reads the body as a JSON object.
pub(crate) async fn read_object(
    app: &App,
    headers: &HeaderMap,
    body: Body,
) -> Result<Map<String, Value>, ApiError> {
    authorize(app, headers)?;
    let body = read_body(app, headers, body).await?;
    request::parse_object(&body)
}

/// Queues a request (a chat or completion body, possibly translated from another API) and
/// waits for its first event, so that a failure before any output is an HTTP error.
pub(crate) async fn start(
    app: &Arc<App>,
    object: Map<String, Value>,
    kind: Kind,
) -> Result<Started, ApiError> {
    let arrived = Instant::now();
    let prepared = {
        let app = Arc::clone(app);
        tokio::task::spawn_blocking(move || prepare_object(&app.engine, &object, kind))
            .await
            .map_err(|_| ApiError::internal("preparing the request failed"))??
    };
    let Prepared {
        request,
        prompt,
        in_thinking,
        tools,
        constraint,
    } = prepared;
    let prompt_tokens = prompt.len();
    let room = app.engine.ctx - prompt.len();
    let options = GenerateOptions {
        logprobs: request.logprobs,
        sampling: request.sampling.clone(),
        max_tokens: request.max_tokens.unwrap_or(room).min(room),
        stop_tokens: if request.ignore_eos {
            Vec::new()
        } else {
            app.engine.stop_tokens.clone()
        },
        constraint,
    };
    let call_id_prefix = format!("{}_", unique_id("call"));
    let (tx, mut rx) = unbounded_channel();
    let job = Job {
        prompt,
        options,
        stop: request.stop.clone(),
        in_thinking,
        tools,
        call_id_prefix,
        use_cache: request.cache_prompt,
        events: tx,
        arrived,
    };
    if let Err(e) = app.pool.submit(job) {
        add(&app.engine.metrics.requests_rejected, 1);
        return Err(e);
    }
    let first = rx
        .recv()
        .await
        .ok_or_else(|| ApiError::internal("generation ended without a result"))?;
    if let Event::Error(e) = first {
        return Err(e);
    }
    Ok(Started {
        request,
        first,
        rx,
        prompt_tokens,
    })
}

async fn generate(
    app: Arc<App>,
    headers: HeaderMap,
    body: Body,
    kind: Kind,
) -> Result<Response, ApiError> {
    let object = read_object(&app, &headers, body).await?;
    let Started {
        request, first, rx, ..
    } = start(&app, object, kind).await?;
    let reply = Reply {
        id: new_id(kind),
        kind,
        model: app.engine.id.clone(),
        created: unix_now(),
        include_usage: request.include_usage,
        logprobs: request.logprobs.is_some(),
        text_sent: Cell::new(0),
    };
    if request.stream {
        Ok(stream(reply, first, rx))
    } else {
        collect(reply, first, rx).await
    }
}

/// Fixed fields of one request's answer.
struct Reply {
    id: String,
    kind: Kind,
    model: String,
    created: u64,
    include_usage: bool,
    /// Whether the request asked for log-probabilities.
    logprobs: bool,
    /// Bytes of token text streamed so far (completions' `text_offset`).
    text_sent: Cell<usize>,
}

impl Reply {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.kind, chunk) {
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Completion, _) => "text_completion",
        }
    }

    fn envelope(&self, chunk: bool, choices: Value) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("id".into(), self.id.clone().into());
        m.insert("object".into(), self.object(chunk).into());
        m.insert("created".into(), self.created.into());
        m.insert("model".into(), self.model.clone().into());
        m.insert(
            "system_fingerprint".into(),
            format!("kasoku-{}", env!("CARGO_PKG_VERSION")).into(),
        );
        m.insert("choices".into(), choices);
        m
    }

    /// A streamed chunk carrying `delta` (chat) or text (completion), or the finish reason.
    fn chunk(&self, delta: Option<&Delta>, finish: Option<&str>, role: bool) -> String {
        let choice = match self.kind {
            Kind::Chat => {
                let mut d = Map::new();
                if role {
                    d.insert("role".into(), "assistant".into());
                }
                if let Some(delta) = delta {
                    if !delta.reasoning.is_empty() {
                        d.insert("reasoning_content".into(), delta.reasoning.clone().into());
                    }
                    if !delta.content.is_empty() || role {
                        d.insert("content".into(), delta.content.clone().into());
                    }
                    if !delta.tool_calls.is_empty() {
                        d.insert("tool_calls".into(), tool_call_deltas(&delta.tool_calls));
                    }
                }
                let lp = delta
                    .filter(|d| !d.logprobs.is_empty())
                    .map_or(Value::Null, |d| logprobs::chat(&d.logprobs));
                json!({"index": 0, "delta": d, "logprobs": lp, "finish_reason": finish})
            }
            Kind::Completion => {
                let lp = match delta.filter(|d| !d.logprobs.is_empty()) {
                    Some(d) => {
                        let offset = self.text_sent.get();
                        self.text_sent.set(offset + logprobs::text_len(&d.logprobs));
                        logprobs::completion(&d.logprobs, offset)
                    }
                    None => Value::Null,
                };
                json!({
                    "index": 0,
                    "text": delta.map(|d| d.content.as_str()).unwrap_or(""),
                    "logprobs": lp,
                    "finish_reason": finish,
                })
            }
        };
        let mut m = self.envelope(true, json!([choice]));
        if self.include_usage {
            m.insert("usage".into(), Value::Null);
        }
        sse(&Value::Object(m))
    }
}

/// Tool call events as OpenAI's `delta.tool_calls`: a start carries the id, type, name and
/// empty arguments; argument pieces carry only the index and the piece.
fn tool_call_deltas(events: &[ToolEvent]) -> Value {
    let list = events
        .iter()
        .filter_map(|e| match e {
            ToolEvent::Start { index, id, name } => Some(json!({
                "index": index, "id": id, "type": "function",
                "function": {"name": name, "arguments": ""},
            })),
            ToolEvent::Arguments { index, delta } => {
                Some(json!({"index": index, "function": {"arguments": delta}}))
            }
            ToolEvent::Content(_) => None,
        })
        .collect();
    Value::Array(list)
}

fn sse(v: &Value) -> String {
    format!("data: {v}\n\n")
}

/// `usage` with kasoku's fields.
fn usage(done: &Done) -> Value {
    let s = &done.stats;
    json!({
        "prompt_tokens": done.prompt_tokens,
        "completion_tokens": done.completion_tokens,
        "total_tokens": done.prompt_tokens + done.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": s.cached_tokens},
        "spec_verify_ct": s.decode_passes,
        "spec_accepted_tokens": s.decode_tokens.saturating_sub(s.decode_passes),
        "timings": {
            "queue_ms": done.queue_time.as_secs_f64() * 1e3,
            "ttft_ms": s.time_to_first_token.as_secs_f64() * 1e3,
            "prefill_tokens": s.prompt_tokens,
            "prefill_tokens_per_s": s.prefill_tokens_per_second(),
            "decode_tokens_per_s": s.decode_tokens_per_second(),
            "tokens_per_pass": s.tokens_per_pass(),
        }
    })
}

async fn collect(
    reply: Reply,
    first: Event,
    mut rx: UnboundedReceiver<Event>,
) -> Result<Response, ApiError> {
    let (answer, done) = answer::collect(first, &mut rx).await?;
    let asked = reply_logprobs(&reply, &answer);
    let choice = match reply.kind {
        Kind::Chat => {
            let mut message = Map::new();
            message.insert("role".into(), "assistant".into());
            let content = if answer.calls.is_empty() || !answer.content.trim().is_empty() {
                Value::String(answer.content)
            } else {
                Value::Null
            };
            message.insert("content".into(), content);
            if !answer.reasoning.is_empty() {
                message.insert("reasoning_content".into(), answer.reasoning.into());
            }
            if !answer.calls.is_empty() {
                let calls: Vec<Value> = answer
                    .calls
                    .iter()
                    .map(|c| {
                        json!({"id": c.id, "type": "function",
                               "function": {"name": c.name, "arguments": c.arguments}})
                    })
                    .collect();
                message.insert("tool_calls".into(), Value::Array(calls));
            }
            json!({"index": 0, "message": message, "logprobs": asked, "finish_reason": done.finish})
        }
        Kind::Completion => {
            json!({"index": 0, "text": answer.content, "logprobs": asked, "finish_reason": done.finish})
        }
    };
    let mut m = reply.envelope(false, json!([choice]));
    m.insert("usage".into(), usage(&done));
    Ok(json_response(StatusCode::OK, &Value::Object(m)))
}

/// A whole answer's `logprobs` object, or null when none were asked for.
fn reply_logprobs(reply: &Reply, answer: &answer::Answer) -> Value {
    if !reply.logprobs {
        return Value::Null;
    }
    match reply.kind {
        Kind::Chat => logprobs::chat(&answer.logprobs),
        Kind::Completion => logprobs::completion(&answer.logprobs, 0),
    }
}

/// The streaming answer. Dropping the body (client gone) drops the receiver, which stops the
/// worker at its next token.
fn stream(reply: Reply, first: Event, rx: UnboundedReceiver<Event>) -> Response {
    struct St {
        reply: Reply,
        rx: UnboundedReceiver<Event>,
        first: Option<Event>,
        role_sent: bool,
        finished: bool,
    }
    let st = St {
        reply,
        rx,
        first: Some(first),
        role_sent: false,
        finished: false,
    };
    let chunks = futures_util::stream::unfold(st, |mut st| async move {
        if st.finished {
            return None;
        }
        let event = match st.first.take() {
            Some(e) => Some(e),
            None => st.rx.recv().await,
        };
        let role = st.reply.kind == Kind::Chat && !st.role_sent;
        st.role_sent = true;
        let text = match event {
            Some(Event::Delta(d)) => st.reply.chunk(Some(&d), None, role),
            Some(Event::Done(done)) => {
                st.finished = true;
                let mut out = String::new();
                if role {
                    out.push_str(&st.reply.chunk(None, None, true));
                }
                out.push_str(&st.reply.chunk(None, Some(done.finish), false));
                if st.reply.include_usage {
                    let mut m = st.reply.envelope(true, json!([]));
                    m.insert("usage".into(), usage(&done));
                    out.push_str(&sse(&Value::Object(m)));
                }
                out.push_str("data: [DONE]\n\n");
                out
            }
            Some(Event::Error(e)) => {
                st.finished = true;
                format!("{}data: [DONE]\n\n", sse(&e.body()))
            }
            None => {
                st.finished = true;
                let e = ApiError::internal("generation ended without a result");
                format!("{}data: [DONE]\n\n", sse(&e.body()))
            }
        };
        Some((Ok::<_, Infallible>(Bytes::from(text)), st))
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(chunks))
        .unwrap_or_else(|_| ApiError::internal("building the response").into_response())
}

fn new_id(kind: Kind) -> String {
    let prefix = match kind {
        Kind::Chat => "chatcmpl",
        Kind::Completion => "cmpl",
    };
    unique_id(prefix)
}

/// `{prefix}-{time}{counter}`: unique within this server's life.
pub(crate) fn unique_id(prefix: &str) -> String {
    format!("{prefix}-{:x}{:06}", unix_now(), next_number())
}

fn next_number() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
