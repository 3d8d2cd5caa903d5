//! The drafter interface. A drafter sees the sequence so far and proposes a token tree rooted
//! at the last sampled token (the one the target has not consumed yet); after the target's
//! pass it is told which tokens were committed, with the target's hidden states for them when
//! it asked for those (MTP reads them today; DFlash and Weaver drafters will too).

use std::any::Any;

use crate::model::{ModelError, TokenTree};

#[derive(Debug, thiserror::Error)]
pub enum DraftError {
    #[error("drafter: {0}")]
    Model(#[from] ModelError),
    #[error("drafter: {0}")]
    Incompatible(String),
    /// The device a drafter runs on failed (a GPU's error, with the driver's words).
    #[error("drafter: the device failed: {0}")]
    Device(String),
}

/// What a drafter is asked for.
#[derive(Clone, Copy, Debug)]
pub struct DraftRequest<'a> {
    /// Every token of the sequence: prompt, generated tokens, and last the root (sampled, not
    /// yet in the target's state).
    pub tokens: &'a [u32],
    /// Nodes the tree may have besides the root.
    pub budget: usize,
    /// Deepest level a node may sit at (the root is level 0).
    pub max_depth: usize,
}

/// The target's features of a run of tokens, as a drafter asked for them.
#[derive(Clone, Copy, Debug, Default)]
pub struct Features<'a> {
    /// Final-normed hidden states, `tokens × hidden` (when [`Drafter::wants_hidden`]).
    pub hidden: Option<&'a [f32]>,
    /// Outputs of the decoder layers [`Drafter::tap_layers`] (before the final norm),
    /// `tokens × taps × hidden`, token by token.
    pub taps: Option<&'a [f32]>,
    /// The same layer outputs left where the target computed them, for a drafter on the same
    /// device ([`Drafter::reads_device_taps`]): then `taps` is `None` (nothing crossed to the
    /// host).
    pub device_taps: Option<DeviceTaps<'a>>,
}

/// Layer outputs a target recorded on its device for the rows of its last pass, handed to a
/// drafter that reads them there (a GPU drafter beside a GPU target) instead of a host copy.
/// What `source` is belongs to the device: its drafter downcasts it.
#[derive(Clone, Copy, Debug)]
pub struct DeviceTaps<'a> {
    /// The device state's handle on its recorded rows ([`Drafter::reads_device_taps`]).
    pub source: &'a (dyn Any + Send + Sync),
    /// The rows of the last pass the tokens' features are, in token order (a prefill's rows,
    /// or the nodes of the path just committed).
    pub rows: &'a [usize],
}

/// What the target committed in a pass.
#[derive(Clone, Copy, Debug)]
pub struct Accepted<'a> {
    /// The committed tokens, in order (the pass's root first); the target's state now holds
    /// `committed_len` tokens, these being the last of them.
    pub tokens: &'a [u32],
    pub committed_len: usize,
    /// The target's features of those tokens, from the verification pass.
    pub features: Features<'a>,
}

/// A source of draft trees.
pub trait Drafter: Send {
    /// A short name for statistics (`ngram`, `draft`, `mtp`).
    fn name(&self) -> &'static str;

    /// Whether [`Accepted::hidden`] and the prompt's hidden states are wanted (the target
    /// then computes them; they cost a little).
    fn wants_hidden(&self) -> bool {
        false
    }

    /// Decoder layers whose outputs the drafter reads for committed tokens (DFlash-style
    /// drafters condition on a few of the target's layers); none by default.
    fn tap_layers(&self) -> Vec<usize> {
        Vec::new()
    }

    /// Whether the drafter reads its layer outputs in place from `source`, a device state's
    /// handle on its recorded rows: a caller that has one then passes
    /// [`Features::device_taps`] instead of copying the rows to the host. False by default.
    fn reads_device_taps(&self, source: &(dyn Any + Send + Sync)) -> bool {
        let _ = source;
        false
    }

    /// Whether a draft costs about the same whatever its depth (a block drafter's one pass)
    /// rather than a pass per level (a draft model); the budget policy weighs it so.
    fn flat_draft_cost(&self) -> bool {
        false
    }

    /// A generation starts: the target's state holds all of `prompt`; `features` (what the
    /// drafter asked for) cover its last tokens, the ones just computed (the others came from
    /// a cache). Drafters resynchronise their own state here.
    fn start(&mut self, prompt: &[u32], features: Features) -> Result<(), DraftError>;

    /// Brings the drafter's own state up to `tokens` (the sequence so far, the root last)
    /// before a draft is asked for and timed: after passes decoded without drafting, a draft
    /// model has tokens to catch up on, and that one-off work must not count as the cost of
    /// drafting (the budget policy would then keep drafting off). Nothing to do by default.
    fn catch_up(&mut self, tokens: &[u32]) -> Result<(), DraftError> {
        let _ = tokens;
        Ok(())
    }

    /// A tree rooted at `req.tokens.last()` within the budget; a lone root means no guess.
    fn draft(&mut self, req: &DraftRequest) -> Result<TokenTree, DraftError>;

    /// The target committed `accepted.tokens`.
    fn accept(&mut self, accepted: &Accepted) -> Result<(), DraftError>;
}
