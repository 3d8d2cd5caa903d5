//! `kasoku serve`: its flags, turned into a `kasoku_server::ServerConfig`; the server itself
//! (routes, queue, sessions) is the `kasoku-server` crate.

use anyhow::Context;
use clap::Args;
use kasoku::engine;
use kasoku_server::{PrefixCacheConfig, Server, ServerConfig, Speculation};

/// Arguments of `kasoku serve`.
#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// GGUF file, Hugging Face directory, or a known model name.
    #[arg(long)]
    pub model: String,
    /// Address to bind (loopback unless told otherwise).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Turn the prefix cache off (every request recomputes its whole prompt).
    #[arg(long)]
    pub no_prefix_cache: bool,
    /// Prefix cache memory budget in MiB.
    #[arg(long, default_value_t = 1024)]
    pub prefix_cache_mb: usize,
    /// Prompt tokens between prefix cache snapshots of recurrent (hybrid) models.
    #[arg(long, default_value_t = engine::prefix_cache::DEFAULT_BLOCK)]
    pub prefix_cache_block: usize,
    /// Require `Authorization: Bearer KEY` on every /v1 route.
    #[arg(long)]
    pub api_key: Option<String>,
    /// Sessions generating at once (default: 1 per 4 cores, at least 1).
    #[arg(long)]
    pub parallel: Option<usize>,
    /// Requests waiting beyond the running ones before new ones get 503.
    #[arg(long, default_value_t = 64)]
    pub queue_size: usize,
    /// Context length per session (default: the model's, capped at 8192).
    #[arg(long)]
    pub ctx_size: Option<usize>,
    /// Compute threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Largest request body in bytes (413 beyond).
    #[arg(long, default_value_t = 4 << 20)]
    pub max_body_bytes: usize,
    /// Name reported by /v1/models (default: the model file's stem).
    #[arg(long)]
    pub alias: Option<String>,
    /// Speculative decoding for every session (usage reports `spec_verify_ct`, the target
    /// passes, and `spec_accepted_tokens`).
    #[command(flatten)]
    pub spec: crate::spec_args::SpecArgs,
}

impl ServeArgs {
    /// The server configuration these flags describe (the draft model already loaded).
    fn config(&self, draft: Option<std::sync::Arc<kasoku::model::Model>>) -> ServerConfig {
        ServerConfig {
            context: self.ctx_size,
            sessions: self.parallel,
            queue_size: self.queue_size,
            prefix_cache: (!self.no_prefix_cache).then_some(PrefixCacheConfig {
                budget_bytes: self.prefix_cache_mb << 20,
                block_tokens: self.prefix_cache_block,
            }),
            api_key: self.api_key.clone(),
            max_body_bytes: self.max_body_bytes,
            model_id: self.alias.clone(),
            // The name given on the command line ("smollm2-135m") is one a client may use.
            aliases: vec![self.model.clone()],
            speculation: Speculation {
                kind: self.spec.spec,
                draft,
                policy: self.spec.policy(),
            },
            handle_signals: true,
        }
    }
}

pub fn serve(args: &ServeArgs) -> anyhow::Result<()> {
    let model = crate::run::load(&args.model, args.threads, false)?;
    let draft = args.spec.load_draft(false)?;
    let server = Server::new(model, args.config(draft))?;
    let addr = format!("{}:{}", args.host, args.port);
    let listener = std::net::TcpListener::bind(&addr).with_context(|| format!("binding {addr}"))?;
    eprintln!(
        "kasoku serve: '{}' on http://{} ({} session(s), context {}, prefix cache {})",
        server.model_id(),
        listener.local_addr()?,
        server.sessions(),
        server.context(),
        if args.no_prefix_cache {
            "off".to_string()
        } else {
            format!("{} MiB", args.prefix_cache_mb)
        }
    );
    server.serve(listener)?;
    Ok(())
}
