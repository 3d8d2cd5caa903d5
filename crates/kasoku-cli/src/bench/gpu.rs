//! `kasoku bench --device cuda`: the same measurements as the CPU bench (prefill, decode after
//! `--context` tokens, the verify curve) with every pass on the GPU, as JSON. Each pass is one
//! graph launch and one synchronisation; the times include both (what a user's decode sees).

use std::path::Path;
use std::time::Instant;

use anyhow::Result;
use kasoku::model::TokenTree;
use kasoku_cuda::{CudaModel, Gpu};
use serde_json::{json, Value};

use crate::args::BenchArgs;

/// Runs the measurements on GPU `ordinal` and returns the report.
pub fn bench(
    args: &BenchArgs,
    path: &Path,
    ordinal: usize,
    verify_sizes: &[usize],
) -> Result<Value> {
    let gpu = Gpu::open(ordinal)?;
    let t = Instant::now();
    let model = CudaModel::load(&gpu, path)?;
    let load_seconds = t.elapsed().as_secs_f64();
    let cfg = &model.config;
    let max_verify = verify_sizes.iter().copied().max().unwrap_or(0);
    let ctx = args
        .prompt_tokens
        .max(args.context + args.gen_tokens + 1)
        .max(args.context + max_verify)
        + 1;
    let prompt = super::synthetic_tokens(args.prompt_tokens, cfg.vocab, 1);
    let context = super::synthetic_tokens(args.context.max(1), cfg.vocab, 2);
    let mut state = model.new_state(ctx)?;

    // Prefill, after one untimed run (kernels, graphs and caches warm).
    let mut prefill = Vec::new();
    for rep in 0..3 {
        state.reset();
        let t = Instant::now();
        state.prefill(&model, &prompt)?;
        if rep > 0 {
            prefill.push(t.elapsed().as_secs_f64());
        }
    }
    let prefill_s = median(&mut prefill);

    // Decode: greedy steps after the context, one untimed warm-up round.
    let mut decode = Vec::new();
    for rep in 0..2 {
        state.reset();
        let mut next = state.prefill(&model, &context)?;
        let t = Instant::now();
        for _ in 0..args.gen_tokens {
            next = state.step(&model, next)?;
        }
        if rep > 0 {
            decode.push(t.elapsed().as_secs_f64());
        }
    }
    let decode_s = decode[0];

    // The verify curve: k tokens as one chain after the context, the state left as it was.
    state.reset();
    state.prefill(&model, &context)?;
    let mut points = Vec::new();
    for &k in verify_sizes {
        let tree = TokenTree::chain(&super::synthetic_tokens(k, cfg.vocab, 3));
        let mut ms = Vec::new();
        for rep in 0..(super::VERIFY_REPS + 2) {
            let t = Instant::now();
            state.verify(&model, &tree)?;
            if rep >= 2 {
                ms.push(t.elapsed().as_secs_f64() * 1e3);
            }
        }
        points.push(json!({"k": k, "median_ms": median(&mut ms), "runs_ms": ms}));
    }
    let rate = |n: usize, s: f64| n as f64 / s.max(1e-12);
    Ok(json!({
        "engine": "kasoku",
        "version": env!("CARGO_PKG_VERSION"),
        "device": format!("cuda:{ordinal}"),
        "gpu": gpu.name,
        "model": {
            "arg": args.model,
            "path": path.display().to_string(),
            "arch": format!("{:?}", cfg.arch),
            "layers": cfg.n_layers,
            "hidden": cfg.hidden,
            "vocab": cfg.vocab,
        },
        "load_seconds": load_seconds,
        "prefill": {
            "tokens": args.prompt_tokens,
            "seconds": prefill_s,
            "tokens_per_second": rate(args.prompt_tokens, prefill_s),
        },
        "decode": {
            "context": args.context,
            "tokens": args.gen_tokens,
            "seconds": decode_s,
            "tokens_per_second": rate(args.gen_tokens, decode_s),
            "sampling": "greedy argmax on the device, one synchronisation per token",
        },
        "verify": {
            "context": args.context,
            "logits": "the argmax of every position",
            "reps": super::VERIFY_REPS,
            "points": points,
        },
        "bytes": {
            "weights_per_token": model.weight_bytes,
            "packed_copies": model.packed_bytes,
        },
    }))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
