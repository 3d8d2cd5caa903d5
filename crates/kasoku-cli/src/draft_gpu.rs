//! A draft model beside the target on the GPU (`--draft MODEL.gguf` with speculation `draft`
//! or `auto` on `--device cuda`): which drafts the GPU takes, loading one onto the target's
//! device with its vocabulary checked against the target's, and the drafters made with it
//! (`run`'s session speculator, `serve`'s drafter per session). The draft keeps its file's weight formats there
//! (`--draft-format` requantizes for the CPU's kernels only).

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use kasoku::engine::{device_draft_speculator, device_speculator, SpecKind, Speculator};
use kasoku::model::is_dflash_checkpoint;
use kasoku::spec::draft_model::DraftModelConfig;
use kasoku_cuda::{CudaDraftDrafter, CudaModel};

use crate::run_gpu::GpuModel;
use crate::spec_args::SpecArgs;

/// Whether speculation `kind` with `--draft draft` drafts with a draft model (not a DFlash
/// checkpoint, which runs on the CPU only).
pub fn drafts_with_model(kind: SpecKind, draft: Option<&str>) -> bool {
    matches!(kind, SpecKind::Draft | SpecKind::Auto)
        && draft.is_some_and(|d| !is_dflash_checkpoint(Path::new(d)))
}

/// Why speculation `kind` with `--draft draft` cannot run on the GPU path (None: it can),
/// before anything is loaded: MTP and DFlash drafters run on the CPU; a draft model must be
/// a GGUF file (one named by a known name is checked when it is resolved).
pub fn unsupported(kind: SpecKind, draft: Option<&str>) -> Option<String> {
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

/// What makes `serve`'s sessions a drafter with `draft` on `target`'s GPU (one draft state
/// per session, of the session's context).
pub fn session_drafter(target: &GpuModel, draft: Arc<CudaModel>) -> kasoku_server::DeviceDrafter {
    let vocab = target.device.model().config.vocab;
    Arc::new(move |ctx| {
        let drafter =
            CudaDraftDrafter::on_gpu(draft.clone(), ctx, vocab, DraftModelConfig::default())?;
        Ok(Box::new(drafter) as Box<dyn kasoku::spec::Drafter>)
    })
}

/// The speculator of a session of `ctx` tokens on `target`: with `draft` (loaded by [`load`])
/// for speculation `draft` and `auto`, else what the GPU drafts without one.
pub fn speculator(
    spec: &SpecArgs,
    target: &GpuModel,
    draft: Option<&Arc<CudaModel>>,
    ctx: usize,
) -> Result<Option<Speculator>> {
    let Some(draft) = draft.filter(|_| drafts_with_model(spec.spec, spec.draft.as_deref())) else {
        return Ok(device_speculator(
            spec.spec,
            spec.draft.is_some(),
            spec.policy(),
        )?);
    };
    let vocab = target.device.model().config.vocab;
    let drafter = CudaDraftDrafter::on_gpu(draft.clone(), ctx, vocab, DraftModelConfig::default())?;
    Ok(device_draft_speculator(
        spec.spec,
        Box::new(drafter),
        spec.policy(),
    )?)
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
        // DFlash and MTP stay on the CPU.
        assert!(!drafts_with_model(SpecKind::Auto, Some(&dflash)));
        for (kind, draft) in [
            (SpecKind::Auto, Some(dflash.as_str())),
            (SpecKind::DFlash, Some(dflash.as_str())),
            (SpecKind::Mtp, None),
        ] {
            let why = unsupported(kind, draft).unwrap();
            assert!(why.contains("prompt lookup only"), "{why}");
        }
    }
}
