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
//!
//! With `--device cuda` every session runs on the GPU as `run --device cuda` would (the
//! target loaded once; a draft model or DFlash drafter on the same GPU), so the same prompts
//! measure both devices.

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use kasoku::engine::{
    self, DeviceSession, Flow, GenerateOptions, Generator, LoadedModel, SamplingParams, Session,
    SpecKind,
};
use kasoku::tokenizer::Tokenizer;
use kasoku_cuda::Device;
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

    // The strategies: (label, speculation kind, whether it gets the draft).
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
    let ctx = 4096;
    let mut sessions = match args.device {
        Some(Device::Cuda(i)) => gpu_sessions(args, model_path, i, &strategies, ctx)?,
        _ => cpu_sessions(args, model_path, &strategies, ctx)?,
    };
    let options = GenerateOptions {
        logprobs: None,
        sampling: SamplingParams::default(),
        max_tokens: args.gen_tokens,
        stop_tokens: sessions.stop_tokens.clone(),
        constraint: None,
    };
    let tokenizer = sessions.tokenizer.clone();
    let encode = |p: &str| -> Result<Vec<u32>> { Ok(tokenizer.encode_with_bos(p, true)?) };
    // Warm-up: page the weights in, size the buffers (and on a GPU, capture the graphs).
    let warm = GenerateOptions {
        logprobs: None,
        max_tokens: 16,
        ..options.clone()
    };
    for session in &mut sessions.list {
        session.generate(&encode(&list[0])?, &warm, &mut |_| Flow::Continue)?;
    }
    let sessions = &mut sessions.list;
    let device = sessions[0].device();
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
        "device": device,
        "threads": kasoku::kernels::threads::num_threads(),
        // The process's peak resident memory (every strategy's weights and caches).
        "peak_rss_bytes": kasoku::engine::stats::peak_rss_bytes(),
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

/// The strategies' sessions, and what turns the prompts into tokens and ends an answer.
struct Sessions {
    list: Vec<Box<dyn Generator>>,
    tokenizer: Arc<Tokenizer>,
    stop_tokens: Vec<u32>,
}

/// The strategies' sessions on the CPU: one model, one draft model or drafter shared.
fn cpu_sessions(
    args: &BenchArgs,
    model_path: &Path,
    strategies: &[(String, SpecKind, bool)],
    ctx: usize,
) -> Result<Sessions> {
    let model = LoadedModel::load_with(model_path, args.cache_type)
        .with_context(|| format!("loading {}", model_path.display()))?;
    let draft = args.spec.load_draft(&model.model, args.cache_type, true)?;
    let mut list: Vec<Box<dyn Generator>> = Vec::new();
    for (label, kind, with_draft) in strategies {
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
        list.push(Box::new(session));
    }
    Ok(Sessions {
        list,
        tokenizer: model.tokenizer.clone(),
        stop_tokens: engine::stop_tokens(&model),
    })
}

/// The strategies' sessions on GPU `ordinal`: the target loaded once, and the draft model
/// or DFlash drafter loaded once on the same GPU (as `run --device cuda` loads it) for the
/// strategies that draft with it.
fn gpu_sessions(
    args: &BenchArgs,
    model_path: &Path,
    ordinal: usize,
    strategies: &[(String, SpecKind, bool)],
    ctx: usize,
) -> Result<Sessions> {
    use crate::draft_gpu::{drafts_with_dflash, drafts_with_model};
    kasoku_cuda::select_device(args.device)?;
    let m = crate::run_gpu::GpuModel::load(model_path, ordinal, true)?;
    let mut shared = None;
    let mut list: Vec<Box<dyn Generator>> = Vec::new();
    for (label, kind, with_draft) in strategies {
        let spec = crate::spec_args::SpecArgs {
            spec: *kind,
            draft: args.spec.draft.clone().filter(|_| *with_draft),
            ..args.spec.clone()
        };
        if let Some(why) = crate::draft_gpu::unsupported(spec.spec, spec.draft.as_deref()) {
            anyhow::bail!("strategy {label} on the GPU: {why}");
        }
        // Every strategy that drafts with it names the same file, so one load serves them.
        let draft = spec.draft.as_deref();
        let uses_draft =
            drafts_with_dflash(spec.spec, draft) || drafts_with_model(spec.spec, draft);
        if uses_draft && shared.is_none() {
            shared = crate::draft_gpu::load_for(&spec, &m, true)?;
        }
        let mut session = DeviceSession::on(m.device.as_ref(), ctx)?;
        session.set_speculator(
            crate::draft_gpu::speculator(&spec, &m, shared.as_ref().filter(|_| uses_draft), ctx)
                .with_context(|| format!("strategy {label}"))?,
        );
        list.push(Box::new(session));
    }
    Ok(Sessions {
        list,
        stop_tokens: engine::end_tokens(&m.tokenizer, None),
        tokenizer: m.tokenizer,
    })
}
