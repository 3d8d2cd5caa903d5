//! kasoku-server: an OpenAI-compatible HTTP server over one loaded kasoku model.
//!
//! `/v1/chat/completions` and `/v1/completions` (JSON or Server-Sent Events), `/v1/models`,
//! `/health` and `/metrics`, with a FIFO queue of requests served by a fixed number of
//! sessions and a prefix cache shared between them. `kasoku serve` is a thin wrapper over
//! this crate; another program can serve a model the same way:
//!
//! ```no_run
//! use kasoku::engine::LoadedModel;
//! use kasoku_server::{Server, ServerConfig};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let model = LoadedModel::load("model.gguf")?;
//! let server = Server::new(model, ServerConfig::default())?;
//! let listener = std::net::TcpListener::bind("127.0.0.1:8000")?;
//! println!("serving '{}' on http://{}", server.model_id(), listener.local_addr()?);
//! server.serve(listener)?; // until the shutdown handle (or, if configured, a signal) stops it
//! # Ok(())
//! # }
//! ```
//!
//! Layout: [`config`] (what a server is told), `connections` (the accept loop: connection cap,
//! header deadline, graceful stop), `access` (Host, Origin and body-type checks before any
//! route), `routes` (HTTP handlers, body limits), `request` (request bodies checked field by
//! field against one allow-list), `prompt` (prompts bounded in bytes; control-token spellings
//! in client text kept as text), `pool` (the queue and its session threads), `target` (where
//! the sessions run: CPU sessions over a shared `Model`, or one session on a device through
//! `kasoku::engine::DeviceModel`, see [`Server::on_device`]), `output` (tokens to answer text),
//! `metrics` and `error` (OpenAI-shaped errors).

#![warn(missing_docs)]

mod access;
mod answer;
mod anthropic;
pub mod config;
mod connections;
mod error;
mod logprobs;
mod metrics;
mod output;
mod pool;
mod prepare;
mod prompt;
mod request;
mod responses;
mod routes;
mod sse;
mod target;
mod tool_calls;
mod tools;

use std::sync::{Arc, Mutex};

use kasoku::engine::{self, EngineError, LoadedModel, PrefixCache};
use kasoku::model::footprint;
use tokio::sync::watch;

pub use config::{PrefixCacheConfig, ServerConfig, Speculation};
pub use target::{DeviceDrafter, DeviceServed};

use pool::{Engine, Pool};
use routes::App;
use target::{Target, TextSide};

/// The route a body goes to in [`Server::prepare_request`] (fuzzing and tests only).
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestApi {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completion,
    /// Anthropic's `/v1/messages`.
    Messages,
    /// OpenAI's `/v1/responses`.
    Responses,
}

/// Why a server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// A configuration value cannot work (which one, and why).
    #[error("{0}")]
    Config(String),
    /// The speculative-decoding settings do not fit the model.
    #[error("speculative decoding: {0}")]
    Speculation(#[from] EngineError),
    /// A socket or runtime operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: &'static str,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

/// A server over one model, ready to serve on a listener.
pub struct Server {
    engine: Arc<Engine>,
    config: ServerConfig,
    context_note: Option<String>,
    shutdown: ShutdownHandle,
}

/// Stops a [`Server::serve`] call from any thread.
#[derive(Clone, Debug)]
pub struct ShutdownHandle {
    tx: Arc<watch::Sender<bool>>,
}

impl ShutdownHandle {
    fn new() -> ShutdownHandle {
        ShutdownHandle {
            tx: Arc::new(watch::channel(false).0),
        }
    }

    /// Asks the server to stop: it takes no new connections and returns from `serve`.
    pub fn shutdown(&self) {
        self.tx.send_replace(true);
    }

    /// Resolves once [`ShutdownHandle::shutdown`] was called.
    async fn wait(&self) {
        let mut rx = self.tx.subscribe();
        let _ = rx.wait_for(|&stop| stop).await;
    }
}

impl Server {
    /// Checks `config` against `model` and builds the server (no thread or socket yet).
    pub fn new(model: LoadedModel, config: ServerConfig) -> Result<Server, ServerError> {
        let draft = config.speculation.draft.as_ref();
        let plan = engine::ContextRequest {
            requested: config.context,
            model_max: model.model.config.max_context,
            kv_bytes_per_token: model.model.kv_bytes_per_token()
                + draft.map_or(0, |d| d.kv_bytes_per_token())
                + (config.speculation.dflash.as_ref()).map_or(0, |d| d.context_bytes_per_token()),
            kv_type: model.model.kv_type(),
            sessions: config.sessions(),
            other_bytes: config.prefix_cache.map_or(0, |c| c.budget_bytes as u64),
            // Loaded: MemAvailable already excludes the weights.
            weight_bytes: 0,
            scratch_bytes: config.sessions() as u64
                * (footprint::scratch_bytes(&model.model.config)
                    + draft.map_or(0, |d| footprint::scratch_bytes(&d.config))),
            available: config.memory_available.or_else(engine::available_memory),
        }
        .plan()
        .map_err(|e| ServerError::Config(e.0))?;
        // Build one speculator now so that bad speculation settings fail at startup.
        config.speculation.speculator(&model.model, plan.tokens)?;
        let text = TextSide {
            vocab: model.model.config.vocab,
            path: model.path,
            tokenizer: model.tokenizer,
            template: model.template,
            defaults: model.defaults,
        };
        let cache = config
            .prefix_cache
            .map(|c| PrefixCache::new(c.budget_bytes, c.block_tokens.max(1)));
        Server::build(
            text,
            Target::Cpu(model.model),
            config,
            plan.tokens,
            plan.note,
            cache,
        )
    }

    /// A server whose passes run on a device (a GPU): one session, so requests queue and run
    /// one at a time. The context is [`ServerConfig::context`], else the model's own up to
    /// `default_context`; its cache is allocated now, so one that does not fit fails here.
    /// With a prefix cache configured, each request reuses the prefix the device's state
    /// already holds (the shared cache of CPU states is not kept). Speculation must be prompt
    /// lookup (`ngram`, or `auto` without a draft), the device's own drafter
    /// ([`DeviceServed::drafter`], for `draft` and `auto`) or none; a draft for the CPU
    /// ([`Speculation::draft`], `dflash`) is refused.
    pub fn on_device(
        model: DeviceServed,
        config: ServerConfig,
        default_context: usize,
    ) -> Result<Server, ServerError> {
        let spec = &config.speculation;
        let draft_given = spec.draft.is_some() || spec.dflash.is_some();
        if model.drafter.is_none() {
            kasoku::engine::device_speculator(spec.kind, draft_given, spec.policy)?;
        } else if draft_given {
            return Err(ServerError::Config(
                "a device server drafts with the device's own drafter, not a CPU draft".into(),
            ));
        }
        if let Some(n) = config.sessions.filter(|&n| n > 1) {
            return Err(ServerError::Config(format!(
                "{} serves one request at a time ({n} sessions asked for); the others wait in the queue",
                model.model.device()
            )));
        }
        let config = ServerConfig {
            sessions: Some(1),
            ..config
        };
        let ctx = config
            .context
            .unwrap_or_else(|| model.model.max_context().clamp(1, default_context.max(2)));
        if ctx >= 2 {
            // The state is made again in the session thread; this one only proves it fits.
            model.model.new_state(ctx).map_err(|e| {
                ServerError::Config(format!(
                    "a context of {ctx} tokens on {}: {e}",
                    model.model.device()
                ))
            })?;
            // So is the drafter's (a draft model's cache of the same context).
            let spec = &config.speculation;
            target::device_session_speculator(
                spec.kind,
                model.drafter.as_ref(),
                false,
                spec.policy,
                ctx,
            )
            .map_err(|e| {
                ServerError::Config(format!(
                    "the drafter for a context of {ctx} tokens on {}: {e}",
                    model.model.device()
                ))
            })?;
        }
        let text = TextSide {
            vocab: model.model.vocab(),
            path: model.path,
            tokenizer: model.tokenizer,
            template: model.template,
            defaults: model.defaults,
        };
        // Present (empty) when prefixes may be reused: the device session keeps its own.
        let cache = config
            .prefix_cache
            .map(|c| PrefixCache::new(0, c.block_tokens.max(1)));
        let target = Target::Device(model.model, model.drafter);
        Server::build(text, target, config, ctx, None, cache)
    }

    /// The checks and the engine every target shares.
    fn build(
        model: TextSide,
        target: Target,
        config: ServerConfig,
        ctx: usize,
        context_note: Option<String>,
        cache: Option<PrefixCache>,
    ) -> Result<Server, ServerError> {
        if ctx < 2 {
            return Err(ServerError::Config(format!(
                "the context must hold at least 2 tokens (got {ctx})"
            )));
        }
        if config.body_memory_bytes < config.max_body_bytes {
            return Err(ServerError::Config(format!(
                "the body memory ({} bytes) must hold at least one largest body ({} bytes)",
                config.body_memory_bytes, config.max_body_bytes
            )));
        }
        let stem = model
            .path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into());
        let id = config.model_id.clone().unwrap_or_else(|| stem.clone());
        let mut names = vec![id.clone(), stem];
        names.extend(config.aliases.iter().cloned());
        if let Some(f) = model.path.file_name() {
            names.push(f.to_string_lossy().into_owned());
        }
        names.push(model.path.display().to_string());
        let engine = Arc::new(Engine {
            speculation: config.speculation.clone(),
            stop_tokens: engine::end_tokens(&model.tokenizer, model.defaults.as_ref()),
            think: output::ThinkTokens::of(&model.tokenizer),
            control: prompt::ControlText::of(&model.tokenizer),
            names,
            prompt_bytes_per_token: config.prompt_bytes_per_token.max(1),
            id,
            ctx,
            cache: cache.map(Mutex::new),
            metrics: Default::default(),
            grammars: Default::default(),
            model,
            target,
        });
        Ok(Server {
            engine,
            config,
            context_note,
            shutdown: ShutdownHandle::new(),
        })
    }

    /// Where the sessions run: `cpu` or the device's name (`cuda:0`).
    pub fn device(&self) -> String {
        self.engine.target.device()
    }

    /// Why the context is shorter than the model's own, when memory made it so (to tell the
    /// user).
    pub fn context_note(&self) -> Option<&str> {
        self.context_note.as_deref()
    }

    /// The name `/v1/models` reports (and requests' `model` may use).
    pub fn model_id(&self) -> &str {
        &self.engine.id
    }

    /// Tokens each session holds, prompt and answer together.
    pub fn context(&self) -> usize {
        self.engine.ctx
    }

    /// Sessions generating at once.
    pub fn sessions(&self) -> usize {
        self.config.sessions()
    }

    /// What a request body to `api`'s route becomes before any generation: its prompt tokens,
    /// or the error answer's status and body (in OpenAI's shape, whatever the API). For
    /// fuzzing the request path without sockets or sessions; not a stable interface.
    #[doc(hidden)]
    pub fn prepare_request(&self, api: RequestApi, body: &[u8]) -> Result<usize, (u16, String)> {
        let kind = match api {
            RequestApi::Completion => prepare::Kind::Completion,
            _ => prepare::Kind::Chat,
        };
        // Anthropic's and the Responses bodies become chat bodies first, as their routes do.
        let convert: fn(_) -> _ = match api {
            RequestApi::Messages => anthropic::to_chat,
            RequestApi::Responses => responses::to_chat,
            RequestApi::Chat | RequestApi::Completion => Ok,
        };
        let prepared = request::parse_object(body)
            .and_then(convert)
            .and_then(|object| prepare::prepare_object(&self.engine, &object, kind));
        prepared
            .map(|p| p.prompt.len())
            .map_err(|e| (e.status.as_u16(), e.body().to_string()))
    }

    /// A handle that stops [`Server::serve`].
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        self.shutdown.clone()
    }

    /// Serves on `listener` until the shutdown handle fires (or, with
    /// [`ServerConfig::handle_signals`], SIGINT or SIGTERM arrives). Blocks the calling
    /// thread; starts the session threads and an async runtime of its own, and stops them
    /// before returning.
    ///
    /// Stopping is graceful: no new connections or requests; requests still waiting for a
    /// session are answered 503; running generations get [`ServerConfig::shutdown_grace`] to
    /// finish, then end at their next token with `finish_reason: "length"` (a stream gets its
    /// final chunk and `[DONE]`); `serve` returns once every answer is complete.
    pub fn serve(self, listener: std::net::TcpListener) -> Result<(), ServerError> {
        let io = |context| move |source| ServerError::Io { context, source };
        let bound = listener
            .local_addr()
            .map_err(io("reading the listener's address"))?;
        listener
            .set_nonblocking(true)
            .map_err(io("configuring the listener"))?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("kasoku-http")
            .enable_all()
            .build()
            .map_err(io("starting the async runtime"))?;
        let config = self.config;
        let pool = Pool::start(
            Arc::clone(&self.engine),
            config.sessions(),
            config.queue_size,
        );
        let body_kib = config.body_memory_bytes.div_ceil(1024).max(1);
        let app = Arc::new(App {
            engine: self.engine,
            pool,
            api_key: config.api_key.clone(),
            max_body: config.max_body_bytes,
            body_timeout: config.body_timeout,
            body_memory: Arc::new(tokio::sync::Semaphore::new(
                body_kib.min(tokio::sync::Semaphore::MAX_PERMITS),
            )),
            access: access::Access::new(bound, &config.allowed_hosts, &config.cors_origins),
            connections: connections::Connections::new(config.max_connections),
            created: routes::unix_now(),
        });
        let shutdown = self.shutdown.clone();
        let signals = config.handle_signals;
        let limits = connections::Limits {
            header_timeout: config.header_timeout,
        };
        let result = runtime.block_on(async move {
            let listener =
                tokio::net::TcpListener::from_std(listener).map_err(io("using the listener"))?;
            let stop = async move {
                if signals {
                    tokio::select! {
                        _ = shutdown.wait() => {}
                        _ = signal() => {}
                    }
                } else {
                    shutdown.wait().await
                }
            };
            let open = &app.connections;
            let router = routes::router(Arc::clone(&app));
            connections::accept(listener, router, limits, open, stop).await;
            app.pool.stop_taking();
            if !open.finish(config.shutdown_grace).await {
                app.pool.cut();
                // Each generation ends at its next token; its answer then completes.
                open.finish(std::time::Duration::from_secs(30)).await;
            }
            app.pool.close();
            Ok(())
        });
        runtime.shutdown_timeout(std::time::Duration::from_secs(1));
        result
    }
}

/// SIGINT or (on Unix) SIGTERM.
async fn signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}
