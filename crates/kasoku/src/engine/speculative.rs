//! The speculative decode loop. Each cycle: the policy sets a node budget; the drafter proposes
//! a tree rooted at the last sampled token; the target verifies every node in one pass; the
//! target's sampler walks down the tree (`spec::accept_path`); the emitted tokens go out one
//! by one exactly as plain decoding would emit them, and the state commits the path of the
//! tokens plain decoding would have fed. With budget 0 the cycle is a plain decoding step.

use std::time::Instant;

use super::session::{EngineError, FinishReason, Run, Session};
use crate::model::{Batch, Output, TokenTree};
use crate::spec::{
    accept_path_constrained, Accepted, DraftError, DraftRequest, Drafter, Features, Policy,
    PolicyConfig, SpecStats,
};

impl From<DraftError> for EngineError {
    fn from(e: DraftError) -> Self {
        EngineError::Draft(e.to_string())
    }
}

/// A drafter and the policy that sizes its trees: attach to a [`Session`] with
/// [`Session::set_speculator`].
pub struct Speculator {
    pub drafter: Box<dyn Drafter>,
    pub policy: Policy,
    stats: SpecStats,
    /// What the last verification returned (its buffers reused from pass to pass).
    out: Output,
}

impl Speculator {
    pub fn new(drafter: Box<dyn Drafter>, config: PolicyConfig) -> Speculator {
        let stats = SpecStats {
            drafter: drafter.name().to_string(),
            ..SpecStats::default()
        };
        let mut policy = Policy::new(config);
        policy.set_flat_draft_cost(drafter.flat_draft_cost());
        Speculator {
            drafter,
            policy,
            stats,
            out: Output::default(),
        }
    }

    /// This generation's statistics (and a fresh set for the next one).
    pub(super) fn take_stats(&mut self) -> SpecStats {
        let fresh = SpecStats {
            drafter: self.stats.drafter.clone(),
            ..SpecStats::default()
        };
        std::mem::replace(&mut self.stats, fresh)
    }

    /// The drafter's tree rooted at `token` (the last of `history`) within `budget` nodes
    /// below the root, and the time drafting took (`None`: budget 0, nothing drafted). A tree
    /// not rooted at `token` or over budget is replaced by the root alone.
    pub(super) fn draft_tree(
        &mut self,
        history: &[u32],
        token: u32,
        budget: usize,
    ) -> Result<(TokenTree, Option<std::time::Duration>), EngineError> {
        if budget == 0 {
            return Ok((TokenTree::chain(&[token]), None));
        }
        let t = Instant::now();
        self.drafter.catch_up(history)?;
        self.stats.draft_time += t.elapsed();
        let t = Instant::now();
        let tree = self.drafter.draft(&DraftRequest {
            tokens: history,
            budget,
            max_depth: self.policy.config.max_depth,
        })?;
        let elapsed = t.elapsed();
        self.stats.draft_time += elapsed;
        // A drafter must root its tree at the token; anything else is ignored.
        if tree.is_empty() || tree.token(0) != token || tree.len() > budget + 1 {
            Ok((TokenTree::chain(&[token]), Some(elapsed)))
        } else {
            Ok((tree, Some(elapsed)))
        }
    }

    /// Records a verification of `tree` that accepted `accepted` drafts (see [`record_pass`]).
    pub(super) fn record_pass(
        &mut self,
        tree: &TokenTree,
        accepted: usize,
        draft_time: Option<std::time::Duration>,
        verify_time: std::time::Duration,
    ) {
        record_pass(
            &mut self.stats,
            &mut self.policy,
            tree,
            accepted,
            draft_time,
            verify_time,
        );
    }

    /// Decodes from the first sampled token `first` until the answer ends. `prompt` is in
    /// the session's state; `session.out` holds the target's hidden states and layer
    /// outputs of its newly computed part when the drafter wants them.
    pub(super) fn decode(
        &mut self,
        session: &mut Session,
        run: &mut Run,
        first: u32,
        prompt: &[u32],
    ) -> Result<FinishReason, EngineError> {
        let model = session.model.clone();
        let want_hidden = self.drafter.wants_hidden();
        let taps = self.drafter.tap_layers();
        let prompt_features = Features {
            hidden: want_hidden.then_some(&session.out.hidden[..]),
            taps: (!taps.is_empty()).then_some(&session.out.taps[..]),
            device_taps: None,
        };
        self.drafter.start(prompt, prompt_features)?;
        let mut token = first;
        if let Some(finish) = run.take(token, &session.out.logits)? {
            return Ok(finish);
        }
        loop {
            // `token` is emitted and roots this pass.
            let len = session.state.len();
            let ctx = session.ctx_size();
            if len + 1 >= ctx {
                return Ok(FinishReason::ContextFull);
            }
            // Room for drafts: the context, and the answer's remaining length.
            let room = (ctx - len - 2).min(run.options.max_tokens - run.generated.len());
            let budget = self.policy.budget().min(room);

            let (tree, draft_time) = self.draft_tree(&run.history, token, budget)?;

            let t = Instant::now();
            let batch = Batch::tree(&tree).hidden(want_hidden).taps(&taps);
            model.run(&mut session.state, &batch, &mut self.out)?;
            let verified = &self.out;
            let acceptance = accept_path_constrained(
                &tree,
                &verified.logits,
                model.config.vocab,
                &run.options.sampling,
                &run.history,
                run.constraint.as_deref(),
            )?;
            let verify_time = t.elapsed();
            run.stats.decode_passes += 1;
            record_pass(
                &mut self.stats,
                &mut self.policy,
                &tree,
                acceptance.accepted_drafts(),
                draft_time,
                verify_time,
            );

            // Emit as plain decoding would; it would have fed every emitted token but the last.
            let mut finish = None;
            let mut fed = acceptance.path.len();
            let vocab = model.config.vocab;
            for (j, &y) in acceptance.tokens.iter().enumerate() {
                run.stats.decode_tokens += 1;
                // Token j was sampled from the logits of the j-th node of the path.
                let node = acceptance.path[j];
                let logits = &verified.logits[node * vocab..(node + 1) * vocab];
                if let Some(f) = run.take(y, logits)? {
                    finish = Some(f);
                    fed = j + 1;
                    break;
                }
            }
            let path = &acceptance.path[..fed.min(acceptance.path.len())];
            model.commit(&mut session.state, path)?;
            let committed: Vec<u32> = path.iter().map(|&i| tree.token(i)).collect();
            session.tokens.extend_from_slice(&committed);
            // The target's features of the committed nodes, as the drafter asked for them.
            let h = model.config.hidden;
            let gather = |src: &[f32], width: usize| -> Vec<f32> {
                path.iter()
                    .flat_map(|&i| src[i * width..(i + 1) * width].iter().copied())
                    .collect()
            };
            let hidden_rows = want_hidden.then(|| gather(&verified.hidden, h));
            let tap_rows = (!taps.is_empty()).then(|| gather(&verified.taps, taps.len() * h));
            self.drafter.accept(&Accepted {
                tokens: &committed,
                committed_len: session.state.len(),
                features: Features {
                    hidden: hidden_rows.as_deref(),
                    taps: tap_rows.as_deref(),
                    device_taps: None,
                },
            })?;
            if let Some(f) = finish {
                return Ok(f);
            }
            // The last sampled token (it matched no child) roots the next pass.
            token = *acceptance
                .tokens
                .last()
                .expect("a pass samples at least one token");
        }
    }
}

/// Records a verification of `tree` that accepted `accepted` drafts: the statistics (for
/// trees with drafts) and the policy's measurements.
fn record_pass(
    stats: &mut SpecStats,
    policy: &mut Policy,
    tree: &TokenTree,
    accepted: usize,
    draft_time: Option<std::time::Duration>,
    verify_time: std::time::Duration,
) {
    if tree.len() > 1 {
        stats.verify_time += verify_time;
        stats.record(tree.len(), accepted);
    }
    policy.record(
        tree.len(),
        tree.max_depth(),
        accepted,
        draft_time,
        verify_time,
    );
}

/// Which drafter a session uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpecKind {
    /// Plain decoding.
    None,
    /// Prompt lookup.
    Ngram,
    /// A smaller model (`draft` must be given).
    Draft,
    /// The checkpoint's multi-token-prediction head.
    Mtp,
    /// A DFlash block drafter (a DFlash checkpoint must be given), its trees merged with
    /// prompt lookup's branches; prompt lookup alone is used instead on the passes where it
    /// measurably delivers more tokens per second.
    DFlash,
    /// The best available: the given draft model or DFlash drafter, else the MTP head if
    /// the checkpoint has one, else prompt lookup. The adaptive policy turns drafting off
    /// where it does not pay. (Merging prompt lookup's branches into the draft model's trees
    /// measured 6% slower on the code prompts of bench/spec.py, so auto does not;
    /// `MergedDrafter` remains.)
    Auto,
}

impl std::str::FromStr for SpecKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "none" => SpecKind::None,
            "ngram" => SpecKind::Ngram,
            "draft" => SpecKind::Draft,
            "mtp" => SpecKind::Mtp,
            "dflash" => SpecKind::DFlash,
            "auto" => SpecKind::Auto,
            other => {
                return Err(format!(
                "unknown speculation '{other}' (expected none, ngram, draft, mtp, dflash or auto)"
            ))
            }
        })
    }
}

/// What `--draft` named: a draft model, or a DFlash drafter loaded for the target.
#[derive(Clone)]
pub enum DraftSource {
    Model(std::sync::Arc<crate::model::Model>),
    DFlash(std::sync::Arc<crate::model::DFlash>),
}

/// Builds the speculator for `kind` (`None` for plain decoding). `draft` is the draft model,
/// when one was given; `ctx_size` the session's context.
pub fn build_speculator(
    kind: SpecKind,
    target: &std::sync::Arc<crate::model::Model>,
    draft: Option<std::sync::Arc<crate::model::Model>>,
    ctx_size: usize,
    policy: PolicyConfig,
) -> Result<Option<Speculator>, EngineError> {
    build_speculator_from(
        kind,
        target,
        draft.map(DraftSource::Model),
        ctx_size,
        policy,
    )
}

/// [`build_speculator`] with any [`DraftSource`].
pub fn build_speculator_from(
    kind: SpecKind,
    target: &std::sync::Arc<crate::model::Model>,
    draft: Option<DraftSource>,
    ctx_size: usize,
    policy: PolicyConfig,
) -> Result<Option<Speculator>, EngineError> {
    use crate::spec::{
        draft_model::DraftModelConfig, ChoiceDrafter, DFlashDrafter, DFlashDrafterConfig,
        DraftModelDrafter, MtpDrafter, NgramDrafter,
    };
    let draft_model =
        |d: std::sync::Arc<crate::model::Model>| -> Result<Box<dyn Drafter>, EngineError> {
            Ok(Box::new(DraftModelDrafter::new(
                d,
                ctx_size,
                target.config.vocab,
                DraftModelConfig::default(),
            )?))
        };
    let dflash =
        |net: std::sync::Arc<crate::model::DFlash>| -> Result<Box<dyn Drafter>, EngineError> {
            let block = DFlashDrafter::new(target.clone(), net, DFlashDrafterConfig::default())?;
            Ok(Box::new(ChoiceDrafter::new(vec![
                Box::new(block),
                Box::new(NgramDrafter::default()),
            ])))
        };
    let drafter: Box<dyn Drafter> = match (kind, draft) {
        (SpecKind::None, _) => return Ok(None),
        (SpecKind::Ngram, _) => Box::new(NgramDrafter::default()),
        (SpecKind::Mtp, _) => Box::new(MtpDrafter::new(target.clone(), ctx_size)?),
        (SpecKind::Draft, Some(DraftSource::Model(d))) => draft_model(d)?,
        (SpecKind::Draft, Some(DraftSource::DFlash(_))) => {
            return Err(EngineError::Draft(
                "the draft is a DFlash checkpoint: use speculation 'dflash' or 'auto'".into(),
            ))
        }
        (SpecKind::Draft, None) => {
            return Err(EngineError::Draft(
                "speculation 'draft' needs a draft model (--draft PATH)".into(),
            ))
        }
        (SpecKind::DFlash, Some(DraftSource::DFlash(net))) => dflash(net)?,
        (SpecKind::DFlash, _) => {
            return Err(EngineError::Draft(
                "speculation 'dflash' needs a DFlash checkpoint directory (--draft PATH)".into(),
            ))
        }
        (SpecKind::Auto, Some(DraftSource::Model(d))) => draft_model(d)?,
        (SpecKind::Auto, Some(DraftSource::DFlash(net))) => dflash(net)?,
        (SpecKind::Auto, None) if target.mtp.is_some() => {
            Box::new(MtpDrafter::new(target.clone(), ctx_size)?)
        }
        (SpecKind::Auto, None) => Box::new(NgramDrafter::default()),
    };
    Ok(Some(Speculator::new(drafter, policy)))
}
