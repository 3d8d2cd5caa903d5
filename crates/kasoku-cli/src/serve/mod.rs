//! `kasoku serve`: an OpenAI-compatible HTTP server (axum/tokio) over one loaded model, with
//! a FIFO queue of requests served by `--parallel` sessions and a shared prefix cache; and
//! `kasoku bench-client`, which measures any OpenAI-compatible endpoint.

pub mod bench_client;

use clap::Args;

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
}

pub fn serve(_args: &ServeArgs) -> anyhow::Result<()> {
    anyhow::bail!("kasoku serve: not implemented yet")
}
