//! `kasoku run` on an NVIDIA GPU: a GGUF file of a dense model (llama, qwen2, qwen3) decoded
//! greedily with every pass on the device (one graph launch and one synchronisation per token,
//! or per verified draft tree with prompt lookup), the answer streamed as text as on the CPU.
//!
//! Sampling at a temperature (and repetition penalties) draws each token on the host from the
//! pass's logits with the same (seed, position)-keyed sampler as the CPU path, one token per
//! pass. What the GPU path does not do yet (draft models, MTP, DFlash, the hybrid Qwen3.5
//! layers) is reported by [`unsupported`], so `run` takes the CPU instead (or says why, when the
//! GPU was asked for).

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use kasoku::engine::{render_prompt, PromptOptions, SamplingParams, SpecKind, TextStream};
use kasoku::format::gguf::GgufFile;
use kasoku::spec::ngram::NgramDrafter;
use kasoku::tokenizer::{ChatMessage, ChatTemplate, Tokenizer};
use kasoku_cuda::{CudaModel, CudaState, Drafting, Gpu};

use crate::args::RunArgs;

/// Longest context the GPU path plans by default (its KV cache is allocated whole).
const DEFAULT_GPU_CONTEXT: usize = 32768;

/// Why `args` cannot run on the GPU path (None: it can), before anything is loaded.
pub fn unsupported(args: &RunArgs, path: &Path) -> Option<String> {
    if path.extension().is_none_or(|e| e != "gguf") {
        return Some(format!(
            "the GPU runs GGUF files; {} is not one",
            path.display()
        ));
    }
    match args.spec.spec {
        SpecKind::None | SpecKind::Ngram => None,
        SpecKind::Auto if args.spec.draft.is_none() => None,
        _ => Some("the GPU drafts with prompt lookup only (--spec ngram, auto or none)".into()),
    }
}

/// A model on the GPU with what turns text into its tokens and back.
pub struct GpuModel {
    gpu: Arc<Gpu>,
    model: CudaModel,
    tokenizer: Tokenizer,
    template: Option<ChatTemplate>,
}

impl GpuModel {
    /// Loads `path` onto GPU `ordinal` (weights uploaded straight from the file's memory map).
    pub fn load(path: &Path, ordinal: usize, quiet: bool) -> Result<GpuModel> {
        let start = Instant::now();
        let gpu = Gpu::open(ordinal)?;
        let gguf = GgufFile::open(path).with_context(|| format!("opening {}", path.display()))?;
        let tokenizer = Tokenizer::from_gguf(&gguf)?;
        let template = ChatTemplate::from_gguf(&gguf).ok();
        drop(gguf);
        let model = CudaModel::load(&gpu, path)?;
        if tokenizer.token_count() > model.config.vocab {
            anyhow::bail!(
                "{}: tokenizer has {} tokens but the model's vocabulary is {}",
                path.display(),
                tokenizer.token_count(),
                model.config.vocab
            );
        }
        if !quiet {
            eprintln!(
                "loaded {} ({:?}, {} layers) on cuda:{ordinal} ({}) in {:.2} s",
                path.display(),
                model.config.arch,
                model.config.n_layers,
                gpu.name,
                start.elapsed().as_secs_f64()
            );
        }
        Ok(GpuModel {
            gpu,
            model,
            tokenizer,
            template,
        })
    }
}

/// `kasoku run` on the GPU: one answer to `-m`, or an interactive chat.
pub fn run(args: &RunArgs, m: &GpuModel) -> Result<()> {
    let ctx = args
        .ctx_size
        .unwrap_or_else(|| m.model.config.max_context.clamp(1, DEFAULT_GPU_CONTEXT));
    let mut state = m.model.new_state(ctx)?;
    let prompt_options = PromptOptions {
        raw: args.raw,
        think: args.think,
        context: Some(ctx),
    };
    let mut messages = Vec::new();
    if let Some(system) = &args.system {
        messages.push(ChatMessage::new("system", system.clone()));
    }
    if let Some(message) = &args.message {
        messages.push(ChatMessage::new("user", message.clone()));
        answer(m, &mut state, &messages, &prompt_options, args)?;
        return Ok(());
    }
    crate::run::chat_loop(
        messages,
        &mut |messages| answer(m, &mut state, messages, &prompt_options, args),
        &mut || {},
    )
}

/// Generates and streams one answer; returns its text. The conversation is prefilled whole
/// each turn (the GPU prefills thousands of tokens a second).
fn answer(
    m: &GpuModel,
    state: &mut CudaState,
    messages: &[ChatMessage],
    prompt_options: &PromptOptions,
    args: &RunArgs,
) -> Result<String> {
    m.gpu.bind()?;
    let prompt = render_prompt(&m.tokenizer, m.template.as_ref(), messages, prompt_options)?;
    if prompt.len() + 1 >= state.max_len {
        anyhow::bail!(
            "the prompt has {} tokens, but the context holds {}",
            prompt.len(),
            state.max_len
        );
    }
    state.reset();
    let stop_ids: Vec<u32> = if args.ignore_eos {
        Vec::new()
    } else {
        m.tokenizer.eos_ids().to_vec()
    };
    let mut stream = TextStream::new(&m.tokenizer, &args.stop);
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut text = String::new();
    let mut emit = |piece: &str, text: &mut String| {
        if !piece.is_empty() {
            text.push_str(piece);
            let _ = out.write_all(piece.as_bytes());
            let _ = out.flush();
        }
    };
    let sampling = crate::run::sampling_params(args)?;
    let mut drafter = NgramDrafter::default();
    // Drafts are checked greedily on the device; sampled tokens come one per pass.
    let drafting = (args.spec.spec != SpecKind::None && sampling.is_greedy()).then_some(Drafting {
        drafter: &mut drafter,
        budget: args.spec.tree_budget,
        max_depth: args.spec.max_depth,
    });
    let start = Instant::now();
    let mut first_token_at = None;
    let (mut generated, mut finish) = (0usize, "length");
    let mut on_token = |t: u32| {
        first_token_at.get_or_insert_with(|| start.elapsed());
        if stop_ids.contains(&t) {
            finish = "stop";
            return false;
        }
        generated += 1;
        let released = stream.push(t);
        emit(&released, &mut text);
        if stream.stopped() {
            finish = "stop";
            return false;
        }
        true
    };
    let run = if sampling.is_greedy() {
        kasoku_cuda::generate_greedy(
            &m.model,
            state,
            &prompt,
            args.max_tokens,
            drafting,
            &mut on_token,
        )?
    } else {
        generate_sampled(m, state, &prompt, args.max_tokens, &sampling, &mut on_token)?
    };
    let tail = stream.finish();
    emit(&tail, &mut text);
    let _ = writeln!(out);
    drop(out);
    if !args.quiet {
        let total = start.elapsed().as_secs_f64();
        let ttft = first_token_at.map_or(total, |d| d.as_secs_f64());
        let decode = (total - ttft).max(1e-9);
        let mut line = format!(
            "\n[{finish}] device cuda:{} | prompt {} tokens in {:.3} s ({:.0} t/s) | {} tokens, decode {:.1} t/s",
            m.gpu.ordinal,
            prompt.len(),
            ttft,
            prompt.len() as f64 / ttft.max(1e-9),
            generated,
            generated.saturating_sub(1) as f64 / decode
        );
        if run.drafted > 0 {
            line += &format!(
                " | {:.2} tokens per pass, {} of {} drafts accepted",
                generated.saturating_sub(1) as f64 / run.passes.max(1) as f64,
                run.accepted,
                run.drafted
            );
        }
        eprintln!("{line}");
    }
    Ok(text)
}

/// Sampled decoding: each pass's logits come to the host, where `sampling` draws the next
/// token at its position (as the CPU path does); at most `n` tokens, until `on_token` says stop.
fn generate_sampled(
    m: &GpuModel,
    state: &mut CudaState,
    prompt: &[u32],
    n: usize,
    sampling: &SamplingParams,
    on_token: &mut dyn FnMut(u32) -> bool,
) -> Result<kasoku_cuda::SpecRun> {
    let mut run = kasoku_cuda::SpecRun::default();
    if n == 0 {
        return Ok(run);
    }
    let mut history = prompt.to_vec();
    state.prefill(&m.model, prompt)?;
    loop {
        let logits = state.last_logits(&m.model)?;
        let token = kasoku::sampler::sample(sampling, &logits, &history, history.len());
        history.push(token);
        if !on_token(token) || history.len() - prompt.len() >= n || state.len + 1 >= state.max_len {
            return Ok(run);
        }
        state.step(&m.model, token)?;
        run.passes += 1;
    }
}
