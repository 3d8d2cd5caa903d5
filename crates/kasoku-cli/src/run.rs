//! `kasoku run`: one prompt (`-m`) streamed to stdout, or an interactive chat that keeps its
//! conversation and cache between turns; statistics after each answer.

use std::io::{BufRead, Write};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Result;
use kasoku::engine::{
    self, GenerateOptions, Generator, LoadedModel, PromptOptions, SamplingParams, Session,
};
use kasoku::model::{footprint, KvType};
use kasoku::quant::kasoku::{Recipe, Scheme};
use kasoku::quant::Target;
use kasoku::tokenizer::{ChatMessage, ChatTemplate, Tokenizer};

use crate::args::RunArgs;
use crate::progress;

pub fn run(args: &RunArgs) -> Result<()> {
    let name = args.model_name();
    if let Some(gpu) = gpu_model(args, name)? {
        return crate::run_gpu::run(args, &gpu);
    }
    let model = load(
        name,
        args.threads,
        args.cache_type,
        args.quantize,
        args.quiet,
    )?;
    let spec = args.spec.with_shipped_drafter(name, args.quiet);
    let draft = spec.load_draft(&model.model, args.cache_type, args.quiet)?;
    let plan = engine::ContextRequest {
        requested: args.ctx_size,
        model_max: model.model.config.max_context,
        kv_bytes_per_token: model.model.kv_bytes_per_token()
            + crate::spec_args::draft_kv_bytes_per_token(draft.as_ref()),
        kv_type: args.cache_type,
        sessions: 1,
        other_bytes: 0,
        // Loaded: MemAvailable already excludes the weights.
        weight_bytes: 0,
        scratch_bytes: footprint::scratch_bytes(&model.model.config)
            + crate::spec_args::draft_scratch_bytes(draft.as_ref()),
        available: engine::available_memory(),
    }
    .plan()?;
    if let (Some(note), false) = (&plan.note, args.quiet) {
        eprintln!("note: {note}");
    }
    let ctx = plan.tokens;
    let mut session = Session::new(Arc::clone(&model.model), ctx);
    session.set_speculator(spec.speculator(&model.model, draft, ctx)?);
    let options = generate_options(args, engine::stop_tokens(&model))?;
    let prompt_options = PromptOptions {
        raw: args.raw,
        think: args.think,
        context: Some(ctx),
    };
    converse(
        &mut session,
        (&model.tokenizer, model.template.as_deref()),
        &prompt_options,
        &options,
        args,
    )
}

/// The model on a GPU when `--device` asks for one, or when none was asked and a usable GPU
/// runs this request (else None: the CPU runs it, and the reason is printed).
fn gpu_model(args: &RunArgs, name: &str) -> Result<Option<crate::run_gpu::GpuModel>> {
    crate::run_gpu::pick(args.device, name, args.quiet, &|path| {
        crate::run_gpu::unsupported(args, path)
    })
}

/// Resolves and loads a model (its KV caches as `kv_type`) with a progress line, after
/// setting the thread count.
pub fn load(
    name: &str,
    threads: Option<usize>,
    kv_type: KvType,
    quantize: Option<Scheme>,
    quiet: bool,
) -> Result<LoadedModel> {
    if let Some(n) = threads {
        kasoku::kernels::threads::set_threads(n);
    }
    let path = progress::resolve_model(name, quiet)?;
    let spinner = (!quiet).then(|| {
        let s = indicatif::ProgressBar::new_spinner();
        s.set_message(format!("loading {}", path.display()));
        s.enable_steady_tick(std::time::Duration::from_millis(120));
        s
    });
    let start = Instant::now();
    let target = quantize.map(|s| Target::Kasoku(Recipe::new(s)));
    let model = LoadedModel::load_as(&path, kv_type, target)?;
    if let Some(s) = spinner {
        s.finish_and_clear();
        let cfg = &model.model.config;
        eprintln!(
            "loaded {} ({:?}, {} layers, vocab {}) in {:.2} s, {} threads",
            path.display(),
            cfg.arch,
            cfg.n_layers,
            cfg.vocab,
            start.elapsed().as_secs_f64(),
            kasoku::kernels::threads::num_threads()
        );
    }
    Ok(model)
}

/// The sampling flags of `run`, checked.
pub(crate) fn sampling_params(args: &RunArgs) -> Result<SamplingParams> {
    let sampling = SamplingParams {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        repetition_penalty: args.repetition_penalty,
        presence_penalty: args.presence_penalty,
        frequency_penalty: args.frequency_penalty,
        penalty_last_n: args.penalty_last_n,
        seed: args.seed,
    };
    sampling.validate()?;
    Ok(sampling)
}

/// The options of one answer; `stop_tokens` are the model's end-of-generation tokens.
pub(crate) fn generate_options(args: &RunArgs, stop_tokens: Vec<u32>) -> Result<GenerateOptions> {
    let sampling = sampling_params(args)?;
    let stop_tokens = if args.ignore_eos {
        Vec::new()
    } else {
        stop_tokens
    };
    Ok(GenerateOptions {
        logprobs: None,
        sampling,
        max_tokens: args.max_tokens,
        stop_tokens,
        constraint: None,
    })
}

/// Generates one answer to the conversation on `generator` (a CPU session or a session on a
/// GPU), streaming it; returns the answer text. The statistics name the device.
pub(crate) fn answer(
    generator: &mut dyn Generator,
    text: (&Tokenizer, Option<&ChatTemplate>),
    messages: &[ChatMessage],
    prompt_options: &PromptOptions,
    options: &GenerateOptions,
    args: &RunArgs,
) -> Result<String> {
    let (tokenizer, template) = text;
    let prompt = engine::render_prompt(tokenizer, template, messages, prompt_options)?;
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let (generation, text) = engine::generate_text_on(
        generator,
        tokenizer,
        &prompt,
        options,
        &args.stop,
        &mut |piece| {
            let _ = out.write_all(piece.as_bytes());
            let _ = out.flush();
        },
    )?;
    let _ = writeln!(out);
    drop(out);
    if !args.quiet {
        eprintln!(
            "\n[{}] device {} | {}",
            generation.finish.as_str(),
            generator.device(),
            generation.stats.summary()
        );
        if let Some(spec) = &generation.stats.spec {
            eprintln!("{}", spec.summary());
        }
    }
    Ok(text)
}

/// One answer to `-m`, or the interactive chat, on `generator`.
pub(crate) fn converse(
    generator: &mut dyn Generator,
    text: (&Tokenizer, Option<&ChatTemplate>),
    prompt_options: &PromptOptions,
    options: &GenerateOptions,
    args: &RunArgs,
) -> Result<()> {
    let mut messages = Vec::new();
    if let Some(system) = &args.system {
        messages.push(ChatMessage::new("system", system.clone()));
    }
    if let Some(message) = &args.message {
        messages.push(ChatMessage::new("user", message.clone()));
        answer(generator, text, &messages, prompt_options, options, args)?;
        return Ok(());
    }
    let generator = std::cell::RefCell::new(generator);
    chat_loop(
        messages,
        &mut |messages| {
            answer(
                *generator.borrow_mut(),
                text,
                messages,
                prompt_options,
                options,
                args,
            )
        },
        &mut || generator.borrow_mut().reset(),
    )
}

/// The interactive chat of `run`: reads user lines, answers each with `answer` (given the
/// whole conversation), keeps the answers in the conversation; `/reset` goes back to the
/// `system` messages (and calls `reset`), `/exit`, `/quit` or end of input stops.
pub(crate) fn chat_loop(
    system: Vec<ChatMessage>,
    answer: &mut dyn FnMut(&[ChatMessage]) -> Result<String>,
    reset: &mut dyn FnMut(),
) -> Result<()> {
    eprintln!("chat with the model: type a message and press Enter; /reset starts over, /exit or Ctrl-D quits.");
    let mut messages = system.clone();
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        eprint!("> ");
        let _ = std::io::stderr().flush();
        let Some(line) = lines.next() else { break };
        let line = line?;
        let line = line.trim();
        match line {
            "" => continue,
            "/exit" | "/quit" => break,
            "/reset" => {
                messages = system.clone();
                reset();
                continue;
            }
            _ => {}
        }
        messages.push(ChatMessage::new("user", line.to_string()));
        match answer(&messages) {
            Ok(text) => messages.push(ChatMessage::new("assistant", text)),
            Err(e) => {
                eprintln!("error: {e:#}");
                messages.pop();
            }
        }
    }
    Ok(())
}
