//! `kasoku bench-client`: sends one deterministic streaming chat request (fixed prompt,
//! temperature 0, thinking off, fixed length, usage included) to each OpenAI-compatible
//! endpoint, discards a warm-up run, and prints a comparison table of what a client sees:
//! time to first token, end-to-end time, decode speed, and tokens per pass where the server
//! reports `spec_verify_ct`.

mod http_client;

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::{json, Value};

use http_client::Url;

const DEFAULT_PROMPT: &str = "Write a short story about a lighthouse keeper who finds a message in a bottle. Describe the sea, the weather and the keeper's thoughts in detail.";

/// Arguments of `kasoku bench-client`.
#[derive(Args, Debug, Clone)]
pub struct BenchClientArgs {
    /// Base URLs, e.g. http://127.0.0.1:8000, optionally named: kasoku=http://127.0.0.1:8000
    /// (repeatable or comma-separated).
    #[arg(long = "endpoint", value_delimiter = ',', required = true)]
    pub endpoints: Vec<String>,
    /// Model name to request (default: the first one each endpoint lists at /v1/models).
    #[arg(long)]
    pub model: Option<String>,
    #[arg(long, default_value = DEFAULT_PROMPT)]
    pub prompt: String,
    #[arg(long, default_value_t = 128)]
    pub max_tokens: usize,
    /// Measured runs per endpoint (after one discarded warm-up).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    #[arg(long)]
    pub api_key: Option<String>,
    /// Let the model stop at its end-of-text token (default: ask for `ignore_eos` so every
    /// endpoint generates exactly --max-tokens).
    #[arg(long)]
    pub allow_eos: bool,
    /// Seconds to wait for any response data.
    #[arg(long, default_value_t = 300)]
    pub timeout: u64,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
}

/// What one run measured.
#[derive(Clone, Debug, Default)]
struct Run {
    ttft: f64,
    e2e: f64,
    tokens: usize,
    prompt_tokens: usize,
    cached_tokens: Option<usize>,
    verify: Option<usize>,
}

impl Run {
    fn decode_tps(&self) -> f64 {
        let t = self.e2e - self.ttft;
        if self.tokens > 1 && t > 0.0 {
            (self.tokens - 1) as f64 / t
        } else {
            0.0
        }
    }

    /// Tokens after the first per target pass, when the server reports its passes.
    fn tokens_per_pass(&self) -> Option<f64> {
        self.verify
            .filter(|&v| v > 0)
            .map(|v| self.tokens.saturating_sub(1) as f64 / v as f64)
    }
}

pub fn bench_client(args: &BenchClientArgs) -> Result<()> {
    let mut rows = Vec::new();
    for spec in &args.endpoints {
        let (name, url) = match spec.split_once('=') {
            Some((n, u)) => (n.to_string(), u.to_string()),
            None => (spec.clone(), spec.clone()),
        };
        let parsed = Url::parse(&url)?;
        let model = match &args.model {
            Some(m) => m.clone(),
            None => first_model(&parsed, args)?,
        };
        eprintln!("{name}: model '{model}', 1 warm-up + {} runs", args.runs);
        one_run(&parsed, &model, args).with_context(|| format!("{name}: warm-up"))?;
        let mut runs = Vec::new();
        for i in 0..args.runs.max(1) {
            let r = one_run(&parsed, &model, args).with_context(|| format!("{name}: run {i}"))?;
            eprintln!(
                "  run {i}: ttft {:.1} ms, e2e {:.3} s, {} tokens, {:.1} t/s",
                r.ttft * 1e3,
                r.e2e,
                r.tokens,
                r.decode_tps()
            );
            runs.push(r);
        }
        rows.push((name, model, runs));
    }
    print_table(&rows);
    if let Some(path) = &args.json {
        let out: Vec<Value> = rows
            .iter()
            .map(|(name, model, runs)| {
                json!({
                    "endpoint": name,
                    "model": model,
                    "runs": runs.iter().map(|r| json!({
                        "ttft_s": r.ttft,
                        "e2e_s": r.e2e,
                        "completion_tokens": r.tokens,
                        "prompt_tokens": r.prompt_tokens,
                        "cached_tokens": r.cached_tokens,
                        "decode_tokens_per_s": r.decode_tps(),
                        "spec_verify_ct": r.verify,
                        "tokens_per_pass": r.tokens_per_pass(),
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        std::fs::write(path, serde_json::to_string_pretty(&out)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

fn timeout(args: &BenchClientArgs) -> Duration {
    Duration::from_secs(args.timeout.max(1))
}

fn first_model(url: &Url, args: &BenchClientArgs) -> Result<String> {
    let r = http_client::request(
        url,
        "GET",
        "/v1/models",
        None,
        args.api_key.as_deref(),
        timeout(args),
    )?;
    let status = r.status;
    let text = r.text()?;
    if status != 200 {
        bail!("GET /v1/models: HTTP {status}: {text}");
    }
    let v: Value = serde_json::from_str(&text).context("GET /v1/models: not JSON")?;
    v["data"][0]["id"]
        .as_str()
        .map(str::to_string)
        .context("GET /v1/models lists no model")
}

fn one_run(url: &Url, model: &str, args: &BenchClientArgs) -> Result<Run> {
    let body = json!({
        "model": model,
        "messages": [{"role": "user", "content": args.prompt}],
        "temperature": 0,
        "seed": 0,
        "max_tokens": args.max_tokens,
        "stream": true,
        "stream_options": {"include_usage": true},
        "chat_template_kwargs": {"enable_thinking": false},
        "ignore_eos": !args.allow_eos,
        // llama-server: reuse nothing between runs, like kasoku --no-prefix-cache.
        "cache_prompt": false,
    })
    .to_string();
    let start = Instant::now();
    let response = http_client::request(
        url,
        "POST",
        "/v1/chat/completions",
        Some(&body),
        args.api_key.as_deref(),
        timeout(args),
    )?;
    if response.status != 200 {
        let status = response.status;
        bail!("HTTP {status}: {}", response.text().unwrap_or_default());
    }
    let mut run = Run::default();
    let mut first = None;
    let mut chunks = 0;
    let mut reader = response.body;
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            break;
        }
        let Some(data) = line.trim_end().strip_prefix("data:") else {
            continue;
        };
        let data = data.trim();
        if data == "[DONE]" {
            break;
        }
        let v: Value = serde_json::from_str(data).with_context(|| format!("bad chunk {data}"))?;
        if v.get("error").is_some() {
            bail!("error in stream: {data}");
        }
        let delta = &v["choices"][0]["delta"];
        let has_text = ["content", "reasoning_content"]
            .iter()
            .any(|k| delta[k].as_str().is_some_and(|s| !s.is_empty()));
        if has_text {
            chunks += 1;
            first.get_or_insert_with(|| start.elapsed());
        }
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            run.tokens = u["completion_tokens"].as_u64().unwrap_or(0) as usize;
            run.prompt_tokens = u["prompt_tokens"].as_u64().unwrap_or(0) as usize;
            run.cached_tokens = u["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .map(|n| n as usize);
            run.verify = u["spec_verify_ct"].as_u64().map(|n| n as usize);
        }
    }
    run.e2e = start.elapsed().as_secs_f64();
    run.ttft = first.map_or(run.e2e, |d| d.as_secs_f64());
    if run.tokens == 0 {
        run.tokens = chunks;
    }
    Ok(run)
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn print_table(rows: &[(String, String, Vec<Run>)]) {
    println!(
        "\n| endpoint | model | prompt tok | gen tok | TTFT ms | e2e s | decode t/s | tokens/pass |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    for (name, model, runs) in rows {
        let m = |f: fn(&Run) -> f64| median(runs.iter().map(f).collect());
        let tpp = runs
            .iter()
            .map(Run::tokens_per_pass)
            .collect::<Option<Vec<_>>>()
            .map_or("n/a".to_string(), |v| format!("{:.2}", median(v)));
        let last = runs.last().cloned().unwrap_or_default();
        println!(
            "| {name} | {model} | {} | {} | {:.1} | {:.3} | {:.1} | {tpp} |",
            last.prompt_tokens,
            last.tokens,
            m(|r| r.ttft) * 1e3,
            m(|r| r.e2e),
            m(Run::decode_tps),
        );
    }
    println!("(medians of the measured runs; decode t/s = (tokens - 1) / (e2e - TTFT), seen by the client)");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_side_rates() {
        let r = Run {
            ttft: 0.5,
            e2e: 2.5,
            tokens: 101,
            verify: Some(50),
            ..Default::default()
        };
        assert_eq!(r.decode_tps(), 50.0);
        assert_eq!(r.tokens_per_pass(), Some(2.0));
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
    }
}
