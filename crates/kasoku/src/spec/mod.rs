//! Speculative decoding: drafters propose token trees, the target model verifies a whole tree
//! in one forward pass (`model::verify`), and the longest path the target agrees with is kept,
//! plus the target's own next token. The output is token for token what plain decoding gives
//! with the same sampling settings and seed.
//!
//! - [`drafter`]: the interface every drafter implements (and what it is told after a pass).
//! - [`accept`]: the walk down a verified tree with the target's sampler.
//! - [`ngram`]: prompt lookup: continuations of earlier occurrences of the recent suffix.
//! - [`draft_model`]: a smaller model with the same tokenizer, kept in sync by commits.
//! - [`mtp`]: Qwen3.5's multi-token-prediction head.
//! - [`dflash`]: a DFlash block drafter (the target's layer outputs in, one block of
//!   marginals out) and its trees.
//! - [`marginal_tree`]: the best paths under a product of per-depth marginals.
//! - [`merged`]: several drafters' branches in one tree.
//! - [`choice`]: one of several drafters per pass, by measured tokens per second.
//! - [`policy`]: how many nodes a pass may verify, from measured cost and acceptance.
//! - [`stats`]: accepted lengths, drafting and verifying time.

pub mod accept;
pub mod choice;
pub mod dflash;
pub mod draft_model;
pub mod drafter;
pub mod marginal_tree;
pub mod merged;
pub mod mtp;
pub mod ngram;
pub mod policy;
pub mod stats;

pub use accept::{accept_path, accept_path_constrained, Acceptance};
pub use choice::ChoiceDrafter;
pub use dflash::{
    dflash_tree, BlockDrafter, CpuDFlash, DFlashBlocks, DFlashDrafter, DFlashDrafterConfig,
};
pub use draft_model::DraftModelDrafter;
pub use drafter::{Accepted, DeviceTaps, DraftError, DraftRequest, Drafter, Features};
pub use merged::MergedDrafter;
pub use mtp::MtpDrafter;
pub use ngram::NgramDrafter;
pub use policy::{Policy, PolicyConfig};
pub use stats::SpecStats;
