//! `kasoku bench --prompts FILE`: generation over a set of real prompts with the session's
//! decoding strategy (`--spec`, `--draft`, ...), one JSON record per prompt: decode speed,
//! tokens per target pass, accepted lengths, drafting and verifying time. The side-by-side
//! speculative benchmark (bench/spec.py) runs it once per strategy.
//!
//! FILE holds one JSON object per line with a `prompt` string, fed as is (no chat template:
//! render chat prompts before). Each prompt starts from an empty cache; one speculator (and
//! its learned budget policy) serves every prompt, as in a long-running process. An untimed
//! warm-up generation runs first.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use kasoku::engine::{self, Flow, GenerateOptions, LoadedModel, SamplingParams, Session};
use serde_json::{json, Value};

use crate::args::BenchArgs;

pub fn bench_prompts(args: &BenchArgs, model_path: &Path, prompts: &Path) -> Result<()> {
    let text = std::fs::read_to_string(prompts)
        .with_context(|| format!("reading {}", prompts.display()))?;
    let mut list = Vec::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let v: Value = serde_json::from_str(line)
            .with_context(|| format!("{}:{}: not JSON", prompts.display(), i + 1))?;
        let p = v["prompt"]
            .as_str()
            .with_context(|| format!("{}:{}: no \"prompt\" string", prompts.display(), i + 1))?;
        list.push(p.to_string());
    }
    anyhow::ensure!(!list.is_empty(), "{}: no prompts", prompts.display());

    let model = LoadedModel::load(model_path)
        .with_context(|| format!("loading {}", model_path.display()))?;
    let draft = args.spec.load_draft(true)?;
    let ctx = 4096;
    let mut session = Session::new(Arc::clone(&model.model), ctx);
    session.set_speculator(args.spec.speculator(&model.model, draft, ctx)?);
    let options = GenerateOptions {
        sampling: SamplingParams::default(),
        max_tokens: args.gen_tokens,
        stop_tokens: engine::stop_tokens(&model),
    };
    let encode = |p: &str| -> Result<Vec<u32>> { Ok(model.tokenizer.encode_with_bos(p, true)?) };

    // Warm-up: page the weights in, size the buffers.
    let warm = GenerateOptions {
        max_tokens: 16,
        ..options.clone()
    };
    session.generate(&encode(&list[0])?, &warm, &mut |_| Flow::Continue)?;

    let mut records = Vec::new();
    for (i, prompt) in list.iter().enumerate() {
        session.reset();
        let tokens = encode(prompt)?;
        let g = session.generate(&tokens, &options, &mut |_| Flow::Continue)?;
        let s = &g.stats;
        let spec = s.spec.as_ref();
        let record = json!({
            "index": i,
            "prompt_tokens": tokens.len(),
            "generated": s.generated_tokens,
            "ttft_s": s.time_to_first_token.as_secs_f64(),
            "decode_s": s.decode_time.as_secs_f64(),
            "decode_tokens_per_s": s.decode_tokens_per_second(),
            "passes": s.decode_passes,
            "tokens_per_pass": s.tokens_per_pass(),
            "verify_passes": spec.map(|x| x.verify_passes),
            "mean_accepted": spec.map(|x| x.mean_accepted()),
            "accepted_histogram": spec.map(|x| x.accepted_histogram.clone()),
            "mean_tree": spec.map(|x| x.mean_tree_size()),
            "draft_s": spec.map(|x| x.draft_time.as_secs_f64()),
            "verify_s": spec.map(|x| x.verify_time.as_secs_f64()),
        });
        eprintln!(
            "prompt {i:>2}: {:>4} tokens at {:>6.2} t/s, {:.2} tokens/pass",
            s.generated_tokens,
            s.decode_tokens_per_second(),
            s.tokens_per_pass()
        );
        records.push(record);
    }
    let out = json!({
        "engine": "kasoku",
        "model": model_path.display().to_string(),
        "spec": format!("{:?}", args.spec.spec).to_lowercase(),
        "draft": args.spec.draft,
        "tree_budget": args.spec.tree_budget,
        "fixed_budget": args.spec.fixed_budget,
        "gen_tokens": args.gen_tokens,
        "threads": kasoku::kernels::threads::num_threads(),
        "prompts": records,
    });
    let text = serde_json::to_string_pretty(&out)?;
    if let Some(path) = &args.json {
        std::fs::write(path, &text).with_context(|| format!("writing {}", path.display()))?;
    }
    println!("{text}");
    Ok(())
}
