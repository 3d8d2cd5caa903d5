//! `kasoku bench-client`: sends one deterministic streaming chat request to each
//! OpenAI-compatible endpoint (after a discarded warm-up) and prints a comparison table.

use clap::Args;

/// Arguments of `kasoku bench-client`.
#[derive(Args, Debug, Clone)]
pub struct BenchClientArgs {
    /// Base URLs, e.g. http://127.0.0.1:8000 (repeatable or comma-separated).
    #[arg(long = "endpoint", value_delimiter = ',', required = true)]
    pub endpoints: Vec<String>,
}

pub fn bench_client(_args: &BenchClientArgs) -> anyhow::Result<()> {
    anyhow::bail!("kasoku bench-client: not implemented yet")
}
