//! The speculative-decoding options shared by `run`, `bench` and `serve`, and turning them
//! into a session's speculator.

use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;
use kasoku::engine::{build_speculator, SpecKind, Speculator};

use kasoku::model::{KvType, Model};
use kasoku::quant::{requantize, DType};
use kasoku::spec::PolicyConfig;

use crate::progress;

#[derive(Args, Debug, Clone)]
pub struct SpecArgs {
    /// Speculative decoding: none, ngram (prompt lookup), draft (a smaller model, --draft),
    /// mtp (the checkpoint's multi-token-prediction head), or auto (the draft model if given,
    /// else the MTP head if present, else prompt lookup; drafting turns itself off when it
    /// does not pay).
    #[arg(long, default_value = "auto")]
    pub spec: SpecKind,
    /// Draft model for --spec draft (GGUF file, HF directory or known name; same tokenizer).
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
    /// bytes make each guess cheaper): q4_0, q8_0, or none to keep the file's formats.
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
    pub fn policy(&self) -> PolicyConfig {
        PolicyConfig {
            max_budget: self.tree_budget,
            max_depth: self.max_depth.max(1),
            adaptive: !self.fixed_budget,
        }
    }

    /// Loads the draft model, if one was named, with its KV caches as `kv_type` (f16 where its
    /// head size cannot be stored so).
    pub fn load_draft(&self, kv_type: KvType, quiet: bool) -> Result<Option<Arc<Model>>> {
        let Some(name) = &self.draft else {
            return Ok(None);
        };
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
        Ok(Some(Arc::new(model)))
    }

    /// The speculator for a session on `target` (None: plain decoding).
    pub fn speculator(
        &self,
        target: &Arc<Model>,
        draft: Option<Arc<Model>>,
        ctx: usize,
    ) -> Result<Option<Speculator>> {
        Ok(build_speculator(
            self.spec,
            target,
            draft,
            ctx,
            self.policy(),
        )?)
    }
}
