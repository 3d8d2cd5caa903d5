//! `kasoku bench --prompts FILE`: generation over a set of real prompts with the session's
//! decoding strategy (`--spec`, `--draft`, ...), one JSON record per prompt: decode speed,
//! tokens per target pass, accepted lengths, drafting and verifying time. The side-by-side
//! speculative benchmark (bench/spec.py) runs it once per strategy.
//!
//! FILE holds one JSON object per line with a `prompt` string, fed as is (no chat template:
//! render chat prompts before). Each prompt starts from an empty cache; one speculator (and
//! its learned budget policy) serves every prompt, as in a long-running process. An untimed
//! warm-up generation runs first.
//!
//! With `--compare A,B,...` the strategies run side by side in one process: one session each,
//! taking turns prompt by prompt (prompt `i` starts with strategy `i mod k`), so that the
//! memory bandwidth of a shared machine, which drifts by tens of percent within minutes,
//! weighs on all of them alike. The JSON then has one `strategies` entry per strategy.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use kasoku::engine::{self, Flow, GenerateOptions, LoadedModel, SamplingParams, Session, SpecKind};
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

    let model = LoadedModel::load_with(model_path, args.cache_type)
        .with_context(|| format!("loading {}", model_path.display()))?;
    let draft = args.spec.load_draft(&model.model, args.cache_type, true)?;
    let ctx = 4096;
    let options = GenerateOptions {
        logprobs: None,
        sampling: SamplingParams::default(),
        max_tokens: args.gen_tokens,
        stop_tokens: engine::stop_tokens(&model),
        constraint: None,
    };
    let encode = |p: &str| -> Result<Vec<u32>> { Ok(model.tokenizer.encode_with_bos(p, true)?) };

    // The strategies: (label, speculation kind, whether it gets the draft model).
    let strategies: Vec<(String, SpecKind, bool)> = if args.compare.is_empty() {
        vec![(
            format!("{:?}", args.spec.spec).to_lowercase(),
            args.spec.spec,
            true,
        )]
    } else {
        args.compare
            .iter()
            .map(|label| {
                let (kind, with_draft) = match label.strip_suffix("+draft") {
                    Some(k) => (k, true),
                    None => (label.as_str(), label == "draft" || label == "dflash"),
                };
                let kind: SpecKind = kind.parse().map_err(|e: String| anyhow::anyhow!(e))?;
                Ok((label.clone(), kind, with_draft))
            })
            .collect::<Result<_>>()?
    };
    let mut sessions = Vec::new();
    for (label, kind, with_draft) in &strategies {
        let mut session = Session::new(Arc::clone(&model.model), ctx);
        let spec = crate::spec_args::SpecArgs {
            spec: *kind,
            ..args.spec.clone()
        };
        let d = if *with_draft { draft.clone() } else { None };
        session.set_speculator(
            spec.speculator(&model.model, d, ctx)
                .with_context(|| format!("strategy {label}"))?,
        );
        // Warm-up: page the weights in, size the buffers.
        let warm = GenerateOptions {
            logprobs: None,
            max_tokens: 16,
            ..options.clone()
        };
        session.generate(&encode(&list[0])?, &warm, &mut |_| Flow::Continue)?;
        sessions.push(session);
    }

    let k = sessions.len();
    let mut records: Vec<Vec<Value>> = vec![Vec::new(); k];
    for (i, prompt) in list.iter().enumerate() {
        let tokens = encode(prompt)?;
        for turn in 0..k {
            let j = (i + turn) % k;
            let session = &mut sessions[j];
            session.reset();
            let g = session.generate(&tokens, &options, &mut |_| Flow::Continue)?;
            let s = &g.stats;
            let spec = s.spec.as_ref();
            records[j].push(json!({
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
            }));
            eprintln!(
                "prompt {i:>2} {:<12} {:>4} tokens at {:>6.2} t/s, {:.2} tokens/pass",
                strategies[j].0,
                s.generated_tokens,
                s.decode_tokens_per_second(),
                s.tokens_per_pass()
            );
        }
    }
    let mut out = json!({
        "engine": "kasoku",
        "model": model_path.display().to_string(),
        "draft": args.spec.draft,
        "tree_budget": args.spec.tree_budget,
        "fixed_budget": args.spec.fixed_budget,
        "gen_tokens": args.gen_tokens,
        "threads": kasoku::kernels::threads::num_threads(),
    });
    if args.compare.is_empty() {
        out["spec"] = json!(strategies[0].0);
        out["prompts"] = json!(records.pop().expect("one strategy"));
    } else {
        out["strategies"] = json!(strategies
            .iter()
            .zip(records)
            .map(|((label, _, _), r)| json!({"label": label, "prompts": r}))
            .collect::<Vec<_>>());
    }
    let text = serde_json::to_string_pretty(&out)?;
    if let Some(path) = &args.json {
        std::fs::write(path, &text).with_context(|| format!("writing {}", path.display()))?;
    }
    println!("{text}");
    Ok(())
}
