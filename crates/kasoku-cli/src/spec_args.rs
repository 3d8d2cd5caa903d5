//! The speculative-decoding options shared by `run`, `bench` and `serve`, and turning them
//! into a session's speculator.

use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;
use kasoku::engine::{build_speculator_from, DraftSource, SpecKind, Speculator};

use kasoku::model::{is_dflash_checkpoint, DFlash, KvType, Model};
use kasoku::quant::{requantize, DType};
use kasoku::spec::PolicyConfig;

use crate::progress;

#[derive(Args, Debug, Clone)]
pub struct SpecArgs {
    /// Speculative decoding: none, ngram (prompt lookup), draft (a smaller model, --draft),
    /// mtp (the checkpoint's multi-token-prediction head), dflash (a DFlash block drafter,
    /// --draft DIR), or auto (the draft model or DFlash drafter if given, else the MTP head if
    /// present, else prompt lookup; drafting turns itself off when it does not pay).
    #[arg(long, default_value = "auto")]
    pub spec: SpecKind,
    /// Draft model for --spec draft (GGUF file, HF directory or known name; same tokenizer;
    /// with the target on a GPU, a GGUF file loaded on the same GPU),
    /// or a DFlash checkpoint directory for --spec dflash (config.json naming
    /// DFlashDraftModel + model.safetensors; it drafts with the target's embedding and head).
    #[arg(long)]
    pub draft: Option<String>,
    /// Most draft-tree nodes one target pass verifies (besides the root).
    #[arg(long, default_value_t = 8)]
    pub tree_budget: usize,
    /// Deepest level of a draft tree.
    #[arg(long, default_value_t = 8)]
    pub max_depth: usize,
    /// Always verify --tree-budget nodes instead of adapting the budget to measured cost and
    /// acceptance.
    #[arg(long)]
    pub fixed_budget: bool,
    /// Format of the draft model's matrices that its file stores in heavier ones, requantized
    /// at load (a drafter only guesses; the target's check keeps the output exact, and fewer
    /// bytes make each guess cheaper): q4_0, q8_0, or none to keep the file's formats. On a
    /// GPU the draft keeps its file's formats.
    #[arg(long, default_value = "q4_0")]
    pub draft_format: DraftFormat,
}

/// `--draft-format`: a format kasoku can requantize to, or none.
#[derive(Debug, Clone, Copy)]
pub struct DraftFormat(pub Option<DType>);

impl std::str::FromStr for DraftFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s.eq_ignore_ascii_case("none") {
            return Ok(DraftFormat(None));
        }
        match DType::from_name(s) {
            Some(d) if requantize::can_write(d) => Ok(DraftFormat(Some(d))),
            _ => Err(format!(
                "unknown draft format {s:?} (expected q4_0, q8_0 or none)"
            )),
        }
    }
}

impl SpecArgs {
    /// Resolves the drafters the repository ships (`kasoku fetch --list`) before a device
    /// is chosen: `--draft` naming one becomes its directory, checked against its pinned
    /// sha256s (a path that exists stays a path), and `--spec dflash` without `--draft`
    /// takes the one shipped for `model` (a known model's name), when there is one.
    pub fn resolve_shipped(&mut self, model: &str) -> Result<()> {
        let known = match self.draft.as_deref() {
            Some(name) if std::path::Path::new(name).exists() => None,
            Some(name) => kasoku_fetch::find_drafter(name),
            None if self.spec == SpecKind::DFlash => kasoku_fetch::drafter_for(model),
            None => None,
        };
        if let Some(known) = known {
            let dir = kasoku_fetch::locate_drafter(known)?;
            self.draft = Some(dir.display().to_string());
        }
        Ok(())
    }

    /// These options, with the drafter the repository ships for `model` (a known model's
    /// name) when speculation is `auto` without `--draft` and this checkout holds it, on
    /// either device (called once the device is chosen: DFlash runs on both). A drafter that
    /// is not there (a binary built elsewhere) leaves prompt lookup, with a note if its files
    /// do not match their pins.
    pub fn with_shipped_drafter(&self, model: &str, quiet: bool) -> SpecArgs {
        let mut spec = self.clone();
        let wanted = spec.draft.is_none() && spec.spec == SpecKind::Auto;
        let Some(known) = kasoku_fetch::drafter_for(model).filter(|_| wanted) else {
            return spec;
        };
        match kasoku_fetch::locate_drafter(known) {
            Ok(dir) => spec.draft = Some(dir.display().to_string()),
            Err(e @ kasoku_fetch::FetchError::Hash { .. }) if !quiet => {
                eprintln!("note: not drafting with {}: {e}", known.name)
            }
            Err(_) => {}
        }
        spec
    }

    pub fn policy(&self) -> PolicyConfig {
        PolicyConfig {
            max_budget: self.tree_budget,
            max_depth: self.max_depth.max(1),
            adaptive: !self.fixed_budget,
        }
    }

    /// Loads what `--draft` names, if anything: a DFlash drafter for `target` when it is a
    /// DFlash checkpoint directory, else a draft model with its KV caches as `kv_type` (f16
    /// where its head size cannot be stored so).
    pub fn load_draft(
        &self,
        target: &Model,
        kv_type: KvType,
        quiet: bool,
    ) -> Result<Option<DraftSource>> {
        let Some(name) = &self.draft else {
            return Ok(None);
        };
        let local = std::path::Path::new(name);
        if is_dflash_checkpoint(local) {
            let net = DFlash::load(local, target, self.draft_format.0)
                .with_context(|| format!("loading the DFlash drafter {name}"))?;
            return Ok(Some(DraftSource::DFlash(Arc::new(net))));
        }
        let path = progress::resolve_model(name, quiet)?;
        kasoku::engine::check_memory(
            &path,
            self.draft_format.0.map(Into::into),
            kv_type,
            kasoku::engine::available_memory(),
        )
        .context("loading the draft model")?;
        let mut model = Model::load_with(&path, self.draft_format.0.map(Into::into))
            .with_context(|| format!("loading the draft model {}", path.display()))?;
        if model.set_kv_type(kv_type).is_err() {
            model.set_kv_type(KvType::F16)?;
        }
        Ok(Some(DraftSource::Model(Arc::new(model))))
    }

    /// The speculator for a session on `target` (None: plain decoding).
    pub fn speculator(
        &self,
        target: &Arc<Model>,
        draft: Option<DraftSource>,
        ctx: usize,
    ) -> Result<Option<Speculator>> {
        Ok(build_speculator_from(
            self.spec,
            target,
            draft,
            ctx,
            self.policy(),
        )?)
    }
}

/// Bytes a loaded draft adds per token of context (its KV cache, or a DFlash drafter's
/// context rows).
pub fn draft_kv_bytes_per_token(draft: Option<&DraftSource>) -> usize {
    match draft {
        Some(DraftSource::Model(d)) => d.kv_bytes_per_token(),
        Some(DraftSource::DFlash(d)) => d.context_bytes_per_token(),
        None => 0,
    }
}

/// Activation scratch a loaded draft model needs (a DFlash drafter's is a block's: small).
pub fn draft_scratch_bytes(draft: Option<&DraftSource>) -> u64 {
    match draft {
        Some(DraftSource::Model(d)) => kasoku::model::footprint::scratch_bytes(&d.config),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        spec: SpecArgs,
    }

    fn spec(args: &[&str]) -> SpecArgs {
        Cli::parse_from(std::iter::once("kasoku").chain(args.iter().copied())).spec
    }

    #[test]
    fn auto_drafts_with_the_drafter_shipped_for_a_known_target() {
        let shipped = kasoku_fetch::locate_drafter(
            kasoku_fetch::find_drafter("qwen2.5-coder-1.5b-dflash").unwrap(),
        )
        .unwrap();
        let with = |args: &[&str], model: &str| {
            spec(args)
                .with_shipped_drafter(model, true)
                .draft
                .map(std::path::PathBuf::from)
        };
        assert_eq!(with(&[], "qwen2.5-coder-1.5b"), Some(shipped.clone()));
        let mut dflash = spec(&["--spec", "dflash"]);
        dflash.resolve_shipped("qwen2.5-coder-1.5b").unwrap();
        assert_eq!(dflash.draft.map(std::path::PathBuf::from), Some(shipped));
        // Not for another target, a path, other speculation, or over an explicit --draft.
        assert_eq!(with(&[], "qwen2.5-coder-0.5b"), None);
        assert_eq!(with(&[], "/models/qwen2.5-coder-1.5b.gguf"), None);
        assert_eq!(with(&["--spec", "ngram"], "qwen2.5-coder-1.5b"), None);
        assert_eq!(
            with(&["--draft", "d.gguf"], "qwen2.5-coder-1.5b"),
            Some("d.gguf".into())
        );
    }

    #[test]
    fn a_shipped_drafters_name_becomes_its_directory() {
        let mut s = spec(&["--draft", "qwen2.5-coder-1.5b-dflash"]);
        s.resolve_shipped("qwen2.5-coder-0.5b").unwrap();
        let dir = std::path::PathBuf::from(s.draft.unwrap());
        assert!(is_dflash_checkpoint(&dir), "{}", dir.display());
        let mut other = spec(&["--draft", "qwen2.5-coder-0.5b"]);
        other.resolve_shipped("qwen2.5-coder-1.5b").unwrap();
        assert_eq!(other.draft.as_deref(), Some("qwen2.5-coder-0.5b"));
        // auto takes it once the device is chosen (with_shipped_drafter); other targets have
        // none.
        for (args, model) in [
            (&[][..], "qwen2.5-coder-1.5b"),
            (&["--spec", "dflash"][..], "m.gguf"),
        ] {
            let mut s = spec(args);
            s.resolve_shipped(model).unwrap();
            assert_eq!(s.draft, None);
        }
    }
}
