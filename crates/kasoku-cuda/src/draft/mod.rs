//! Draft-model speculation with the target and the draft model on the same GPU (e.g.
//! Qwen2.5-Coder-0.5B drafting for the 1.5B): a `kasoku::spec::Drafter` whose draft model
//! is a [`CudaModel`] with its own `CudaState`, so `generate_greedy` or the engine's
//! `DeviceSession` verifies its trees on the target as any other drafter's.
//!
//! - [`tree`]: the tree policy (the CPU draft-model drafter's), over any draft passes.
//! - [`passes`]: what the policy needs of a draft model, and the GPU's passes for it.
//!
//! Only token ids go up and each tree row's best two tokens come back (20 bytes a node per
//! level); the draft model's KV cache follows the target's accepted tokens by commits of its
//! own pending tree, as on the CPU.

pub mod passes;
pub mod tree;

use std::sync::Arc;

use kasoku::spec::draft_model::DraftModelConfig;
use kasoku::spec::DraftError;

pub use passes::{CudaDraftPasses, DraftPasses};
pub use tree::{TreeDrafter, LEADING_CHAIN};

use crate::CudaModel;

/// The draft-model drafter on the GPU.
pub type CudaDraftDrafter = TreeDrafter<CudaDraftPasses>;

/// Whether a draft model of `draft_vocab` tokens can draft for a target of `target_vocab`:
/// the same tokenizer, padded vocabularies differing only in their unused tail (the CPU
/// drafter's rule). The error names both sizes.
pub fn check_vocabularies(draft_vocab: usize, target_vocab: usize) -> Result<(), DraftError> {
    if draft_vocab.abs_diff(target_vocab) > 1024 {
        return Err(DraftError::Incompatible(format!(
            "the draft model's vocabulary ({draft_vocab}) does not match the target's ({target_vocab})"
        )));
    }
    Ok(())
}

/// Token ids a draft model of `draft_vocab` scores under `config` for a target of
/// `target_vocab`: the first `config.vocab_rows` (a multiple of 8; 0: all), never an id the
/// target does not have.
pub fn scored_ids(config: &DraftModelConfig, draft_vocab: usize, target_vocab: usize) -> usize {
    let rows = if config.vocab_rows > 0 && config.vocab_rows < draft_vocab {
        config.vocab_rows.div_ceil(8) * 8
    } else {
        draft_vocab
    };
    rows.min(draft_vocab).min(target_vocab)
}

impl CudaDraftDrafter {
    /// A drafter with `model` (on the target's GPU) and room for `ctx_size` tokens, for a
    /// target of `target_vocab` tokens (checked as the CPU drafter checks it).
    pub fn on_gpu(
        model: Arc<CudaModel>,
        ctx_size: usize,
        target_vocab: usize,
        config: DraftModelConfig,
    ) -> Result<CudaDraftDrafter, DraftError> {
        let vocab = model.config.vocab;
        check_vocabularies(vocab, target_vocab)?;
        let scored = scored_ids(&config, vocab, target_vocab);
        let passes = CudaDraftPasses::new(model, ctx_size, scored)
            .map_err(|e| DraftError::Device(e.to_string()))?;
        Ok(TreeDrafter::new(passes, config))
    }
}

#[cfg(test)]
mod tests;
