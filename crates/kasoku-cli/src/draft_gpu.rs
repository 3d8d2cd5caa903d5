//! Drafters beside the target on the GPU (`--device cuda`): a GGUF draft model (`--draft
//! MODEL.gguf` with speculation `draft` or `auto`) or a DFlash checkpoint (`--draft DIR` with
//! `dflash` or `auto`): which drafts the GPU takes, loading them onto the target's device,
//! checked against the target, and the drafters made with them (`run`'s session speculator,
//! `serve`'s drafter per session). A draft model keeps its file's weight formats there
//! (`--draft-format` requantizes for the CPU's kernels only).

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use kasoku::engine::{device_draft_speculator, device_speculator, SpecKind, Speculator};
use kasoku::model::is_dflash_checkpoint;
use kasoku::spec::draft_model::DraftModelConfig;
use kasoku::spec::{DFlashDrafterConfig, Drafter};
use kasoku_cuda::dflash::DFlashWeights;
use kasoku_cuda::{CudaDraftDrafter, CudaModel};

use crate::run_gpu::GpuModel;
use crate::spec_args::SpecArgs;

/// A drafter's weights on the target's GPU.
#[derive(Clone)]
pub enum GpuDraft {
    /// A GGUF draft model.
    Model(Arc<CudaModel>),
    /// A DFlash block drafter (the target's embedding and head are its own).
    DFlash(Arc<DFlashWeights>),
}

/// Whether speculation `kind` with `--draft draft` drafts with a draft model (not a DFlash
/// checkpoint).
pub fn drafts_with_model(kind: SpecKind, draft: Option<&str>) -> bool {
    matches!(kind, SpecKind::Draft | SpecKind::Auto)
        && draft.is_some_and(|d| !is_dflash_checkpoint(Path::new(d)))
}

/// Whether speculation `kind` with `--draft draft` drafts with a DFlash checkpoint.
pub fn drafts_with_dflash(kind: SpecKind, draft: Option<&str>) -> bool {
    matches!(kind, SpecKind::DFlash | SpecKind::Auto)
        && draft.is_some_and(|d| is_dflash_checkpoint(Path::new(d)))
}

/// Why speculation `kind` with `--draft draft` cannot run on the GPU path (None: it can),
/// before anything is loaded: MTP drafts on the CPU; a draft model must be a GGUF file (one
/// named by a known name is checked when it is resolved); a DFlash checkpoint runs there.
pub fn unsupported(kind: SpecKind, draft: Option<&str>) -> Option<String> {
    if drafts_with_dflash(kind, draft) {
        return None;
    }
    if let Some(name) = draft.filter(|_| drafts_with_model(kind, draft)) {
        let local = Path::new(name);
        let gguf = local.extension().is_some_and(|e| e == "gguf");
        return (local.exists() && !gguf).then(|| {
            format!("the GPU runs GGUF draft models; {name} is not one (it drafts on the CPU)")
        });
    }
    device_speculator(kind, draft.is_some(), Default::default())
        .err()
        .map(|e| e.to_string())
}

/// The drafter `spec` asks for, loaded onto `target`'s GPU (None: it drafts without one).
pub fn load_for(spec: &SpecArgs, target: &GpuModel, quiet: bool) -> Result<Option<GpuDraft>> {
    let Some(name) = spec.draft.as_deref() else {
        return Ok(None);
    };
    if drafts_with_dflash(spec.spec, Some(name)) {
        return load_dflash(target, Path::new(name), quiet).map(Some);
    }
    if drafts_with_model(spec.spec, Some(name)) {
        return load(target, name, quiet).map(|m| Some(GpuDraft::Model(m)));
    }
    Ok(None)
}

/// Loads the DFlash checkpoint `dir` onto `target`'s GPU, checked against the target.
pub fn load_dflash(target: &GpuModel, dir: &Path, quiet: bool) -> Result<GpuDraft> {
    let start = Instant::now();
    let weights = kasoku_cuda::dflash::load_weights(target.device.model(), dir)
        .with_context(|| format!("loading the DFlash drafter {} on the GPU", dir.display()))?;
    if !quiet {
        eprintln!(
            "loaded DFlash drafter {} on the same GPU in {:.2} s",
            dir.display(),
            start.elapsed().as_secs_f64()
        );
    }
    Ok(GpuDraft::DFlash(weights))
}

/// Loads the draft model `name` onto `target`'s GPU; it must share the target's vocabulary.
pub fn load(target: &GpuModel, name: &str, quiet: bool) -> Result<Arc<CudaModel>> {
    let path = crate::progress::resolve_model(name, quiet)?;
    if path.extension().is_none_or(|e| e != "gguf") {
        anyhow::bail!(
            "--device cuda: the GPU runs GGUF draft models; {} is not one",
            path.display()
        );
    }
    let start = Instant::now();
    let model = target.device.model();
    let draft = CudaModel::load(model.gpu(), &path)
        .with_context(|| format!("loading the draft model {} on the GPU", path.display()))?;
    kasoku_cuda::draft::check_vocabularies(draft.config.vocab, model.config.vocab)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    if !quiet {
        eprintln!(
            "loaded draft {} ({:?}, {} layers) on the same GPU in {:.2} s",
            path.display(),
            draft.config.arch,
            draft.config.n_layers,
            start.elapsed().as_secs_f64()
        );
    }
    Ok(Arc::new(draft))
}

/// A drafter for one sequence of up to `ctx` tokens on `target` with `draft`.
fn make_drafter(
    target: &Arc<CudaModel>,
    draft: &GpuDraft,
    ctx: usize,
) -> Result<Box<dyn Drafter>, kasoku::spec::DraftError> {
    Ok(match draft {
        GpuDraft::Model(model) => Box::new(CudaDraftDrafter::on_gpu(
            model.clone(),
            ctx,
            target.config.vocab,
            DraftModelConfig::default(),
        )?),
        GpuDraft::DFlash(weights) => Box::new(kasoku_cuda::dflash::dflash_drafter(
            target.clone(),
            weights.clone(),
            ctx,
            DFlashDrafterConfig::default(),
        )?),
    })
}

/// What makes `serve`'s sessions a drafter with `draft` on `target`'s GPU (one draft state
/// per session, of the session's context).
pub fn session_drafter(target: &GpuModel, draft: GpuDraft) -> kasoku_server::DeviceDrafter {
    let model = target.device.model().clone();
    Arc::new(move |ctx| Ok(make_drafter(&model, &draft, ctx)?))
}

/// The speculator of a session of `ctx` tokens on `target`: with `draft` (loaded by
/// [`load_for`]) for the speculation that asked for it, else what the GPU drafts without one.
pub fn speculator(
    spec: &SpecArgs,
    target: &GpuModel,
    draft: Option<&GpuDraft>,
    ctx: usize,
) -> Result<Option<Speculator>> {
    let Some(draft) = draft else {
        return Ok(device_speculator(
            spec.spec,
            spec.draft.is_some(),
            spec.policy(),
        )?);
    };
    let drafter = make_drafter(target.device.model(), draft, ctx)?;
    Ok(device_draft_speculator(spec.spec, drafter, spec.policy())?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(rel: &str) -> String {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures")
            .join(rel)
            .display()
            .to_string()
    }

    #[test]
    fn gguf_draft_models_run_on_the_gpu_and_the_other_drafters_do_not() {
        let gguf = fixture("llama/tiny/model-q4_0.gguf");
        let dflash = fixture("qwen2/tiny_dflash");
        for kind in [SpecKind::Draft, SpecKind::Auto] {
            assert!(drafts_with_model(kind, Some(&gguf)));
            assert_eq!(unsupported(kind, Some(&gguf)), None);
            // A name to resolve later.
            assert_eq!(unsupported(kind, Some("qwen2.5-coder-0.5b")), None);
        }
        assert!(!drafts_with_model(SpecKind::Ngram, Some(&gguf)));
        assert_eq!(unsupported(SpecKind::Ngram, Some(&gguf)), None);
        assert_eq!(unsupported(SpecKind::Auto, None), None);
        // A safetensors directory drafts on the CPU.
        let hf = fixture("llama/tiny");
        let why = unsupported(SpecKind::Draft, Some(&hf)).unwrap();
        assert!(why.contains("GGUF draft models"), "{why}");
        // MTP stays on the CPU.
        let why = unsupported(SpecKind::Mtp, None).unwrap();
        assert!(why.contains("prompt lookup only"), "{why}");
        // DFlash takes the GPU, with a DFlash checkpoint only.
        assert!(!drafts_with_model(SpecKind::Auto, Some(&dflash)));
        assert!(!drafts_with_dflash(SpecKind::Auto, Some(&gguf)));
        assert!(!drafts_with_dflash(SpecKind::Ngram, Some(&dflash)));
        for kind in [SpecKind::Auto, SpecKind::DFlash] {
            assert!(drafts_with_dflash(kind, Some(&dflash)));
            assert_eq!(unsupported(kind, Some(&dflash)), None);
        }
        // --spec dflash without a DFlash checkpoint has nothing to draft with on the GPU.
        assert!(unsupported(SpecKind::DFlash, Some(&gguf)).is_some());
    }
}
