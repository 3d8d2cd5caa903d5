//! What a server is told: sessions and queue, context, prefix cache, API key, request limits,
//! speculative decoding. `ServerConfig::default()` is what `kasoku serve` uses without flags.

use std::sync::Arc;

use kasoku::engine::{build_speculator, EngineError, SpecKind, Speculator};
use kasoku::model::Model;
use kasoku::spec::PolicyConfig;

/// The context a session gets when the configuration names none and the model's own is larger:
/// bounds each session's KV cache.
pub const DEFAULT_CONTEXT: usize = 8192;

/// How a [`crate::Server`] runs. Every field has a default (see [`ServerConfig::default`]).
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Tokens per session, prompt and answer together (`None`: the model's context, capped at
    /// [`DEFAULT_CONTEXT`]).
    pub context: Option<usize>,
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
            sessions: None,
            queue_size: 64,
            prefix_cache: Some(PrefixCacheConfig::default()),
            api_key: None,
            max_body_bytes: 4 << 20,
            model_id: None,
            aliases: Vec::new(),
            speculation: Speculation::default(),
            handle_signals: false,
        }
    }
}

impl ServerConfig {
    /// The context of each session for a model whose own context is `model_max`.
    pub fn context_for(&self, model_max: usize) -> usize {
        self.context
            .unwrap_or_else(|| model_max.clamp(1, DEFAULT_CONTEXT))
    }

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
    /// Tree budget and depth.
    pub policy: PolicyConfig,
}

impl Default for Speculation {
    fn default() -> Self {
        Speculation {
            kind: SpecKind::Auto,
            draft: None,
            policy: PolicyConfig::default(),
        }
    }
}

impl std::fmt::Debug for Speculation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Speculation")
            .field("kind", &self.kind)
            .field("draft", &self.draft.as_ref().map(|_| "a draft model"))
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
        build_speculator(self.kind, target, self.draft.clone(), ctx, self.policy)
    }
}
