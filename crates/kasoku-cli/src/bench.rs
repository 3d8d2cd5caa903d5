//! `kasoku bench`: one measured engine run (prefill speed, decode speed, verify curve, weight
//! and cache bytes, peak memory) as JSON, for the side-by-side harness under bench/.
//!
//! What is measured, in one process, after an untimed warm-up:
//! - prefill: one `forward` over `--prompt-tokens` synthetic ids (as llama-bench's `pp`), from
//!   an empty state, logits of the last position only;
//! - decode: after a `--context`-token prompt (default `CONTEXT`) (untimed), `--gen-tokens` forward passes of one
//!   token each, the next token picked greedily (`argmax`) from the previous pass's logits;
//!   each step's time includes the forward pass and the argmax (llama-bench's `tg` with `-d`);
//! - verify curve: the time of one forward over k tokens appended after `--context` tokens,
//!   logits at every new position (what checking k draft tokens needs), median of
//!   `VERIFY_REPS`; between reps the state is truncated back (attention-only models) or
//!   recreated and re-prefilled untimed (recurrent layers cannot be rewound);
//! - bytes a decode step reads: the GGUF file's tensor bytes minus the embedding table (one
//!   row of it is read per token), plus the table again when the head is tied to it; and the
//!   cache (KV rows and recurrent state) at the decode's mean context length.
//!
//! The human table goes to stderr, the JSON to stdout (and to `--json FILE`).

mod gpu;
mod profile;
mod prompts;

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use kasoku::engine::sampler::argmax;
use kasoku::engine::stats::peak_rss_bytes;
use kasoku::format::GgufFile;
use kasoku::kernels::threads;
use kasoku::model::{LayerKind, Logits, Model, ModelConfig, ModelState};
use serde_json::{json, Value};

use crate::args::BenchArgs;

/// Tokens of context before the decode and verify measurements (llama-bench `-d`): the
/// default of `--context`.
pub const CONTEXT: usize = 16;
/// Timed repetitions of each verify size (the median is reported).
pub const VERIFY_REPS: usize = 7;
/// Decode steps timed by `--profile`.
pub const PROFILE_STEPS: usize = 32;

pub fn bench(args: &BenchArgs) -> Result<()> {
    if let Some(n) = args.threads {
        anyhow::ensure!(n > 0, "--threads must be at least 1");
        threads::set_threads(n);
    }
    anyhow::ensure!(args.prompt_tokens > 0, "--prompt-tokens must be at least 1");
    let verify_sizes = parse_verify_sizes(&args.verify)?;
    let path = crate::progress::resolve_model(&args.model, true)?;
    anyhow::ensure!(
        args.compare.is_empty() || args.prompts.is_some(),
        "--compare needs --prompts"
    );
    if let Some(prompts) = &args.prompts {
        return prompts::bench_prompts(args, &path, prompts);
    }
    // A GPU only when asked for: a benchmark's device is never a guess.
    if let Some(kasoku_cuda::Device::Cuda(i)) = args.device {
        kasoku_cuda::select_device(args.device)?;
        let result = gpu::bench(args, &path, i, &verify_sizes)?;
        let d = &result["decode"];
        eprintln!(
            "cuda:{i}: prefill {:.0} t/s, decode {:.1} t/s",
            result["prefill"]["tokens_per_second"]
                .as_f64()
                .unwrap_or(0.0),
            d["tokens_per_second"].as_f64().unwrap_or(0.0)
        );
        let text = serde_json::to_string_pretty(&result)?;
        if let Some(out) = &args.json {
            std::fs::write(out, format!("{text}\n"))
                .with_context(|| format!("writing {}", out.display()))?;
        }
        println!("{text}");
        return Ok(());
    }

    let t = Instant::now();
    let mut model = Model::load(&path).with_context(|| format!("loading {}", path.display()))?;
    model.set_kv_type(args.cache_type)?;
    let load_seconds = t.elapsed().as_secs_f64();
    let model: &Model = &model;
    let rss_after_load = current_rss_bytes();
    let cfg = &model.config;

    let max_verify = verify_sizes.iter().copied().max().unwrap_or(0);
    let ctx = args
        .prompt_tokens
        .max(args.context + args.gen_tokens + 1)
        .max(args.context + max_verify)
        + 1;
    let prompt = synthetic_tokens(args.prompt_tokens, cfg.vocab, 1);
    let context = synthetic_tokens(args.context, cfg.vocab, 2);

    warm_up(model, &prompt, ctx)?;

    // Prefill.
    let mut state = model.new_state(ctx);
    let t = Instant::now();
    model.forward(&mut state, &prompt, Logits::Last)?;
    let prefill = t.elapsed();
    drop(state);

    // Decode.
    let mut state = model.new_state(ctx);
    let logits = model.forward(&mut state, &context, Logits::Last)?;
    let mut next = argmax(&logits);
    let mut steps = Vec::with_capacity(args.gen_tokens);
    for _ in 0..args.gen_tokens {
        let t = Instant::now();
        let logits = model.forward(&mut state, &[next], Logits::Last)?;
        next = argmax(&logits);
        steps.push(t.elapsed());
    }
    drop(state);

    // Verify curve.
    let verify = verify_curve(model, &context, &verify_sizes, ctx)?;

    let profile = if args.profile {
        let steps = PROFILE_STEPS;
        let pctx = ctx.max(args.context + steps + 1);
        Some(profile::decode_profile(model, &context, pctx, steps)?)
    } else {
        None
    };

    let bytes = DecodeBytes::of(&path, cfg);
    let result = report(Report {
        args,
        path: &path,
        model,
        load_seconds,
        rss_after_load,
        prefill,
        steps: &steps,
        verify: &verify,
        bytes: &bytes,
        profile: profile.as_ref(),
    });
    print_table(&result);
    if let Some(p) = &profile {
        profile::print(p);
    }
    let text = serde_json::to_string_pretty(&result)?;
    if let Some(out) = &args.json {
        std::fs::write(out, format!("{text}\n"))
            .with_context(|| format!("writing {}", out.display()))?;
    }
    println!("{text}");
    Ok(())
}

/// Deterministic pseudo-random token ids in `1..vocab` (as llama-bench uses random ids).
pub fn synthetic_tokens(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (1 + x % (vocab.max(2) as u64 - 1)) as u32
        })
        .collect()
}

/// Untimed passes that start the thread pool and touch every weight once.
fn warm_up(model: &Model, prompt: &[u32], ctx: usize) -> Result<()> {
    let mut state = model.new_state(ctx);
    let n = prompt.len().min(32);
    let logits = model.forward(&mut state, &prompt[..n], Logits::Last)?;
    model.forward(&mut state, &[argmax(&logits)], Logits::Last)?;
    Ok(())
}

/// The forward-pass sizes of `--verify`: comma-separated counts of at least 1, or nothing
/// (an empty value or `none`) to skip the verify curve.
fn parse_verify_sizes(arg: &str) -> Result<Vec<usize>> {
    let arg = arg.trim();
    if arg.is_empty() || arg == "none" {
        return Ok(Vec::new());
    }
    arg.split(',')
        .map(|s| match s.trim().parse::<usize>() {
            Ok(k) if k > 0 => Ok(k),
            _ => anyhow::bail!(
                "--verify: `{s}` is not a size of at least 1 (give e.g. 1,2,4,8 or none)"
            ),
        })
        .collect()
}

/// One point of the verify curve.
pub struct VerifyPoint {
    pub k: usize,
    pub times: Vec<Duration>,
}

impl VerifyPoint {
    pub fn median(&self) -> Duration {
        median(&self.times)
    }
}

/// The verify curve, and how the state went back to `--context` positions between reps.
fn verify_curve(
    model: &Model,
    context: &[u32],
    sizes: &[usize],
    ctx: usize,
) -> Result<(Vec<VerifyPoint>, &'static str)> {
    let mut state = model.new_state(ctx);
    model.forward(&mut state, context, Logits::Last)?;
    let mut how = "truncate";
    let mut points = Vec::with_capacity(sizes.len());
    for (i, &k) in sizes.iter().enumerate() {
        let tokens = synthetic_tokens(k, model.config.vocab, 100 + i as u64);
        let mut times = Vec::with_capacity(VERIFY_REPS);
        // One untimed rep first: the first pass of a new size allocates its buffers.
        for rep in 0..=VERIFY_REPS {
            let t = Instant::now();
            model.forward(&mut state, &tokens, Logits::All)?;
            let dt = t.elapsed();
            if rep > 0 {
                times.push(dt);
            }
            if !state.truncate(context.len()) {
                how = "recreate";
                state = model.new_state(ctx);
                model.forward(&mut state, context, Logits::Last)?;
            }
        }
        points.push(VerifyPoint { k, times });
    }
    Ok((points, how))
}

/// Bytes one decode step reads, from the checkpoint and the configuration.
#[derive(Debug, Default)]
pub struct DecodeBytes {
    /// Weight bytes a decode step reads (GGUF tensor bytes; see the module doc), if a GGUF.
    pub weights: Option<u64>,
    /// All tensor bytes in the file.
    pub file_tensors: Option<u64>,
    /// Weight bytes per tensor type (GGUF type names).
    pub by_dtype: Vec<(String, u64)>,
    /// KV cache bytes per position over all attention layers, as kasoku stores it (f32).
    pub kv_per_position_f32: u64,
    /// Recurrent + conv state bytes of all Gated DeltaNet layers (read once per step).
    pub recurrent_state: u64,
}

impl DecodeBytes {
    pub fn of(path: &Path, cfg: &ModelConfig) -> DecodeBytes {
        let attn = cfg.count(LayerKind::Attention) as u64;
        let gdn = cfg.count(LayerKind::GatedDeltaNet) as u64;
        let kv_per_position_f32 = attn * 2 * (cfg.n_kv_heads * cfg.head_dim) as u64 * 4;
        let (nk, nv) = (
            cfg.linear_num_key_heads as u64,
            cfg.linear_num_value_heads as u64,
        );
        let (dk, dv) = (
            cfg.linear_key_head_dim as u64,
            cfg.linear_value_head_dim as u64,
        );
        let conv_dim = 2 * nk * dk + nv * dv;
        let conv_rows = (cfg.linear_conv_kernel_dim as u64).saturating_sub(1);
        let recurrent_state = gdn * (nv * dk * dv + conv_rows * conv_dim) * 4;
        let mut out = DecodeBytes {
            kv_per_position_f32,
            recurrent_state,
            ..Default::default()
        };
        if path.is_file() {
            if let Ok(file) = GgufFile::open(path) {
                out.fill_from_gguf(&file);
            }
        }
        out
    }

    fn fill_from_gguf(&mut self, file: &GgufFile) {
        let mut total = 0u64;
        let mut embd = 0u64;
        let mut embd_row = 0u64;
        let mut tied = true;
        let mut by_dtype: std::collections::BTreeMap<String, u64> = Default::default();
        for t in file.tensor_infos() {
            if t.name.starts_with("mtp.") {
                continue;
            }
            let n = t.nbytes as u64;
            total += n;
            *by_dtype.entry(t.dtype.name().to_string()).or_default() += n;
            if t.name == "token_embd.weight" {
                embd = n;
                embd_row = n / t.shape.first().copied().unwrap_or(1).max(1) as u64;
            }
            if t.name == "output.weight" {
                tied = false;
            }
        }
        self.file_tensors = Some(total);
        self.weights = Some(total - embd + embd_row + if tied { embd } else { 0 });
        self.by_dtype = by_dtype.into_iter().collect();
    }

    /// Cache bytes read by a decode step at `len` positions.
    pub fn cache_at(&self, len: usize) -> u64 {
        self.kv_per_position_f32 * len as u64 + self.recurrent_state
    }
}

struct Report<'a> {
    args: &'a BenchArgs,
    path: &'a Path,
    model: &'a Model,
    load_seconds: f64,
    rss_after_load: Option<u64>,
    prefill: Duration,
    steps: &'a [Duration],
    verify: &'a (Vec<VerifyPoint>, &'static str),
    bytes: &'a DecodeBytes,
    profile: Option<&'a profile::Profile>,
}

fn report(r: Report) -> Value {
    let cfg = &r.model.config;
    let rate = |n: usize, d: Duration| {
        if d.is_zero() {
            0.0
        } else {
            n as f64 / d.as_secs_f64()
        }
    };
    let gen = r.steps.len();
    let decode_total: Duration = r.steps.iter().sum();
    let mut at = Vec::new();
    for n in [32, 64, 128, 256, 512, 1024, 2048]
        .into_iter()
        .filter(|&n| n < gen)
        .chain((gen > 0).then_some(gen))
    {
        let d: Duration = r.steps[..n].iter().sum();
        at.push(json!({"tokens": n, "seconds": d.as_secs_f64(), "tokens_per_second": rate(n, d)}));
    }
    let mid = r.args.context + gen / 2;
    let packed = packed_matmul_bytes(r.model);
    let (points, how) = r.verify;
    let k1 = points.iter().find(|p| p.k == 1).map(|p| p.median());
    let verify: Vec<Value> = points
        .iter()
        .map(|p| {
            let ms: Vec<f64> = p.times.iter().map(|d| d.as_secs_f64() * 1e3).collect();
            json!({
                "k": p.k,
                "median_ms": p.median().as_secs_f64() * 1e3,
                "min_ms": ms.iter().copied().fold(f64::INFINITY, f64::min),
                "max_ms": ms.iter().copied().fold(0.0, f64::max),
                "ratio_to_k1": k1.map(|d| p.median().as_secs_f64() / d.as_secs_f64()),
                "runs_ms": ms,
            })
        })
        .collect();
    let step_ms: Vec<f64> = r.steps.iter().map(|d| d.as_secs_f64() * 1e3).collect();
    json!({
        "engine": "kasoku",
        "version": env!("CARGO_PKG_VERSION"),
        "model": {
            "arg": r.args.model,
            "path": r.path.display().to_string(),
            "file_bytes": std::fs::metadata(r.path).ok().filter(|m| m.is_file()).map(|m| m.len()),
            "arch": format!("{:?}", cfg.arch),
            "layers": cfg.n_layers,
            "attention_layers": cfg.count(LayerKind::Attention),
            "gated_deltanet_layers": cfg.count(LayerKind::GatedDeltaNet),
            "hidden": cfg.hidden,
            "vocab": cfg.vocab,
        },
        "threads": threads::num_threads(),
        "load_seconds": r.load_seconds,
        "prefill": {
            "tokens": r.args.prompt_tokens,
            "seconds": r.prefill.as_secs_f64(),
            "tokens_per_second": rate(r.args.prompt_tokens, r.prefill),
        },
        "decode": {
            "context": r.args.context,
            "tokens": gen,
            "seconds": decode_total.as_secs_f64(),
            "tokens_per_second": rate(gen, decode_total),
            "at": at,
            "step_ms": {
                "median": median(r.steps).as_secs_f64() * 1e3,
                "min": step_ms.iter().copied().fold(f64::INFINITY, f64::min),
                "max": step_ms.iter().copied().fold(0.0, f64::max),
            },
            "sampling": "greedy argmax, timed with the step",
        },
        "verify": {
            "context": r.args.context,
            "logits": "all positions",
            "reps": VERIFY_REPS,
            "state_reset": how,
            "points": verify,
        },
        "bytes": {
            "weights_per_token": r.bytes.weights,
            "weights_source": "GGUF tensor bytes - token_embd + one embedding row (+ token_embd again when the head is tied)",
            "file_tensor_bytes": r.bytes.file_tensors,
            "by_dtype": r.bytes.by_dtype.iter().map(|(k, v)| (k.clone(), json!(v))).collect::<serde_json::Map<_, _>>(),
            "packed_matmul_bytes": packed.0,
            "packed_matmul_complete": packed.1,
            "kv_per_position_f32": r.bytes.kv_per_position_f32,
            "recurrent_state": r.bytes.recurrent_state,
            "decode_mean_context": mid,
            "cache_per_token_at_mean_context": r.bytes.cache_at(mid),
            "per_token_at_mean_context": r.bytes.weights.map(|w| w + r.bytes.cache_at(mid)),
        },
        "memory": {
            "peak_rss_bytes": peak_rss_bytes(),
            "rss_after_load_bytes": r.rss_after_load,
        },
        "profile": r.profile.map(profile::to_json),
    })
}

/// Sum of the packed matrices' sizes (every layer's, the head's); always complete now that
/// the model lists them all (the flag stays in the JSON for its readers).
fn packed_matmul_bytes(model: &Model) -> (u64, bool) {
    let total = model
        .matrices()
        .iter()
        .map(|(_, w)| w.size_bytes() as u64)
        .sum();
    (total, true)
}

fn print_table(v: &Value) {
    let f = |p: &str| v.pointer(p).and_then(Value::as_f64).unwrap_or(f64::NAN);
    let mib = |p: &str| f(p) / (1u64 << 20) as f64;
    eprintln!(
        "kasoku bench  {}  ({} threads, loaded in {:.2} s)",
        v.pointer("/model/path")
            .and_then(Value::as_str)
            .unwrap_or("?"),
        f("/threads"),
        f("/load_seconds")
    );
    eprintln!(
        "  prefill  {:>5} tokens  {:>9.1} t/s",
        v.pointer("/prefill/tokens")
            .and_then(Value::as_u64)
            .unwrap_or(0),
        f("/prefill/tokens_per_second")
    );
    if let Some(at) = v.pointer("/decode/at").and_then(Value::as_array) {
        for a in at {
            eprintln!(
                "  decode   {:>5} tokens  {:>9.1} t/s",
                a["tokens"].as_u64().unwrap_or(0),
                a["tokens_per_second"].as_f64().unwrap_or(f64::NAN)
            );
        }
    }
    if let Some(points) = v.pointer("/verify/points").and_then(Value::as_array) {
        let row: Vec<String> = points
            .iter()
            .map(|p| {
                format!(
                    "k={} {:.2} ms ({:.2}x)",
                    p["k"],
                    p["median_ms"].as_f64().unwrap_or(f64::NAN),
                    p["ratio_to_k1"].as_f64().unwrap_or(f64::NAN)
                )
            })
            .collect();
        eprintln!("  verify   {}", row.join(", "));
    }
    eprintln!(
        "  bytes/token  weights {:.1} MiB + cache {:.2} MiB at {} positions;  peak RSS {:.0} MiB",
        mib("/bytes/weights_per_token"),
        mib("/bytes/cache_per_token_at_mean_context"),
        f("/bytes/decode_mean_context"),
        mib("/memory/peak_rss_bytes")
    );
}

fn median(times: &[Duration]) -> Duration {
    if times.is_empty() {
        return Duration::ZERO;
    }
    let mut v = times.to_vec();
    v.sort();
    v[v.len() / 2]
}

/// Current resident memory of this process (Linux `VmRSS`).
fn current_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// A state with `CONTEXT` tokens, for callers that want the same starting point.
pub fn context_state(model: &Model, context: &[u32], ctx: usize) -> Result<ModelState> {
    let mut state = model.new_state(ctx);
    model.forward(&mut state, context, Logits::Last)?;
    Ok(state)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synthetic_tokens_are_in_range_and_deterministic() {
        let a = synthetic_tokens(1000, 50, 1);
        assert!(a.iter().all(|&t| (1..50).contains(&t)));
        assert_eq!(a, synthetic_tokens(1000, 50, 1));
        assert_ne!(a, synthetic_tokens(1000, 50, 2));
        // Not degenerate: many distinct ids.
        let distinct: std::collections::BTreeSet<_> = a.iter().collect();
        assert!(distinct.len() > 40);
    }

    #[test]
    fn verify_sizes_parse_or_skip() {
        assert_eq!(parse_verify_sizes("1,2, 8").unwrap(), vec![1, 2, 8]);
        assert!(parse_verify_sizes("").unwrap().is_empty());
        assert!(parse_verify_sizes("none").unwrap().is_empty());
        for bad in ["0", "1,,2", "x", "-1"] {
            assert!(parse_verify_sizes(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn median_picks_the_middle() {
        let d = |ms| Duration::from_millis(ms);
        assert_eq!(median(&[d(5), d(1), d(3)]), d(3));
        assert_eq!(median(&[]), Duration::ZERO);
    }
}
