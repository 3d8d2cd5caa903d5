//! `kasoku run` on an NVIDIA GPU: a GGUF file of a llama, qwen2, qwen3 or Qwen3.5 model whose
//! passes run on the device, answered by the engine's `DeviceSession` through the same
//! `answer` as the CPU (tokenizer, template, stop strings, sampler and statistics from
//! `kasoku`).
//!
//! Greedy requests keep the device's argmax (only token ids cross); sampling at a temperature
//! and repetition penalties draw each token on the host with the CPU's (seed, position)-keyed
//! sampler, from the device's top-k selection (top-k on) or from the row of logits. Prompt
//! lookup, a GGUF draft model or a DFlash drafter on the same GPU
//! (`crate::draft_gpu`) drafts a tree verified per pass either way (the text is plain
//! decoding's). What the GPU path does not do yet (MTP, KV caches
//! other than f16, `--quantize`) is reported by [`unsupported`],
//! so `run` takes the CPU instead (or says why, when the GPU was asked for).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use kasoku::engine::{device_speculator, DeviceModel, DeviceSession, PromptOptions, SpecKind};
use kasoku::format::gguf::GgufFile;
use kasoku::model::KvType;
use kasoku::tokenizer::{ChatTemplate, Tokenizer};
use kasoku_cuda::{CudaDevice, CudaModel, Device, Gpu};

use crate::args::RunArgs;

/// Longest context the GPU path plans by default (its KV cache is allocated whole).
pub const DEFAULT_GPU_CONTEXT: usize = 32768;

/// Why a request with these settings cannot run on the GPU path (None: it can), before
/// anything is loaded: the model file, speculation (with `--draft draft`; a caller that
/// loads draft models on the GPU says so with `draft_on_gpu`), cache type and conversion
/// asked for.
pub fn unsupported_settings(
    path: &Path,
    spec: SpecKind,
    draft: Option<&str>,
    draft_on_gpu: bool,
    cache_type: KvType,
    quantize: bool,
) -> Option<String> {
    if path.extension().is_none_or(|e| e != "gguf") {
        return Some(format!(
            "the GPU runs GGUF files; {} is not one",
            path.display()
        ));
    }
    let why = if draft_on_gpu {
        crate::draft_gpu::unsupported(spec, draft)
    } else {
        device_speculator(spec, draft.is_some(), Default::default())
            .err()
            .map(|e| e.to_string())
    };
    if why.is_some() {
        return why;
    }
    if cache_type != KvType::F16 {
        return Some(format!(
            "the GPU keeps its KV cache in f16 (--cache-type {cache_type} runs on the CPU)"
        ));
    }
    quantize.then(|| "--quantize converts weights for the CPU's kernels".into())
}

/// [`unsupported_settings`] for `run`'s flags.
pub fn unsupported(args: &RunArgs, path: &Path) -> Option<String> {
    unsupported_settings(
        path,
        args.spec.spec,
        args.spec.draft.as_deref(),
        true,
        args.cache_type,
        args.quantize.is_some(),
    )
}

/// The model `name` on a GPU when `asked` is one, or when nothing was asked and a usable GPU
/// runs the request (`unsupported` says why it cannot, given the resolved path); else None:
/// the CPU runs it, and the reason is printed (unless `quiet`). A GPU that was asked for and
/// cannot run the request is an error with the reason, never a fallback.
pub fn pick(
    asked: Option<Device>,
    name: &str,
    quiet: bool,
    unsupported: &dyn Fn(&Path) -> Option<String>,
) -> Result<Option<GpuModel>> {
    if asked == Some(Device::Cpu) {
        return Ok(None);
    }
    let explicit = asked.is_some();
    let say = |why: &str| {
        if !quiet {
            eprintln!("device: cpu ({why})");
        }
    };
    let ordinal = match kasoku_cuda::select_device(asked) {
        Ok((Device::Cuda(i), _)) => i,
        Ok((_, why)) => {
            say(why.as_deref().unwrap_or("no GPU"));
            return Ok(None);
        }
        Err(e) if explicit => return Err(e.into()),
        Err(e) => {
            say(&e.to_string());
            return Ok(None);
        }
    };
    let path = crate::progress::resolve_model(name, quiet)?;
    if let Some(why) = unsupported(&path) {
        if explicit {
            anyhow::bail!("--device cuda: {why}");
        }
        say(&why);
        return Ok(None);
    }
    match GpuModel::load(&path, ordinal, quiet) {
        Ok(m) => Ok(Some(m)),
        Err(e) if explicit => Err(e),
        Err(e) => {
            say(&format!("the GPU cannot run this model: {e:#}"));
            Ok(None)
        }
    }
}

/// A model on the GPU with what turns text into its tokens and back.
pub struct GpuModel {
    /// The checkpoint it was loaded from.
    pub path: PathBuf,
    pub device: Arc<CudaDevice>,
    pub tokenizer: Arc<Tokenizer>,
    pub template: Option<Arc<ChatTemplate>>,
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
            path: path.to_path_buf(),
            device: Arc::new(CudaDevice::new(Arc::new(model))),
            tokenizer: Arc::new(tokenizer),
            template: template.map(Arc::new),
        })
    }

    /// The context a session gets: `asked`, else the model's own up to
    /// [`DEFAULT_GPU_CONTEXT`].
    pub fn context(&self, asked: Option<usize>) -> usize {
        asked.unwrap_or_else(|| self.device.max_context().clamp(1, DEFAULT_GPU_CONTEXT))
    }
}

/// `kasoku run` on the GPU: one answer to `-m`, or an interactive chat (the conversation's
/// prefix stays in the device's cache between turns).
pub fn run(args: &RunArgs, m: &GpuModel) -> Result<()> {
    let ctx = m.context(args.ctx_size);
    let mut session = DeviceSession::on(m.device.as_ref(), ctx)?;
    let spec = args
        .spec
        .with_shipped_drafter(args.model_name(), args.quiet);
    let draft = crate::draft_gpu::load_for(&spec, m, args.quiet)?;
    session.set_speculator(crate::draft_gpu::speculator(&spec, m, draft.as_ref(), ctx)?);
    let options = crate::run::generate_options(args, m.tokenizer.eos_ids().to_vec())?;
    let prompt_options = PromptOptions {
        raw: args.raw,
        think: args.think,
        context: Some(ctx),
    };
    crate::run::converse(
        &mut session,
        (&m.tokenizer, m.template.as_deref()),
        &prompt_options,
        &options,
        args,
    )
}
