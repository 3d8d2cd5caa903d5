//! Generation on a device that holds the weights and the KV cache itself (a GPU): the host
//! sees token ids, and a row of logits only when it asks for one.
//!
//! A device implements [`DeviceModel`] (makes states) and [`DeviceState`] (passes over one
//! sequence: append tokens, verify a tree, commit a path, the last row's logits on request).
//! [`DeviceSession`] is the [`Generator`] over such a state, with the CPU
//! [`Session`](super::Session)'s
//! semantics: the same option checks, the same `Run` that applies stop tokens, `max_tokens`,
//! constraints, log-probabilities and the (seed, position)-keyed sampler to host logits, so the
//! same logits give the same tokens on either. What crosses from the device per token:
//!
//! - greedy requests without penalties, constraint or log-probabilities: the device's argmax
//!   (4 bytes), and with a speculator (prompt lookup, or a drafter on the device such as a
//!   draft model on the same GPU) one id per node of each verified tree;
//! - sampled top-k requests without constraint or log-probabilities, on a device that
//!   selects ([`DeviceState::max_top_logits`]): the row's `top_k` largest logits, one more
//!   per penalized token, and the penalized tokens' own logits (8 and 4 bytes each), from
//!   which the host draws exactly what the whole row would give ([`sampler::TopKPlan`],
//!   [`sampler::penalized_top_k`], [`sampler::draw`]); with a speculator, the same per node
//!   the sampler walks through;
//! - every other request: a row of logits (`vocab × 4` bytes, 608 KB for Qwen2.5's 151,936
//!   tokens) per token sampled on the host; with a speculator, the rows of the nodes the
//!   sampler walks through (the accepted path and the node after it), fetched one by one.
//!
//! With a speculator the output is plain decoding's token for token (the walk samples each
//! node as plain decoding would sample there, under the constraint's fork), provided the
//! device computes each row the same way whatever the batch, as the CPU does.
//!
//! The session keeps what its state holds and reuses the longest common prefix of the next
//! prompt (attention states truncate); a server's shared prefix cache holds CPU states and is
//! not used. A device error fails the request and resets the state, never falls back.

#![warn(missing_docs)]

use std::any::Any;
use std::sync::Mutex;
use std::time::Instant;

use super::generator::Generator;
use super::prefix_cache::PrefixCache;
use super::session::{Emitted, EngineError, FinishReason, Flow, GenerateOptions, Generation, Run};
use super::speculative::{SpecKind, Speculator};
use super::stats::GenerationStats;
use crate::constraint::Constraint;
use crate::model::TokenTree;
use crate::sampler;
use crate::spec::{Accepted, DeviceTaps, Drafter, Features, NgramDrafter, PolicyConfig};

/// Prompt tokens per pass between cancellation checks.
const PREFILL_BLOCK: usize = 512;

/// A row of logits of the last pass: the last row of a [`DeviceState::feed`], or a node of a
/// [`DeviceState::verify`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitsRow {
    /// The last row of the last feed.
    Last,
    /// This node of the last verification.
    Node(usize),
}

/// One sequence's state on a device and the passes over it.
pub trait DeviceState {
    /// Committed positions.
    fn len(&self) -> usize;
    /// Whether no position is committed.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Positions it can hold.
    fn max_len(&self) -> usize;
    /// Most nodes of a tree [`DeviceState::verify`] takes.
    fn max_tree(&self) -> usize;
    /// Forgets every position from `len` on (`len` ≤ [`DeviceState::len`]). A state that
    /// cannot rewind (recurrent layers) may keep less, down to nothing: callers read
    /// [`DeviceState::len`] after.
    fn truncate(&mut self, len: usize);
    /// Appends `tokens` and returns the greedy token after the last one (its row's argmax,
    /// the lowest id on ties, as [`crate::sampler::argmax`]).
    fn feed(&mut self, tokens: &[u32]) -> Result<u32, EngineError>;
    /// The logits of the last row of the last [`DeviceState::feed`], copied into `out`
    /// (`vocab` values; `out` is overwritten).
    fn last_logits(&mut self, out: &mut Vec<f32>) -> Result<(), EngineError>;
    /// The logits of node `node` of the last [`DeviceState::verify`], copied into `out`.
    fn node_logits(&mut self, node: usize, out: &mut Vec<f32>) -> Result<(), EngineError>;
    /// Logits per row (the vocabulary).
    fn vocab(&self) -> usize;
    /// Most logits [`DeviceState::top_logits`] selects in one call (0: this device hands back
    /// whole rows only).
    fn max_top_logits(&self) -> usize {
        0
    }
    /// The `count` largest logits of `row` as (id, logit) pairs in any order into `top` (which
    /// ones: the first `count` in the sampler's order, [`sampler::by_logit`], ties to the lower
    /// id), and the logits of tokens `ids` (each below the vocabulary), in that order, into
    /// `gathered`: what a top-k draw needs, without copying the row. `count` is at most
    /// [`DeviceState::max_top_logits`] and below the vocabulary.
    fn top_logits(
        &mut self,
        row: LogitsRow,
        count: usize,
        ids: &[u32],
        top: &mut Vec<(u32, f32)>,
        gathered: &mut Vec<f32>,
    ) -> Result<(), EngineError> {
        let _ = (row, count, ids, top, gathered);
        Err(EngineError::Device(
            "this device hands back whole rows of logits only".into(),
        ))
    }
    /// Makes every later pass record the outputs of decoder layers `layers` (before the final
    /// norm) for each of its rows, for [`DeviceState::tap_rows`]: a drafter's features
    /// ([`Drafter::tap_layers`]). An empty list stops recording. A device that cannot record
    /// them refuses any other list.
    fn set_tap_layers(&mut self, layers: &[usize]) -> Result<(), EngineError> {
        if layers.is_empty() {
            return Ok(());
        }
        Err(EngineError::Device(
            "this device does not record layer outputs for a drafter".into(),
        ))
    }
    /// The recorded layer outputs of rows `rows` of the last pass (a feed's rows, or nodes of
    /// the last verification, such as the path just committed) into `out`: `rows.len() ×
    /// taps × hidden` values, row by row, each row's taps in the order they were asked for.
    fn tap_rows(&mut self, rows: &[usize], out: &mut Vec<f32>) -> Result<(), EngineError> {
        let _ = (rows, out);
        Err(EngineError::Device(
            "this device does not record layer outputs for a drafter".into(),
        ))
    }
    /// The handle on the layer outputs the last pass recorded ([`DeviceState::set_tap_layers`])
    /// that a drafter on the same device reads in place ([`Drafter::reads_device_taps`],
    /// [`Features::device_taps`]), so they need not cross to the host; `None` (the default)
    /// when the device has none.
    fn device_taps(&self) -> Option<&(dyn Any + Send + Sync)> {
        None
    }
    /// Runs every node of `tree` (its root the last sampled token, not yet in the state) and
    /// returns each node's greedy next token; the tree stays pending until a commit.
    fn verify(&mut self, tree: &TokenTree) -> Result<Vec<u32>, EngineError>;
    /// Keeps the root-to-node `path` of the pending tree; the state grows by its length.
    fn commit(&mut self, path: &[usize]) -> Result<(), EngineError>;
}

/// A model loaded on a device: shared by the sessions it makes states for.
pub trait DeviceModel: Send + Sync {
    /// Where it runs, in words (`cuda:0`).
    fn device(&self) -> String;
    /// Rows of its embedding (token ids below this are valid).
    fn vocab(&self) -> usize;
    /// The context it was trained for.
    fn max_context(&self) -> usize;
    /// A new empty state for `max_len` positions (memory on the device, allocated now).
    fn new_state(&self, max_len: usize) -> Result<Box<dyn DeviceState>, EngineError>;
}

/// Whether only token ids need cross from the device for `options`: greedy, and nothing
/// that reads or changes the logits on the host.
pub fn ids_only(options: &GenerateOptions) -> bool {
    options.sampling.is_greedy()
        && !options.sampling.has_penalties()
        && options.constraint.is_none()
        && options.logprobs.is_none()
}

/// The speculator a device session drafts with for speculation `kind` (`draft_given`: a
/// draft model or DFlash checkpoint was named): prompt lookup for `ngram`, and for `auto`
/// without a draft; `None` for `none`. Other drafters run on the CPU only: an error saying so.
/// The budget adapts as on the CPU (unless `policy` fixes it), from measurements that leave
/// out the first pass of each tree size and the first draft ([`device_policy`]).
pub fn device_speculator(
    kind: SpecKind,
    draft_given: bool,
    policy: PolicyConfig,
) -> Result<Option<Speculator>, EngineError> {
    match kind {
        SpecKind::None => return Ok(None),
        SpecKind::Ngram => {}
        SpecKind::Auto if !draft_given => {}
        _ => {
            return Err(EngineError::Draft(
                "the GPU drafts with prompt lookup only, or a draft model its caller loads on it (speculation ngram, auto without a draft, none, or draft and auto with a GGUF draft model where the caller supports it); MTP and DFlash drafters run on the CPU"
                    .into(),
            ))
        }
    }
    Ok(Some(device_policy(Speculator::new(
        Box::new(NgramDrafter::default()),
        policy,
    ))))
}

/// `spec` measuring a device's passes: the first pass of each tree size captures the graph
/// of that size (tens of passes' time, once), and the drafter's first draft its own, so
/// those are left out of the costs the budget is chosen from.
fn device_policy(mut spec: Speculator) -> Speculator {
    spec.policy.set_first_pass_warms_up(true);
    spec
}

/// The speculator a device session drafts with when the caller made a drafter that runs on
/// the device itself (a draft model or a DFlash drafter on the same GPU): that drafter for
/// speculation `draft`, `dflash` and `auto`, its budget chosen as in [`device_speculator`];
/// other kinds as [`device_speculator`] takes them with a draft given (prompt lookup for
/// `ngram`, `None` for `none`, the CPU-only drafters refused).
pub fn device_draft_speculator(
    kind: SpecKind,
    drafter: Box<dyn Drafter>,
    policy: PolicyConfig,
) -> Result<Option<Speculator>, EngineError> {
    match kind {
        SpecKind::Draft | SpecKind::DFlash | SpecKind::Auto => {
            Ok(Some(device_policy(Speculator::new(drafter, policy))))
        }
        _ => device_speculator(kind, true, policy),
    }
}

/// A conversation on a device: its state and the tokens in it, and an optional speculator
/// that drafts greedy, ids-only requests.
pub struct DeviceSession {
    state: Box<dyn DeviceState>,
    device: String,
    /// The tokens whose effects are in `state`, in order.
    tokens: Vec<u32>,
    spec: Option<Speculator>,
    /// The last row's logits, when a request needed them on the host.
    logits: Vec<f32>,
    /// The rows of a verified tree's walk, when a request needs them on the host (buffers
    /// kept from pass to pass).
    rows: Vec<Vec<f32>>,
    /// A device's top-k selection and gathered logits (buffers kept from draw to draw).
    top: Vec<(u32, f32)>,
    gathered: Vec<f32>,
    /// Layer outputs read for a drafter (kept from pass to pass).
    taps: Vec<f32>,
}

impl DeviceSession {
    /// A session over an empty `state` on `device` (named for statistics).
    pub fn new(state: Box<dyn DeviceState>, device: impl Into<String>) -> DeviceSession {
        DeviceSession {
            state,
            device: device.into(),
            tokens: Vec::new(),
            spec: None,
            logits: Vec::new(),
            rows: Vec::new(),
            top: Vec::new(),
            gathered: Vec::new(),
            taps: Vec::new(),
        }
    }

    /// A session of `model` holding `ctx` tokens.
    pub fn on(model: &dyn DeviceModel, ctx: usize) -> Result<DeviceSession, EngineError> {
        Ok(DeviceSession::new(model.new_state(ctx)?, model.device()))
    }

    /// Turns speculative decoding on (this drafter and budget policy) or off.
    pub fn set_speculator(&mut self, spec: Option<Speculator>) {
        self.spec = spec;
    }

    /// Tokens currently in the state.
    pub fn cached_tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Context capacity in tokens.
    pub fn ctx_size(&self) -> usize {
        self.state.max_len()
    }

    /// Prefills `prompt` (after the longest prefix already in the state) and generates, as
    /// [`Session::generate_cached_until`](super::Session::generate_cached_until) does. On an error the state is reset, so the next
    /// request starts clean.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        options: &GenerateOptions,
        cancelled: &dyn Fn() -> bool,
        on_token: &mut dyn FnMut(Emitted) -> Flow,
    ) -> Result<Generation, EngineError> {
        let result = self.generate_inner(prompt, options, cancelled, on_token);
        if result.is_err() {
            self.reset();
        }
        result
    }

    /// Forgets everything in the state.
    pub fn reset(&mut self) {
        self.state.truncate(0);
        self.tokens.clear();
    }

    fn generate_inner(
        &mut self,
        prompt: &[u32],
        options: &GenerateOptions,
        cancelled: &dyn Fn() -> bool,
        on_token: &mut dyn FnMut(Emitted) -> Flow,
    ) -> Result<Generation, EngineError> {
        options.validate()?;
        if prompt.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        if prompt.len() >= self.ctx_size() {
            return Err(EngineError::PromptTooLong {
                prompt: prompt.len(),
                ctx: self.ctx_size(),
            });
        }
        let start = Instant::now();
        // The last prompt token is always computed: it yields the first logits.
        let common = self
            .tokens
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count();
        let mut reused = common.min(prompt.len() - 1);
        if reused < self.tokens.len() {
            self.state.truncate(reused);
            // A state with recurrent layers cannot rewind: it may keep less (nothing).
            reused = reused.min(self.state.len());
            self.tokens.truncate(reused);
        }
        // A drafter that reads the target's layer outputs gets those of the prompt rows
        // computed now (the CPU session's `Features::taps`).
        let tap_layers = self
            .spec
            .as_ref()
            .map(|s| s.drafter.tap_layers())
            .unwrap_or_default();
        self.state.set_tap_layers(&tap_layers)?;
        // A drafter on the device reads the rows in place when the fresh prompt is one feed
        // (the recorded rows are the last pass's); else they cross to the host.
        let in_place = !tap_layers.is_empty()
            && prompt.len() - reused <= PREFILL_BLOCK
            && self
                .spec
                .as_ref()
                .is_some_and(|s| reads_in_place(&*self.state, &*s.drafter));
        let mut prompt_taps = Vec::new();
        let mut pos = reused;
        let mut greedy = 0;
        while pos < prompt.len() {
            if cancelled() {
                let elapsed = start.elapsed();
                return Ok(Generation {
                    tokens: Vec::new(),
                    logprobs: Vec::new(),
                    finish: FinishReason::Stop,
                    stats: GenerationStats {
                        cached_tokens: reused,
                        prompt_tokens: pos - reused,
                        prefill_time: elapsed,
                        total_time: elapsed,
                        ..Default::default()
                    },
                });
            }
            let next = (pos + PREFILL_BLOCK).min(prompt.len());
            greedy = self.state.feed(&prompt[pos..next])?;
            if !tap_layers.is_empty() && !in_place {
                let rows: Vec<usize> = (0..next - pos).collect();
                self.state.tap_rows(&rows, &mut self.taps)?;
                prompt_taps.extend_from_slice(&self.taps);
            }
            self.tokens.extend_from_slice(&prompt[pos..next]);
            pos = next;
        }
        let stats = GenerationStats {
            cached_tokens: reused,
            prompt_tokens: prompt.len() - reused,
            prefill_time: start.elapsed(),
            ..Default::default()
        };
        let mut run = Run {
            options,
            on_token,
            start,
            generated: Vec::new(),
            logprobs: Vec::new(),
            history: prompt.to_vec(),
            first_token_at: None,
            stats,
            constraint: options.constraint.as_ref().map(Constraint::start),
        };
        let ids_only = ids_only(options);
        let finish = if options.max_tokens == 0 {
            FinishReason::Length
        } else {
            let first = self.pick(&mut run, ids_only, greedy)?;
            match self.spec.take() {
                Some(mut spec) => {
                    let r = self.decode_drafted(
                        &mut spec,
                        &mut run,
                        first,
                        (
                            prompt,
                            if in_place {
                                PromptTaps::InPlace(prompt.len() - reused)
                            } else {
                                PromptTaps::Host(&prompt_taps)
                            },
                        ),
                        ids_only,
                    );
                    run.stats.spec = Some(spec.take_stats());
                    self.spec = Some(spec);
                    r?
                }
                None => self.decode_plain(&mut run, first, ids_only)?,
            }
        };
        let end = Instant::now();
        let mut stats = run.stats;
        stats.generated_tokens = run.generated.len();
        stats.decode_time = run.first_token_at.map(|t| end - t).unwrap_or_default();
        stats.total_time = end - start;
        Ok(Generation {
            tokens: run.generated,
            logprobs: run.logprobs,
            finish,
            stats,
        })
    }

    /// The token after the last pass: the device's argmax when only ids cross, else drawn
    /// on the host from the last row's logits (copied into `self.logits`).
    fn pick(&mut self, run: &mut Run, ids_only: bool, greedy: u32) -> Result<u32, EngineError> {
        if ids_only {
            return Ok(greedy);
        }
        if let Some(token) = self.draw_from_top(run.options, &run.history, LogitsRow::Last)? {
            return Ok(token);
        }
        self.state.last_logits(&mut self.logits)?;
        run.sample(&self.logits)
    }

    /// The token after `history` drawn from the device's top-k selection of `row`, when
    /// `options` allow it (sampled with top-k, no constraint, no log-probabilities) and the
    /// device can select that many; `None` when the whole row is needed. The same token as
    /// the host sampler on the whole row ([`sampler::penalized_top_k`]).
    fn draw_from_top(
        &mut self,
        options: &GenerateOptions,
        history: &[u32],
        row: LogitsRow,
    ) -> Result<Option<u32>, EngineError> {
        if options.constraint.is_some() || options.logprobs.is_some() {
            return Ok(None);
        }
        let params = &options.sampling;
        let (vocab, max) = (self.state.vocab(), self.state.max_top_logits());
        let Some(plan) = sampler::TopKPlan::for_request(params, history, vocab, max) else {
            return Ok(None);
        };
        let ids: Vec<u32> = plan.penalized.iter().map(|p| p.0).collect();
        self.state
            .top_logits(row, plan.count, &ids, &mut self.top, &mut self.gathered)?;
        if self.top.len() != plan.count || self.gathered.len() != ids.len() {
            return Err(EngineError::Device(format!(
                "a selection of {} logits and {} gathered returned {} and {}",
                plan.count,
                ids.len(),
                self.top.len(),
                self.gathered.len()
            )));
        }
        let candidates =
            sampler::penalized_top_k(params, &self.top, &plan.penalized, &self.gathered);
        sampler::draw(params, candidates, history.len())
            .map(Some)
            .ok_or_else(|| EngineError::Device("an empty top-k selection".into()))
    }

    /// One pass per token.
    fn decode_plain(
        &mut self,
        run: &mut Run,
        first: u32,
        ids_only: bool,
    ) -> Result<FinishReason, EngineError> {
        let mut token = first;
        loop {
            if let Some(finish) = run.take(token, &self.logits)? {
                return Ok(finish);
            }
            if self.state.len() + 1 >= self.ctx_size() {
                return Ok(FinishReason::ContextFull);
            }
            let greedy = self.state.feed(&[token])?;
            self.tokens.push(token);
            run.stats.decode_passes += 1;
            token = self.pick(run, ids_only, greedy)?;
            run.stats.decode_tokens += 1;
        }
    }

    /// Speculative decoding: each cycle verifies the drafted tree in one pass and walks it
    /// as plain decoding would sample: with the device's argmax of every node when only ids
    /// cross, else with the host sampler on each visited node's row. A drafter reading layer
    /// outputs gets the prompt's ([`PromptTaps`]) and each committed path's, in place when it
    /// reads them there (nothing then crosses to the host).
    fn decode_drafted(
        &mut self,
        spec: &mut Speculator,
        run: &mut Run,
        first: u32,
        (prompt, prompt_taps): (&[u32], PromptTaps),
        ids_only: bool,
    ) -> Result<FinishReason, EngineError> {
        let wants_taps = !spec.drafter.tap_layers().is_empty();
        let in_place = wants_taps && reads_in_place(&*self.state, &*spec.drafter);
        let prompt_rows: Vec<usize> = match prompt_taps {
            PromptTaps::InPlace(n) if in_place => (0..n).collect(),
            _ => Vec::new(),
        };
        let features = match (prompt_taps, self.state.device_taps()) {
            (PromptTaps::Host(taps), _) => tap_features(wants_taps, taps),
            (PromptTaps::InPlace(_), Some(source)) if in_place => Features {
                device_taps: Some(DeviceTaps {
                    source,
                    rows: &prompt_rows,
                }),
                ..Features::default()
            },
            (PromptTaps::InPlace(_), _) => tap_features(wants_taps, &[]),
        };
        spec.drafter.start(prompt, features)?;
        let mut token = first;
        if let Some(finish) = run.take(token, &self.logits)? {
            return Ok(finish);
        }
        loop {
            let (len, ctx) = (self.state.len(), self.ctx_size());
            if len + 1 >= ctx {
                return Ok(FinishReason::ContextFull);
            }
            let room = (ctx - len - 2)
                .min(run.options.max_tokens - run.generated.len())
                .min(self.state.max_tree().saturating_sub(1));
            let budget = spec.policy.budget().min(room);
            let (tree, draft_time) = spec.draft_tree(&run.history, token, budget)?;
            let t = Instant::now();
            let ids = self.state.verify(&tree)?;
            if ids.len() != tree.len() {
                return Err(EngineError::Device(format!(
                    "a verification of {} nodes returned {} tokens",
                    tree.len(),
                    ids.len()
                )));
            }
            let (path, new) = if ids_only {
                walk_ids(&tree, &ids)
            } else {
                self.walk_sampled(&tree, run)?
            };
            run.stats.decode_passes += 1;
            spec.record_pass(&tree, path.len() - 1, draft_time, t.elapsed());
            // Emit as plain decoding would; it would have fed every emitted token but the last.
            let mut finish = None;
            let mut fed = path.len();
            for (j, &y) in new.iter().enumerate() {
                run.stats.decode_tokens += 1;
                // Token j was drawn from the row of the path's j-th node (none when ids only).
                let row = self
                    .rows
                    .get(j)
                    .filter(|_| !ids_only)
                    .map_or(&[][..], |r| r);
                if let Some(f) = run.take(y, row)? {
                    finish = Some(f);
                    fed = j + 1;
                    break;
                }
            }
            let path = &path[..fed.min(path.len())];
            if wants_taps && !in_place {
                // The verification's rows: read before the commit (which runs no pass).
                self.state.tap_rows(path, &mut self.taps)?;
            }
            self.state.commit(path)?;
            let committed: Vec<u32> = path.iter().map(|&i| tree.token(i)).collect();
            self.tokens.extend_from_slice(&committed);
            // In place: the drafter reads the path's rows where the verification left them
            // (the commit runs no pass; the drafter's reads queue before the next one).
            let features = match self.state.device_taps().filter(|_| in_place) {
                Some(source) => Features {
                    device_taps: Some(DeviceTaps { source, rows: path }),
                    ..Features::default()
                },
                None => tap_features(wants_taps, &self.taps),
            };
            spec.drafter.accept(&Accepted {
                tokens: &committed,
                committed_len: self.state.len(),
                features,
            })?;
            if let Some(f) = finish {
                return Ok(f);
            }
            token = *new.last().expect("a pass yields at least one token");
        }
    }

    /// The walk down a verified `tree` with the host sampler (`spec::accept_path_constrained`'s
    /// rule), from each visited node's top-k selection where the request allows, else from
    /// its row (fetched into `self.rows`): the accepted path and the tokens sampled along it.
    fn walk_sampled(
        &mut self,
        tree: &TokenTree,
        run: &Run,
    ) -> Result<(Vec<usize>, Vec<u32>), EngineError> {
        let mut walker = run.constraint.as_deref().map(|c| c.fork());
        let mut history = run.history.clone();
        let (mut node, mut path, mut new) = (0, vec![0], Vec::new());
        loop {
            let j = new.len();
            if self.rows.len() <= j {
                self.rows.push(Vec::new());
            }
            let y = match self.draw_from_top(run.options, &history, LogitsRow::Node(node))? {
                Some(y) => y,
                None => {
                    self.state.node_logits(node, &mut self.rows[j])?;
                    let mask = walker.as_mut().map(|w| w.mask()).transpose()?;
                    sampler::sample_masked(
                        &run.options.sampling,
                        &self.rows[j],
                        &history,
                        history.len(),
                        mask.as_ref(),
                    )
                }
            };
            new.push(y);
            match tree.child_with(node, y) {
                Some(child) => {
                    if let Some(w) = walker.as_mut() {
                        w.advance(y)?;
                    }
                    node = child;
                    path.push(child);
                    history.push(y);
                }
                None => return Ok((path, new)),
            }
        }
    }
}

/// Whether `drafter` reads `state`'s recorded layer outputs in place.
fn reads_in_place(state: &dyn DeviceState, drafter: &dyn Drafter) -> bool {
    state
        .device_taps()
        .is_some_and(|source| drafter.reads_device_taps(source))
}

/// The layer outputs of a prompt's freshly computed rows, for a drafter that reads them.
#[derive(Clone, Copy)]
enum PromptTaps<'a> {
    /// Read to the host.
    Host(&'a [f32]),
    /// Left on the device: the first this many rows of the last feed (the fresh prompt was
    /// one feed), read in place by the drafter.
    InPlace(usize),
}

/// A drafter's features: the layer outputs read from the device, when it asked for them.
fn tap_features(wanted: bool, taps: &[f32]) -> Features<'_> {
    Features {
        hidden: None,
        taps: wanted.then_some(taps),
        device_taps: None,
    }
}

/// The walk down a verified `tree` by the device's argmax of each node (`ids`): the accepted
/// path and the tokens along it, the last one the first that left the tree.
fn walk_ids(tree: &TokenTree, ids: &[u32]) -> (Vec<usize>, Vec<u32>) {
    let (mut node, mut path, mut new) = (0, vec![0], Vec::new());
    loop {
        let y = ids[node];
        new.push(y);
        match tree.child_with(node, y) {
            Some(child) => {
                node = child;
                path.push(child);
            }
            None => return (path, new),
        }
    }
}

impl Generator for DeviceSession {
    fn device(&self) -> String {
        self.device.clone()
    }

    fn ctx_size(&self) -> usize {
        DeviceSession::ctx_size(self)
    }

    fn reset(&mut self) {
        DeviceSession::reset(self)
    }

    fn generate(
        &mut self,
        prompt: &[u32],
        options: &GenerateOptions,
        on_token: &mut dyn FnMut(Emitted) -> Flow,
    ) -> Result<Generation, EngineError> {
        DeviceSession::generate(self, prompt, options, &|| false, on_token)
    }

    /// `cache` holds CPU states and is not used: with one, the session reuses its own
    /// state's prefix; without, it computes the whole prompt (as a CPU session does).
    fn generate_until(
        &mut self,
        cache: Option<&Mutex<PrefixCache>>,
        prompt: &[u32],
        options: &GenerateOptions,
        cancelled: &dyn Fn() -> bool,
        on_token: &mut dyn FnMut(Emitted) -> Flow,
    ) -> Result<Generation, EngineError> {
        if cache.is_none() {
            DeviceSession::reset(self);
        }
        DeviceSession::generate(self, prompt, options, cancelled, on_token)
    }
}

#[cfg(test)]
mod tests;
