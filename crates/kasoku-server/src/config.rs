//! What a server is told: sessions and queue, context, prefix cache, API key, who may call it
//! (Host and Origin), connection and request limits, speculative decoding.
//! `ServerConfig::default()` is what `kasoku serve` uses without flags.

use std::sync::Arc;
use std::time::Duration;

use kasoku::engine::{build_speculator_from, DraftSource, EngineError, SpecKind, Speculator};
use kasoku::model::Model;
use kasoku::spec::PolicyConfig;

/// The default bound on prompt bytes per context token (the engine's; see there why 16).
pub use kasoku::engine::PROMPT_BYTES_PER_TOKEN;

/// The largest request head (request line and headers) the server reads; more is refused.
pub const MAX_HEADER_BYTES: usize = 64 << 10;

/// How a [`crate::Server`] runs. Every field has a default (see [`ServerConfig::default`]).
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Tokens per session, prompt and answer together (`None`: the model's own context,
    /// shortened only when memory cannot hold every session's; see `kasoku::engine::context`).
    /// A context that cannot fit in memory is refused by [`crate::Server::new`].
    pub context: Option<usize>,
    /// Memory the KV caches and the prefix cache may plan for, in bytes (`None`: what the
    /// system reports available at startup, MemAvailable; nothing is checked where it reports
    /// nothing).
    pub memory_available: Option<u64>,
    /// Sessions generating at once (`None`: one per 4 cores, at least 1). Each holds its own
    /// KV cache of `context` tokens.
    pub sessions: Option<usize>,
    /// Requests that may wait beyond the running ones; more get 503 (default 64).
    pub queue_size: usize,
    /// The prefix cache shared by the sessions (`None`: every request computes its whole
    /// prompt).
    pub prefix_cache: Option<PrefixCacheConfig>,
    /// When set, every `/v1` route requires `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
    /// Largest request body in bytes; larger ones get 413 (default 4 MiB).
    pub max_body_bytes: usize,
    /// Connections open at once (default 256); one more is answered 503 and closed. A
    /// connection costs a socket and at most [`MAX_HEADER_BYTES`] of buffer while idle.
    pub max_connections: usize,
    /// Time a client has to send a request's headers, and the longest a kept-alive
    /// connection may idle between requests (default 10 s). A client dripping bytes is cut off
    /// when it runs out, however steady the drip.
    pub header_timeout: Duration,
    /// Time a client has to send a request's whole body once its headers are in (default
    /// 30 s: 4 MiB at 140 kB/s).
    pub body_timeout: Duration,
    /// Memory all request bodies being received may take together (default 64 MiB); a body
    /// that would pass it is refused with 503 before it is read.
    pub body_memory_bytes: usize,
    /// Prompt bytes per context token beyond which a prompt is refused before tokenization
    /// (default [`PROMPT_BYTES_PER_TOKEN`]).
    pub prompt_bytes_per_token: usize,
    /// Host names (`name` for any port, or `name:port`) a request's `Host` may carry besides
    /// the server's own (`localhost`, loopback addresses and the bound address, at its port).
    /// Anything else is refused (403), so that a web page cannot reach the server through a
    /// DNS name it controls (DNS rebinding).
    pub allowed_hosts: Vec<String>,
    /// Browser origins (`http://host:port`, or `*` for any) allowed to call the server. A
    /// request carrying any other `Origin` (every cross-site request a browser makes) is
    /// refused (403), so that no web page can drive the server; clients that are not browsers
    /// send no `Origin` and are not affected.
    pub cors_origins: Vec<String>,
    /// How long running generations may go on after shutdown was asked for (default 5 s);
    /// then each ends at its next token with `finish_reason: "length"` (streams get their
    /// final chunk and `[DONE]`). Waiting requests are answered 503 at once.
    pub shutdown_grace: Duration,
    /// The name `/v1/models` reports (`None`: the model file's stem).
    pub model_id: Option<String>,
    /// More names a request's `model` may use (besides the id, the file's stem, name and path).
    pub aliases: Vec<String>,
    /// Speculative decoding for every session.
    pub speculation: Speculation,
    /// Stop serving on SIGINT or SIGTERM (default false: a library should not take over the
    /// process's signals; `kasoku serve` turns it on).
    pub handle_signals: bool,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            context: None,
            memory_available: None,
            sessions: None,
            queue_size: 64,
            prefix_cache: Some(PrefixCacheConfig::default()),
            api_key: None,
            max_body_bytes: 4 << 20,
            max_connections: 256,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            body_memory_bytes: 64 << 20,
            prompt_bytes_per_token: PROMPT_BYTES_PER_TOKEN,
            allowed_hosts: Vec::new(),
            cors_origins: Vec::new(),
            shutdown_grace: Duration::from_secs(5),
            model_id: None,
            aliases: Vec::new(),
            speculation: Speculation::default(),
            handle_signals: false,
        }
    }
}

impl ServerConfig {
    /// Sessions generating at once.
    pub fn sessions(&self) -> usize {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        self.sessions.unwrap_or(cores / 4).max(1)
    }
}

/// The prefix cache's limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefixCacheConfig {
    /// Memory the cached prefixes may hold, in bytes (default 1 GiB).
    pub budget_bytes: usize,
    /// Prompt tokens between snapshots of recurrent (hybrid) models' state.
    pub block_tokens: usize,
}

impl Default for PrefixCacheConfig {
    fn default() -> Self {
        PrefixCacheConfig {
            budget_bytes: 1 << 30,
            block_tokens: kasoku::engine::prefix_cache::DEFAULT_BLOCK,
        }
    }
}

/// Speculative decoding settings, applied to every session (each gets its own drafter state
/// over the shared weights).
#[derive(Clone)]
pub struct Speculation {
    /// Which drafter (default: [`SpecKind::Auto`]).
    pub kind: SpecKind,
    /// The draft model for [`SpecKind::Draft`] (and `Auto`), shared by every session.
    pub draft: Option<Arc<Model>>,
    /// A DFlash drafter for [`SpecKind::DFlash`] (and `Auto`, before `draft`), loaded for
    /// the served model and shared by every session.
    pub dflash: Option<Arc<kasoku::model::DFlash>>,
    /// Tree budget and depth.
    pub policy: PolicyConfig,
}

impl Default for Speculation {
    fn default() -> Self {
        Speculation {
            kind: SpecKind::Auto,
            draft: None,
            dflash: None,
            policy: PolicyConfig::default(),
        }
    }
}

impl std::fmt::Debug for Speculation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Speculation")
            .field("kind", &self.kind)
            .field("draft", &self.draft.as_ref().map(|_| "a draft model"))
            .field("dflash", &self.dflash.as_ref().map(|_| "a DFlash drafter"))
            .field("policy", &self.policy)
            .finish()
    }
}

impl Speculation {
    /// A session's speculator on `target` (`None`: plain decoding).
    pub(crate) fn speculator(
        &self,
        target: &Arc<Model>,
        ctx: usize,
    ) -> Result<Option<Speculator>, EngineError> {
        let draft = match (&self.dflash, &self.draft) {
            (Some(net), _) => Some(DraftSource::DFlash(net.clone())),
            (None, Some(d)) => Some(DraftSource::Model(d.clone())),
            (None, None) => None,
        };
        build_speculator_from(self.kind, target, draft, ctx, self.policy)
    }
}
