//! `kasoku serve`: an OpenAI-compatible HTTP server (axum/tokio) over one loaded model, with
//! a FIFO queue of requests served by `--parallel` sessions and a shared prefix cache; and
//! `kasoku bench-client`, which measures any OpenAI-compatible endpoint.

pub mod bench_client;
mod error;
mod http_client;
mod metrics;
mod output;
mod pool;
mod request;
mod routes;

use std::sync::{Arc, Mutex};

use anyhow::Context;
use clap::Args;
use kasoku::engine::{self, PrefixCache};

use pool::{Engine, Pool};
use routes::App;

/// Default context when the model's own is larger: bounds each session's KV cache.
const DEFAULT_CTX: usize = 8192;

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

pub fn serve(args: &ServeArgs) -> anyhow::Result<()> {
    let model = crate::run::load(&args.model, args.threads, false)?;
    let ctx = args
        .ctx_size
        .unwrap_or(model.model.config.max_context.clamp(1, DEFAULT_CTX));
    anyhow::ensure!(ctx >= 2, "--ctx-size must be at least 2");
    let stem = model
        .path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into());
    let id = args.alias.clone().unwrap_or_else(|| stem.clone());
    let mut names = vec![id.clone(), stem, args.model.clone()];
    if let Some(f) = model.path.file_name() {
        names.push(f.to_string_lossy().into_owned());
    }
    names.push(model.path.display().to_string());
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let parallel = args.parallel.unwrap_or((cores / 4).max(1)).max(1);
    let cache = (!args.no_prefix_cache).then(|| {
        Mutex::new(PrefixCache::new(
            args.prefix_cache_mb << 20,
            args.prefix_cache_block,
        ))
    });
    let draft = args.spec.load_draft(false)?;
    // Build one speculator now so that bad speculation options fail at startup.
    args.spec.speculator(&model.model, draft.clone(), ctx)?;
    let engine = Arc::new(Engine {
        spec: args.spec.clone(),
        draft,
        stop_tokens: engine::stop_tokens(&model),
        think: output::ThinkTokens::of(&model.tokenizer),
        id: id.clone(),
        ctx,
        cache,
        metrics: Default::default(),
        model,
    });
    let pool = Pool::start(Arc::clone(&engine), parallel, args.queue_size);
    let app = Arc::new(App {
        engine,
        pool,
        api_key: args.api_key.clone(),
        max_body: args.max_body_bytes,
        names,
        created: routes::unix_now(),
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let addr = format!("{}:{}", args.host, args.port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .with_context(|| format!("binding {addr}"))?;
        let local = listener.local_addr()?;
        eprintln!(
            "kasoku serve: '{id}' on http://{local} ({parallel} session(s), context {ctx}, prefix cache {})",
            if args.no_prefix_cache { "off".to_string() } else { format!("{} MiB", args.prefix_cache_mb) }
        );
        axum::serve(listener, routes::router(app))
            .await
            .context("serving")
    })
}
