//! The device session's logic on a stand-in device: a CPU model behind [`DeviceState`] that
//! hands back only what a GPU would (argmax ids, logits or a top-k selection when asked),
//! checked against the CPU [`Session`] on the same weights: the same tokens,
//! log-probabilities and finish reasons, greedy, sampled, constrained and speculative.

use std::cell::Cell;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;

use super::*;
use crate::constraint::{ConstraintError, TokenConstraint, TokenMask};
use crate::engine::{Session, SpecKind};
use crate::model::{Batch, Model, ModelState, Output};
use crate::sampler::{argmax, SamplingParams};
use crate::spec::PolicyConfig;

/// What the stand-in device was asked for.
#[derive(Default)]
struct Counts {
    /// Rows of logits copied to the host.
    logits: Cell<usize>,
    /// Top-k selections handed to the host instead of rows.
    tops: Cell<usize>,
    /// Whether the device refuses to select (hands back whole rows only).
    rows_only: Cell<bool>,
    verifies: Cell<usize>,
    /// Fail the pass after this many more (None: never).
    fail_in: Cell<Option<usize>>,
}

struct CpuDevice {
    model: Arc<Model>,
    state: ModelState,
    out: Output,
    counts: Rc<Counts>,
}

impl CpuDevice {
    fn pass(&self) -> Result<(), EngineError> {
        match self.counts.fail_in.get() {
            Some(0) => Err(EngineError::Device("injected failure".into())),
            Some(n) => {
                self.counts.fail_in.set(Some(n - 1));
                Ok(())
            }
            None => Ok(()),
        }
    }
}

impl DeviceState for CpuDevice {
    fn len(&self) -> usize {
        self.state.len()
    }
    fn max_len(&self) -> usize {
        self.state.max_len()
    }
    fn max_tree(&self) -> usize {
        16
    }
    fn truncate(&mut self, len: usize) {
        if !self.state.truncate(len) {
            self.state = self.model.new_state(self.state.max_len());
        }
    }
    fn feed(&mut self, tokens: &[u32]) -> Result<u32, EngineError> {
        self.pass()?;
        self.model
            .run(&mut self.state, &Batch::chain(tokens), &mut self.out)?;
        Ok(argmax(&self.out.logits))
    }
    fn last_logits(&mut self, out: &mut Vec<f32>) -> Result<(), EngineError> {
        self.counts.logits.set(self.counts.logits.get() + 1);
        out.clear();
        out.extend_from_slice(&self.out.logits);
        Ok(())
    }
    fn node_logits(&mut self, node: usize, out: &mut Vec<f32>) -> Result<(), EngineError> {
        self.counts.logits.set(self.counts.logits.get() + 1);
        let vocab = self.model.config.vocab;
        out.clear();
        out.extend_from_slice(&self.out.logits[node * vocab..(node + 1) * vocab]);
        Ok(())
    }
    fn vocab(&self) -> usize {
        self.model.config.vocab
    }
    fn max_top_logits(&self) -> usize {
        if self.counts.rows_only.get() {
            0
        } else {
            1024
        }
    }
    fn top_logits(
        &mut self,
        row: LogitsRow,
        count: usize,
        ids: &[u32],
        top: &mut Vec<(u32, f32)>,
        gathered: &mut Vec<f32>,
    ) -> Result<(), EngineError> {
        self.counts.tops.set(self.counts.tops.get() + 1);
        let vocab = self.model.config.vocab;
        let first = match row {
            LogitsRow::Last => self.out.logits.len() - vocab,
            LogitsRow::Node(node) => node * vocab,
        };
        let row = &self.out.logits[first..first + vocab];
        assert!(count < vocab && count <= 1024, "a selection of {count}");
        *gathered = ids.iter().map(|&id| row[id as usize]).collect();
        let all = row
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, l))
            .collect();
        *top = crate::sampler::top_k_of(all, count);
        // Any order: the device's is not the sampler's.
        top.reverse();
        Ok(())
    }
    fn verify(&mut self, tree: &TokenTree) -> Result<Vec<u32>, EngineError> {
        self.pass()?;
        self.counts.verifies.set(self.counts.verifies.get() + 1);
        self.model
            .run(&mut self.state, &Batch::tree(tree), &mut self.out)?;
        let vocab = self.model.config.vocab;
        Ok(self.out.logits.chunks(vocab).map(argmax).collect())
    }
    fn commit(&mut self, path: &[usize]) -> Result<(), EngineError> {
        Ok(self.model.commit(&mut self.state, path)?)
    }
}

fn fixture(rel: &str) -> Arc<Model> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(rel);
    Arc::new(Model::load(path).unwrap())
}

const CTX: usize = 96;

fn device(model: &Arc<Model>) -> (DeviceSession, Rc<Counts>) {
    let counts = Rc::new(Counts::default());
    let state = CpuDevice {
        model: model.clone(),
        state: model.new_state(CTX),
        out: Output::default(),
        counts: counts.clone(),
    };
    (DeviceSession::new(Box::new(state), "test:0"), counts)
}

fn prompt(len: usize, salt: u32) -> Vec<u32> {
    (0..len as u32).map(|i| 3 + (i * 7 + salt) % 40).collect()
}

fn options(sampling: SamplingParams, max_tokens: usize) -> GenerateOptions {
    GenerateOptions {
        sampling,
        max_tokens,
        ..Default::default()
    }
}

fn sampled() -> SamplingParams {
    SamplingParams {
        temperature: 0.9,
        top_k: 40,
        top_p: 0.95,
        min_p: 0.02,
        repetition_penalty: 1.1,
        seed: 7,
        ..Default::default()
    }
}

fn generate(g: &mut dyn Generator, prompt: &[u32], options: &GenerateOptions) -> Generation {
    g.generate(prompt, options, &mut |_| Flow::Continue)
        .unwrap()
}

#[test]
fn greedy_on_the_device_equals_the_cpu_session_and_copies_no_logits() {
    for rel in ["llama/tiny/model-f32.gguf", "qwen3/tiny/model-f32.gguf"] {
        let model = fixture(rel);
        let o = options(SamplingParams::default(), 24);
        let cpu = generate(&mut Session::new(model.clone(), CTX), &prompt(20, 1), &o);
        let (mut dev, counts) = device(&model);
        let got = generate(&mut dev, &prompt(20, 1), &o);
        assert_eq!(got.tokens, cpu.tokens, "{rel}");
        assert_eq!(got.finish, cpu.finish);
        assert_eq!(got.stats.decode_passes, cpu.stats.decode_passes);
        assert_eq!(counts.logits.get(), 0, "greedy: only ids cross");
        assert_eq!(dev.device(), "test:0");
    }
}

#[test]
fn sampling_from_host_logits_equals_the_cpu_sampler() {
    let model = fixture("llama/tiny/model-f32.gguf");
    for seed in [1, 7, 99] {
        let o = options(SamplingParams { seed, ..sampled() }, 30);
        let cpu = generate(&mut Session::new(model.clone(), CTX), &prompt(12, 2), &o);
        let (mut dev, counts) = device(&model);
        let got = generate(&mut dev, &prompt(12, 2), &o);
        assert_eq!(got.tokens, cpu.tokens, "seed {seed}");
        // One top-k selection per sampled token, no row.
        assert_eq!(counts.tops.get(), got.tokens.len());
        assert_eq!(counts.logits.get(), 0);
        // A device that hands back rows only: one row per sampled token, the same answer.
        let (mut dev, counts) = device(&model);
        counts.rows_only.set(true);
        assert_eq!(generate(&mut dev, &prompt(12, 2), &o).tokens, cpu.tokens);
        assert_eq!(counts.logits.get(), got.tokens.len());
        assert_eq!(counts.tops.get(), 0);
    }
    // Top-k off (top-p, min-p): whole rows.
    let o = options(
        SamplingParams {
            top_k: 0,
            ..sampled()
        },
        20,
    );
    let cpu = generate(&mut Session::new(model.clone(), CTX), &prompt(12, 2), &o);
    let (mut dev, counts) = device(&model);
    assert_eq!(generate(&mut dev, &prompt(12, 2), &o).tokens, cpu.tokens);
    assert_eq!(counts.logits.get(), cpu.tokens.len());
    // Greedy with a penalty reads the history: the logits come to the host.
    let o = options(
        SamplingParams {
            repetition_penalty: 1.3,
            ..Default::default()
        },
        16,
    );
    let cpu = generate(&mut Session::new(model.clone(), CTX), &prompt(12, 2), &o);
    let (mut dev, counts) = device(&model);
    assert_eq!(generate(&mut dev, &prompt(12, 2), &o).tokens, cpu.tokens);
    assert!(counts.logits.get() > 0);
}

#[test]
fn logprobs_and_stop_tokens_match_the_cpu_session() {
    let model = fixture("qwen2/tiny/model-f32.gguf");
    let first = generate(
        &mut Session::new(model.clone(), CTX),
        &prompt(10, 3),
        &options(SamplingParams::default(), 12),
    );
    let o = GenerateOptions {
        logprobs: Some(3),
        // A token the answer reaches ends it unemitted.
        stop_tokens: vec![first.tokens[5]],
        ..options(sampled(), 12)
    };
    let cpu = generate(&mut Session::new(model.clone(), CTX), &prompt(10, 3), &o);
    let (mut dev, _) = device(&model);
    let got = generate(&mut dev, &prompt(10, 3), &o);
    assert_eq!(got.tokens, cpu.tokens);
    assert_eq!(got.logprobs, cpu.logprobs);
    assert_eq!(got.logprobs.len(), got.tokens.len());
    assert_eq!(got.finish, cpu.finish);
}

/// Allows the tokens whose id is congruent to the answer's length modulo 3.
#[derive(Clone)]
struct Stride {
    vocab: usize,
    at: u32,
}

impl TokenConstraint for Stride {
    fn mask(&mut self) -> Result<TokenMask, ConstraintError> {
        let mut m = TokenMask::none(self.vocab);
        for id in (0..self.vocab as u32).filter(|id| id % 3 == self.at % 3) {
            m.allow(id);
        }
        Ok(m)
    }
    fn advance(&mut self, token: u32) -> Result<(), ConstraintError> {
        if token % 3 != self.at % 3 {
            return Err(ConstraintError(format!("{token} was not allowed")));
        }
        self.at += 1;
        Ok(())
    }
    fn fork(&self) -> Box<dyn TokenConstraint> {
        Box::new(self.clone())
    }
}

#[test]
fn constraints_apply_to_host_logits_as_on_the_cpu() {
    let model = fixture("llama/tiny/model-f32.gguf");
    let vocab = model.config.vocab;
    for sampling in [SamplingParams::default(), sampled()] {
        let o = GenerateOptions {
            constraint: Some(Constraint::new(Stride { vocab, at: 0 })),
            ..options(sampling, 15)
        };
        let cpu = generate(&mut Session::new(model.clone(), CTX), &prompt(9, 4), &o);
        let (mut dev, counts) = device(&model);
        let got = generate(&mut dev, &prompt(9, 4), &o);
        assert_eq!(got.tokens, cpu.tokens);
        assert!(got
            .tokens
            .iter()
            .enumerate()
            .all(|(i, t)| t % 3 == i as u32 % 3));
        assert_eq!(counts.logits.get(), got.tokens.len());
    }
}

#[test]
fn prompt_lookup_on_the_device_equals_plain_decoding_greedy_or_sampled() {
    let model = fixture("llama/tiny/model-f32.gguf");
    // A repetitive prompt gives prompt lookup something to find.
    let p: Vec<u32> = (0..40).map(|i| 5 + (i % 6)).collect();
    let o = options(SamplingParams::default(), 40);
    let plain = generate(&mut Session::new(model.clone(), CTX), &p, &o);
    let policy = PolicyConfig {
        adaptive: false,
        ..PolicyConfig::default()
    };
    let (mut dev, counts) = device(&model);
    dev.set_speculator(device_speculator(SpecKind::Ngram, false, policy).unwrap());
    let got = generate(&mut dev, &p, &o);
    assert_eq!(got.tokens, plain.tokens);
    assert_eq!(counts.logits.get(), 0);
    let spec = got.stats.spec.clone().expect("spec statistics");
    assert!(spec.verify_passes > 0, "trees were verified");
    assert_eq!(counts.verifies.get(), got.stats.decode_passes);
    assert!(got.stats.decode_passes < got.tokens.len(), "{spec:?}");
    // Sampled, penalised, constrained and with log-probabilities: drafted too, walked with
    // the host sampler on the visited nodes' rows, and the answer is plain decoding's.
    let vocab = model.config.vocab;
    let cases = [
        options(sampled(), 30),
        options(
            SamplingParams {
                top_k: 5,
                presence_penalty: -0.5,
                frequency_penalty: 0.3,
                seed: 11,
                ..sampled()
            },
            30,
        ),
        GenerateOptions {
            logprobs: Some(2),
            ..options(SamplingParams::default(), 30)
        },
        GenerateOptions {
            constraint: Some(Constraint::new(Stride { vocab, at: 0 })),
            ..options(sampled(), 20)
        },
        options(
            SamplingParams {
                temperature: 0.3,
                seed: 3,
                ..Default::default()
            },
            30,
        ),
    ];
    let mut accepted = 0;
    for o in cases {
        let plain = generate(&mut Session::new(model.clone(), CTX), &p, &o);
        let before = counts.logits.get() + counts.tops.get();
        let got = generate(&mut dev, &p, &o);
        assert_eq!(got.tokens, plain.tokens);
        assert_eq!(got.logprobs, plain.logprobs);
        assert_eq!(got.finish, plain.finish);
        let spec = got.stats.spec.clone().expect("drafted");
        accepted += spec.accepted_tokens();
        // A row or selection per sampled token (the first, then the walk's), never a whole
        // tree's.
        let fetched = counts.logits.get() + counts.tops.get() - before;
        assert!(fetched <= got.tokens.len() + got.stats.decode_passes + 1);
    }
    assert!(accepted > 0, "sampled drafts were accepted somewhere");
}

#[test]
fn the_device_drafts_with_prompt_lookup_only() {
    let p = PolicyConfig::default();
    assert!(device_speculator(SpecKind::None, false, p)
        .unwrap()
        .is_none());
    let auto = device_speculator(SpecKind::Auto, false, p)
        .unwrap()
        .unwrap();
    assert_eq!(
        auto.drafter.name(),
        device_speculator(SpecKind::Ngram, true, p)
            .unwrap()
            .unwrap()
            .drafter
            .name()
    );
    // The budget adapts, from passes past each size's first (a GPU's graph capture) ...
    assert!(auto.policy.config.adaptive && auto.policy.first_pass_warms_up());
    // ... unless the caller fixes it.
    let fixed = PolicyConfig {
        adaptive: false,
        ..p
    };
    let ngram = device_speculator(SpecKind::Ngram, false, fixed)
        .unwrap()
        .unwrap();
    assert!(!ngram.policy.config.adaptive);
    for (kind, draft) in [
        (SpecKind::Auto, true),
        (SpecKind::Draft, true),
        (SpecKind::Mtp, false),
        (SpecKind::DFlash, true),
    ] {
        let err = device_speculator(kind, draft, p).err().expect("refused");
        assert!(err.to_string().contains("prompt lookup only"), "{err}");
    }
}

/// A drafter the caller made for the device (a draft model on a GPU; here the CPU's own
/// draft-model drafter stands in) drafts for `draft` and `auto`, and the answers are plain
/// decoding's, twice over the same session.
#[test]
fn a_device_drafter_drafts_for_draft_and_auto() {
    use crate::spec::{draft_model::DraftModelConfig, DraftModelDrafter};
    let model = fixture("llama/tiny/model-f32.gguf");
    let draft = fixture("llama/tiny/model-q4_0.gguf");
    let p = PolicyConfig::default();
    let drafter = || -> Box<dyn Drafter> {
        let config = DraftModelConfig::default();
        Box::new(DraftModelDrafter::new(draft.clone(), CTX, model.config.vocab, config).unwrap())
    };
    // DFlash too: the caller made a drafter on the device for it.
    for kind in [SpecKind::Draft, SpecKind::DFlash, SpecKind::Auto] {
        let spec = device_draft_speculator(kind, drafter(), p)
            .unwrap()
            .unwrap();
        assert_eq!(spec.drafter.name(), "draft");
        assert!(spec.policy.config.adaptive && spec.policy.first_pass_warms_up());
    }
    // Other kinds as without a device drafter, a draft given.
    assert!(device_draft_speculator(SpecKind::None, drafter(), p)
        .unwrap()
        .is_none());
    let ngram = device_draft_speculator(SpecKind::Ngram, drafter(), p).unwrap();
    assert_eq!(ngram.unwrap().drafter.name(), "ngram");
    let err = device_draft_speculator(SpecKind::Mtp, drafter(), p)
        .err()
        .unwrap();
    assert!(err.to_string().contains("prompt lookup only"), "{err}");
    let prompt: Vec<u32> = (0..30).map(|i| (i * 37 + 5) % 300).collect();
    let o = options(SamplingParams::default(), 40);
    let plain = generate(&mut Session::new(model.clone(), CTX), &prompt, &o);
    let (mut dev, _) = device(&model);
    // A fixed budget, so that it drafts whatever this machine's timings say pays.
    let fixed = PolicyConfig {
        adaptive: false,
        ..p
    };
    dev.set_speculator(device_draft_speculator(SpecKind::Draft, drafter(), fixed).unwrap());
    for _ in 0..2 {
        let got = generate(&mut dev, &prompt, &o);
        assert_eq!(got.tokens, plain.tokens);
        let spec = got.stats.spec.clone().expect("drafted");
        assert!(
            spec.verify_passes > 0 && spec.accepted_tokens() > 0,
            "{spec:?}"
        );
        assert!(got.stats.decode_passes < got.tokens.len());
    }
}

#[test]
fn a_shared_prefix_is_reused_and_the_answer_is_unchanged() {
    let model = fixture("qwen3/tiny/model-f32.gguf");
    let (mut dev, _) = device(&model);
    let o = options(SamplingParams::default(), 8);
    let a = prompt(30, 5);
    let mut b = a[..24].to_vec();
    b.extend(prompt(6, 9));
    generate(&mut dev, &a, &o);
    let again = generate(&mut dev, &b, &o);
    assert_eq!(again.stats.cached_tokens, 24);
    assert_eq!(again.stats.prompt_tokens, 6);
    let fresh = generate(&mut Session::new(model.clone(), CTX), &b, &o);
    assert_eq!(again.tokens, fresh.tokens);
    // The same prompt again recomputes only its last token.
    let same = generate(&mut dev, &b, &o);
    assert_eq!(same.stats.cached_tokens, b.len() - 1);
    assert_eq!(same.tokens, fresh.tokens);
    // The server's call without a prefix cache computes the whole prompt, as on the CPU;
    // with one, the session's own prefix serves.
    let cache = Mutex::new(PrefixCache::new(1 << 20, 16));
    let until = |dev: &mut DeviceSession, cache| {
        dev.generate_until(cache, &b, &o, &|| false, &mut |_| Flow::Continue)
            .unwrap()
    };
    let none = until(&mut dev, None);
    assert_eq!(
        (none.stats.cached_tokens, none.tokens),
        (0, fresh.tokens.clone())
    );
    let some = until(&mut dev, Some(&cache));
    assert_eq!(
        (some.stats.cached_tokens, some.tokens),
        (b.len() - 1, fresh.tokens)
    );
}

#[test]
fn a_recurrent_state_that_cannot_rewind_starts_over_and_the_answer_is_unchanged() {
    // Qwen3.5's Gated DeltaNet layers cannot truncate: a shorter shared prefix recomputes the
    // whole prompt instead of continuing from a state that holds more.
    let model = fixture("qwen3_5/tiny/model-f32.gguf");
    let (mut dev, _) = device(&model);
    let o = options(SamplingParams::default(), 8);
    let a = prompt(30, 5);
    let mut b = a[..24].to_vec();
    b.extend(prompt(6, 9));
    generate(&mut dev, &a, &o);
    let again = generate(&mut dev, &b, &o);
    let fresh = generate(&mut Session::new(model.clone(), CTX), &b, &o);
    assert_eq!(again.tokens, fresh.tokens);
    assert_eq!(again.stats.cached_tokens, 0);
    assert_eq!(again.stats.prompt_tokens, b.len());
    let same = generate(&mut dev, &b, &o);
    assert_eq!(same.tokens, fresh.tokens);
}

#[test]
fn errors_are_reported_and_the_state_starts_over() {
    let model = fixture("llama/tiny/model-f32.gguf");
    let (mut dev, counts) = device(&model);
    let o = options(SamplingParams::default(), 10);
    let g = |dev: &mut DeviceSession, p: &[u32], o: &GenerateOptions| {
        dev.generate(p, o, &|| false, &mut |_| Flow::Continue)
    };
    assert!(matches!(
        g(&mut dev, &[], &o),
        Err(EngineError::EmptyPrompt)
    ));
    assert!(matches!(
        g(&mut dev, &prompt(CTX, 1), &o),
        Err(EngineError::PromptTooLong { .. })
    ));
    let bad = options(
        SamplingParams {
            top_p: 0.0,
            ..Default::default()
        },
        4,
    );
    assert!(matches!(
        g(&mut dev, &prompt(5, 1), &bad),
        Err(EngineError::Param(_))
    ));
    // A device failure in the middle of the answer fails the request, never panics...
    counts.fail_in.set(Some(3));
    let err = g(&mut dev, &prompt(20, 1), &o).unwrap_err();
    assert!(err.to_string().contains("injected failure"), "{err}");
    assert!(dev.cached_tokens().is_empty(), "the state was reset");
    // ...and the next request runs from scratch with the right answer.
    counts.fail_in.set(None);
    let fresh = generate(&mut Session::new(model.clone(), CTX), &prompt(20, 1), &o);
    let again = g(&mut dev, &prompt(20, 1), &o).unwrap();
    assert_eq!(again.tokens, fresh.tokens);
    assert_eq!(again.stats.cached_tokens, 0);
}

#[test]
fn cancelling_before_the_prefill_returns_no_tokens() {
    let model = fixture("llama/tiny/model-f32.gguf");
    let (mut dev, _) = device(&model);
    let o = options(SamplingParams::default(), 10);
    let g = dev
        .generate(&prompt(20, 1), &o, &|| true, &mut |_| Flow::Continue)
        .unwrap();
    assert!(g.tokens.is_empty());
    assert_eq!(g.finish, FinishReason::Stop);
    // max_tokens 0: the prompt only.
    let g = generate(
        &mut dev,
        &prompt(20, 1),
        &options(SamplingParams::default(), 0),
    );
    assert!(g.tokens.is_empty());
    assert_eq!(g.finish, FinishReason::Length);
}

#[test]
fn a_full_context_ends_the_answer_as_on_the_cpu() {
    let model = fixture("llama/tiny/model-f32.gguf");
    let o = options(SamplingParams::default(), 1000);
    let p = prompt(CTX - 5, 1);
    let cpu = generate(&mut Session::new(model.clone(), CTX), &p, &o);
    let (mut dev, _) = device(&model);
    let got = generate(&mut dev, &p, &o);
    assert_eq!(got.tokens, cpu.tokens);
    assert_eq!(got.finish, FinishReason::ContextFull);
    assert_eq!(cpu.finish, FinishReason::ContextFull);
}

/// Layer outputs a stand-in device recorded for its last pass: what a drafter "on the
/// device" reads in place.
struct Recorded {
    width: usize,
    rows: Vec<f32>,
}

/// The stand-in device recording layer outputs, and handing them to a drafter that reads
/// them in place when `in_place` (else only through `tap_rows`, to the host).
struct TappedCpu {
    model: Arc<Model>,
    state: ModelState,
    out: Output,
    layers: Vec<usize>,
    recorded: Recorded,
    in_place: bool,
    host_reads: Rc<Cell<usize>>,
}

impl TappedCpu {
    fn record(&mut self) {
        self.recorded.width = self.layers.len() * self.model.config.hidden;
        self.recorded.rows.clone_from(&self.out.taps);
    }
}

impl DeviceState for TappedCpu {
    fn len(&self) -> usize {
        self.state.len()
    }
    fn max_len(&self) -> usize {
        self.state.max_len()
    }
    fn max_tree(&self) -> usize {
        16
    }
    fn truncate(&mut self, len: usize) {
        assert!(self.state.truncate(len));
    }
    fn feed(&mut self, tokens: &[u32]) -> Result<u32, EngineError> {
        let batch = Batch::chain(tokens).taps(&self.layers);
        self.model.run(&mut self.state, &batch, &mut self.out)?;
        self.record();
        Ok(argmax(&self.out.logits))
    }
    fn last_logits(&mut self, _: &mut Vec<f32>) -> Result<(), EngineError> {
        unreachable!("greedy ids only")
    }
    fn node_logits(&mut self, _: usize, _: &mut Vec<f32>) -> Result<(), EngineError> {
        unreachable!("greedy ids only")
    }
    fn vocab(&self) -> usize {
        self.model.config.vocab
    }
    fn set_tap_layers(&mut self, layers: &[usize]) -> Result<(), EngineError> {
        self.layers = layers.to_vec();
        Ok(())
    }
    fn tap_rows(&mut self, rows: &[usize], out: &mut Vec<f32>) -> Result<(), EngineError> {
        self.host_reads.set(self.host_reads.get() + 1);
        let w = self.recorded.width;
        out.clear();
        for &r in rows {
            out.extend_from_slice(&self.recorded.rows[r * w..(r + 1) * w]);
        }
        Ok(())
    }
    fn device_taps(&self) -> Option<&(dyn std::any::Any + Send + Sync)> {
        self.in_place
            .then_some(&self.recorded as &(dyn std::any::Any + Send + Sync))
    }
    fn verify(&mut self, tree: &TokenTree) -> Result<Vec<u32>, EngineError> {
        let batch = Batch::tree(tree).taps(&self.layers);
        self.model.run(&mut self.state, &batch, &mut self.out)?;
        self.record();
        let vocab = self.model.config.vocab;
        Ok(self.out.logits.chunks(vocab).map(argmax).collect())
    }
    fn commit(&mut self, path: &[usize]) -> Result<(), EngineError> {
        Ok(self.model.commit(&mut self.state, path)?)
    }
}

/// The CPU's DFlash network reading [`Recorded`] rows "in place", counting the rows so read.
struct InPlaceDFlash {
    net: crate::spec::CpuDFlash,
    rows_read: Arc<std::sync::atomic::AtomicUsize>,
}

impl crate::spec::DFlashBlocks for InPlaceDFlash {
    fn tap_layers(&self) -> Vec<usize> {
        self.net.tap_layers()
    }
    fn feature_width(&self) -> usize {
        self.net.feature_width()
    }
    fn block_size(&self) -> usize {
        self.net.block_size()
    }
    fn context_positions(&self) -> &[usize] {
        self.net.context_positions()
    }
    fn truncate_context(&mut self, rows: usize) {
        self.net.truncate_context(rows)
    }
    fn append_context(
        &mut self,
        features: &[f32],
        positions: &[usize],
    ) -> Result<(), crate::spec::DraftError> {
        self.net.append_context(features, positions)
    }
    fn reads_device_taps(&self, source: &(dyn std::any::Any + Send + Sync)) -> bool {
        source.downcast_ref::<Recorded>().is_some()
    }
    fn append_device_context(
        &mut self,
        source: &(dyn std::any::Any + Send + Sync),
        rows: &[usize],
        positions: &[usize],
    ) -> Result<(), crate::spec::DraftError> {
        let rec = source.downcast_ref::<Recorded>().expect("recorded rows");
        let w = rec.width;
        let feats: Vec<f32> = rows
            .iter()
            .flat_map(|&r| rec.rows[r * w..(r + 1) * w].iter().copied())
            .collect();
        self.rows_read
            .fetch_add(rows.len(), std::sync::atomic::Ordering::Relaxed);
        self.net.append_context(&feats, positions)
    }
    fn marginals(
        &mut self,
        root: u32,
        pos: usize,
        rows: usize,
        top_k: usize,
    ) -> Result<Vec<Vec<(u32, f32)>>, crate::spec::DraftError> {
        self.net.marginals(root, pos, rows, top_k)
    }
}

/// A DFlash drafter that reads the device's recorded rows in place gets the prompt's rows and
/// every committed path's without any crossing to the host, and drafts exactly what the same
/// drafter given host copies drafts: the same answers (plain decoding's), passes and
/// acceptances. A prompt of more than one feed still crosses (the device keeps one pass).
#[test]
fn a_drafter_reads_the_devices_layer_outputs_in_place() {
    use crate::model::DFlash;
    use crate::spec::{BlockDrafter, CpuDFlash, DFlashDrafterConfig};
    let model = fixture("qwen2/tiny/model-f32.gguf");
    let dir =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/qwen2/tiny_dflash");
    let net = Arc::new(DFlash::load(&dir, &model, None).unwrap());
    let config = DFlashDrafterConfig {
        vocab_rows: 0,
        ..DFlashDrafterConfig::default()
    };
    // A fixed budget: both runs must draft alike, whatever the passes' timings.
    let p = PolicyConfig {
        adaptive: false,
        ..PolicyConfig::default()
    };
    let o = options(SamplingParams::default(), 40);
    let prompt: Vec<u32> = (0..30).map(|i| (i * 37 + 5) % 300).collect();
    let plain = generate(&mut Session::new(model.clone(), CTX), &prompt, &o);
    let mut results = Vec::new();
    for in_place in [false, true] {
        let host_reads = Rc::new(Cell::new(0));
        let rows_read = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let state = TappedCpu {
            model: model.clone(),
            state: model.new_state(CTX),
            out: Output::default(),
            layers: Vec::new(),
            recorded: Recorded {
                width: 0,
                rows: Vec::new(),
            },
            in_place,
            host_reads: host_reads.clone(),
        };
        let blocks = InPlaceDFlash {
            net: CpuDFlash::new(model.clone(), net.clone(), config.vocab_rows).unwrap(),
            rows_read: rows_read.clone(),
        };
        let drafter = Box::new(BlockDrafter::over(blocks, config));
        let mut dev = DeviceSession::new(Box::new(state), "test:0");
        dev.set_speculator(device_draft_speculator(SpecKind::DFlash, drafter, p).unwrap());
        let got = generate(&mut dev, &prompt, &o);
        assert_eq!(got.tokens, plain.tokens);
        let spec = got.stats.spec.clone().expect("drafted");
        assert!(spec.accepted_tokens() > 0, "{spec:?}");
        let read = rows_read.load(std::sync::atomic::Ordering::Relaxed);
        if in_place {
            // Every prompt row and every committed token, none through the host.
            assert_eq!(host_reads.get(), 0);
            assert_eq!(read, prompt.len() + got.stats.decode_tokens);
        } else {
            assert!(host_reads.get() > 0);
            assert_eq!(read, 0);
        }
        results.push((got.stats.decode_passes, spec.accepted_tokens()));
    }
    assert_eq!(results[0], results[1]);
}
