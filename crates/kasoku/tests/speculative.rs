//! Speculative decoding gives exactly the tokens and the log-probabilities plain decoding
//! gives: every architecture's fixture (the Qwen3.5 hybrid included), greedy and sampled, with
//! each drafter, over a few hundred tokens, with fixed and adaptive tree budgets, and with the
//! KV cache stored in each format (f32, f16, and q8_0 where the head size allows it).

mod common;

use std::sync::{Arc, Mutex};

use kasoku::constraint::{Constraint, ConstraintError, TokenConstraint, TokenMask};
use kasoku::engine::{
    build_speculator_from, DraftSource, Flow, GenerateOptions, PrefixCache, SamplingParams,
    Session, SpecKind, Speculator, TokenLogprobs,
};
use kasoku::format::HfCheckpoint;
use kasoku::model::{DFlash, DFlashConfig};
use kasoku::model::{KvType, Model, TokenTree};
use kasoku::quant::DType;
use kasoku::spec::draft_model::DraftModelConfig;
use kasoku::spec::{
    Accepted, ChoiceDrafter, DFlashDrafter, DFlashDrafterConfig, DraftError, DraftModelDrafter,
    DraftRequest, Drafter, Features, MergedDrafter, MtpDrafter, NgramDrafter, PolicyConfig,
    SpecStats,
};

const TOKENS: usize = 240;

fn load(rel: &str) -> Arc<Model> {
    Arc::new(Model::load(common::fixture(rel)).unwrap())
}

/// The fixture with its KV caches stored as `kv`, or `None` when its head size cannot be.
fn load_as(rel: &str, kv: KvType) -> Option<Arc<Model>> {
    let mut model = Model::load(common::fixture(rel)).unwrap();
    model.set_kv_type(kv).ok()?;
    Some(Arc::new(model))
}

fn samplings() -> Vec<(&'static str, SamplingParams)> {
    vec![
        ("greedy", SamplingParams::default()),
        (
            "sampled",
            SamplingParams {
                temperature: 0.8,
                top_k: 20,
                top_p: 0.9,
                min_p: 0.02,
                repetition_penalty: 1.1,
                presence_penalty: 0.2,
                frequency_penalty: 0.1,
                seed: 1234,
                ..Default::default()
            },
        ),
    ]
}

/// An answer's tokens with their log-probabilities (the chosen token's and the two most
/// likely): the verified rows must give exactly the numbers plain decoding's rows give.
type Answer = (Vec<u32>, Vec<TokenLogprobs>);

fn generate(
    session: &mut Session,
    prompt: &[u32],
    sampling: &SamplingParams,
) -> (Answer, Option<SpecStats>) {
    let options = GenerateOptions {
        logprobs: Some(2),
        sampling: sampling.clone(),
        max_tokens: TOKENS,
        stop_tokens: Vec::new(),
        constraint: None,
    };
    let g = session
        .generate(prompt, &options, &mut |_| Flow::Continue)
        .unwrap();
    assert_eq!(g.logprobs.len(), g.tokens.len());
    ((g.tokens, g.logprobs), g.stats.spec)
}

fn policies() -> Vec<PolicyConfig> {
    vec![
        PolicyConfig {
            max_budget: 6,
            max_depth: 4,
            adaptive: false,
        },
        PolicyConfig::default(),
    ]
}

/// Runs plain and speculative decoding with drafters from `make` and compares the tokens;
/// returns the draft tokens accepted over all runs.
fn check(target_rel: &str, make: &dyn Fn(&Arc<Model>) -> Box<dyn Drafter>) -> usize {
    check_model(target_rel, load(target_rel), make)
}

/// [`check`] with the target's KV cache in every format it can be stored in.
fn check_kv_types(target_rel: &str, make: &dyn Fn(&Arc<Model>) -> Box<dyn Drafter>) -> usize {
    KvType::ALL
        .into_iter()
        .filter_map(|kv| load_as(target_rel, kv))
        .map(|target| check_model(target_rel, target, make))
        .sum()
}

fn check_model(
    target_rel: &str,
    target: Arc<Model>,
    make: &dyn Fn(&Arc<Model>) -> Box<dyn Drafter>,
) -> usize {
    let kv = target.kv_type();
    let prompt: Vec<u32> = vec![1, 17, 9, 23, 42, 5, 17, 9];
    let mut accepted = 0;
    for (name, sampling) in samplings() {
        let (plain, _) = generate(&mut Session::new(target.clone(), 512), &prompt, &sampling);
        assert_eq!(plain.0.len(), TOKENS);
        for policy in policies() {
            let mut session = Session::new(target.clone(), 512);
            session.set_speculator(Some(Speculator::new(make(&target), policy)));
            let (spec, stats) = generate(&mut session, &prompt, &sampling);
            assert_eq!(spec, plain, "{target_rel} {kv} {name} {policy:?}");
            let stats = stats.expect("speculative statistics");
            accepted += stats.accepted_tokens();
            // A second answer in the same session (prefix reuse with a drafter) matches too.
            let mut prompt2 = prompt.clone();
            prompt2.extend_from_slice(&plain.0[..20]);
            let (again, _) = generate(&mut session, &prompt2, &sampling);
            let (fresh, _) = generate(&mut Session::new(target.clone(), 512), &prompt2, &sampling);
            assert_eq!(again, fresh, "{target_rel} {kv} {name}: second answer");
        }
    }
    accepted
}

const FIXTURES: [&str; 4] = [
    "llama/tiny/model-f32.gguf",
    "qwen2/tiny/model-f32.gguf",
    "qwen3/tiny/model-f32.gguf",
    "qwen3_5/tiny/model-f32.gguf",
];

#[test]
fn ngram_speculation_equals_plain_decoding() {
    let mut accepted = 0;
    for f in FIXTURES {
        accepted += check_kv_types(f, &|_| Box::new(NgramDrafter::default()));
    }
    assert!(
        accepted > 0,
        "the n-gram drafter never got a token accepted"
    );
}

/// Targets in kasoku's own formats (quantized as they load; the fixtures' 64/128 columns fit
/// them): their products are batch-invariant, so verified rows equal plain decoding's, with
/// prompt lookup and with a draft model that is itself an M copy.
#[test]
fn kasoku_format_targets_speculate_exactly() {
    use kasoku::quant::kasoku::{Recipe, Scheme};
    use kasoku::quant::Target;
    let mut accepted = 0;
    for scheme in [Scheme::M, Scheme::L, Scheme::Mixed] {
        let rel = "qwen2/tiny/model-f32.gguf";
        let target = Arc::new(
            Model::load_with(
                common::fixture(rel),
                Some(Target::Kasoku(Recipe::new(scheme))),
            )
            .unwrap(),
        );
        accepted += check_model(rel, target.clone(), &|_| Box::new(NgramDrafter::default()));
        let small = DraftModelConfig {
            vocab_rows: 40,
            ..DraftModelConfig::default()
        };
        accepted += check_model(rel, target, &|t| {
            Box::new(DraftModelDrafter::new(t.clone(), 512, t.config.vocab, small).unwrap())
        });
    }
    assert!(accepted > 0, "no draft was ever accepted");
}

#[test]
fn draft_model_speculation_equals_plain_decoding() {
    let config = DraftModelConfig::default();
    // A differently quantized copy drafts for the llama fixture (same vocabulary, other
    // predictions); the others draft for themselves with a reduced vocabulary.
    let draft = load("llama/tiny/model-q4_0.gguf");
    let mut accepted = check("llama/tiny/model-f32.gguf", &|t| {
        Box::new(DraftModelDrafter::new(draft.clone(), 512, t.config.vocab, config).unwrap())
    });
    for f in &FIXTURES[1..] {
        let small = DraftModelConfig {
            vocab_rows: 40,
            ..config
        };
        accepted += check(f, &|t| {
            Box::new(DraftModelDrafter::new(t.clone(), 512, t.config.vocab, small).unwrap())
        });
    }
    assert!(accepted > 0, "the draft model never got a token accepted");
    // A draft model requantized to Q4_0 at load (the CLI's default for --draft).
    let light = Arc::new(
        Model::load_with(
            common::fixture("llama/tiny/model-f32.gguf"),
            Some(DType::Q4_0.into()),
        )
        .unwrap(),
    );
    let up = light
        .matrices()
        .into_iter()
        .find(|(name, _)| name == "blk.0.ffn_up.weight")
        .and_then(|(_, w)| w.dtype());
    assert_eq!(up, Some(DType::Q4_0));
    check("llama/tiny/model-f32.gguf", &|t| {
        Box::new(DraftModelDrafter::new(light.clone(), 512, t.config.vocab, config).unwrap())
    });
    // A target and a draft (itself, with a reduced vocabulary) whose caches are f16 or q8_0.
    let small = DraftModelConfig {
        vocab_rows: 40,
        ..config
    };
    for kv in [KvType::F16, KvType::Q8_0] {
        let rel = "qwen3/tiny/model-f32.gguf";
        check_model(rel, load_as(rel, kv).unwrap(), &|t| {
            Box::new(DraftModelDrafter::new(t.clone(), 512, t.config.vocab, small).unwrap())
        });
    }
    // The draft model with prompt lookup's branches merged in (the default with --draft).
    check("llama/tiny/model-f32.gguf", &|t| {
        let d = DraftModelDrafter::new(draft.clone(), 512, t.config.vocab, config).unwrap();
        let lookup: Box<dyn Drafter> = Box::new(NgramDrafter::default());
        Box::new(MergedDrafter::new(Box::new(d), vec![(lookup, 3)]))
    });
}

#[test]
fn mtp_speculation_equals_plain_decoding() {
    let accepted = check_kv_types("qwen3_5/tiny_mtp/model-f32.gguf", &|t| {
        Box::new(MtpDrafter::new(t.clone(), 512).unwrap())
    });
    let _ = accepted; // random MTP weights rarely agree with the trunk; exactness is the point
    let hf = check("qwen3_5/tiny_mtp", &|t| {
        Box::new(MtpDrafter::new(t.clone(), 512).unwrap())
    });
    let _ = hf;
}

/// The tiny DFlash drafter (made for qwen2/tiny) loaded for `target`: every tiny fixture has
/// its width and vocabulary and at least the two layers it taps, so only the stated target
/// depth is set aside.
fn dflash_for(target: &Model) -> Arc<DFlash> {
    let ckpt = HfCheckpoint::open(common::fixture("qwen2/tiny_dflash")).unwrap();
    let mut config = DFlashConfig::from_hf(ckpt.config()).unwrap();
    config.target_layers = None;
    Arc::new(DFlash::from_source(config, &ckpt, target, None).unwrap())
}

/// DFlash trees (best paths under the marginals' product), alone and with prompt lookup's
/// branches, with a reduced head or the whole vocabulary, on the dense fixtures and the
/// hybrid one, greedy and sampled.
#[test]
fn dflash_speculation_equals_plain_decoding() {
    let alone = DFlashDrafterConfig {
        lookup_nodes: 0,
        ..DFlashDrafterConfig::default()
    };
    let merged = DFlashDrafterConfig {
        vocab_rows: 64,
        top_k: 4,
        lookup_nodes: 3,
    };
    let mut lookup_accepted = 0;
    for f in FIXTURES {
        for config in [alone, merged] {
            let accepted = check(f, &|t| {
                Box::new(DFlashDrafter::new(t.clone(), dflash_for(t), config).unwrap())
            });
            if config.lookup_nodes > 0 {
                lookup_accepted += accepted;
            }
        }
    }
    // Random drafter weights rarely agree with the target; the lookup branches do.
    assert!(lookup_accepted > 0, "no draft token was accepted");
    // A choice per pass between DFlash trees and prompt lookup alone (what --spec dflash runs).
    for f in [FIXTURES[1], FIXTURES[3]] {
        check(f, &|t| {
            let block = DFlashDrafter::new(t.clone(), dflash_for(t), merged).unwrap();
            Box::new(ChoiceDrafter::new(vec![
                Box::new(block),
                Box::new(NgramDrafter::default()),
            ]))
        });
    }
    // Through the engine's builder, as `--spec dflash` and `auto` make it.
    let target = load("qwen3_5/tiny/model-f32.gguf");
    let net = dflash_for(&target);
    for kind in [SpecKind::DFlash, SpecKind::Auto] {
        let draft = Some(DraftSource::DFlash(net.clone()));
        let spec = build_speculator_from(kind, &target, draft, 512, PolicyConfig::default())
            .unwrap()
            .unwrap();
        assert_eq!(spec.drafter.name(), "dflash");
    }
    let e = build_speculator_from(
        SpecKind::DFlash,
        &target,
        None,
        512,
        PolicyConfig::default(),
    );
    assert!(e.err().unwrap().to_string().contains("DFlash checkpoint"));
}

/// A drafter that asks for the target's hidden states and two layers' outputs, and records
/// what it is given (prompt, then each pass's committed tokens).
struct Recorder {
    inner: NgramDrafter,
    seen: Arc<Mutex<Seen>>,
    /// The target's width (a hidden row; a row of taps is two).
    width: usize,
}

#[derive(Default)]
struct Seen {
    tokens: Vec<u32>,
    hidden: Vec<f32>,
    taps: Vec<f32>,
}

impl Drafter for Recorder {
    fn name(&self) -> &'static str {
        "recorder"
    }
    fn wants_hidden(&self) -> bool {
        true
    }
    fn tap_layers(&self) -> Vec<usize> {
        vec![1, 0]
    }
    fn start(&mut self, prompt: &[u32], f: Features) -> Result<(), DraftError> {
        // The features are those of the prompt's last tokens; the earlier ones were given
        // before (a prefill in blocks) and are kept.
        let (hidden, taps) = (f.hidden.unwrap(), f.taps.unwrap());
        let keep = prompt.len() - hidden.len() / self.width;
        let mut s = self.seen.lock().unwrap();
        s.tokens = prompt.to_vec();
        s.hidden.truncate(keep * self.width);
        s.hidden.extend_from_slice(hidden);
        s.taps.truncate(keep * 2 * self.width);
        s.taps.extend_from_slice(taps);
        Ok(())
    }
    fn draft(&mut self, req: &DraftRequest) -> Result<TokenTree, DraftError> {
        self.inner.draft(req)
    }
    fn accept(&mut self, a: &Accepted) -> Result<(), DraftError> {
        let mut s = self.seen.lock().unwrap();
        s.tokens.extend_from_slice(a.tokens);
        s.hidden.extend_from_slice(a.features.hidden.unwrap());
        s.taps.extend_from_slice(a.features.taps.unwrap());
        Ok(())
    }
}

/// Drafters that read the target's hidden states or layer outputs (MTP, DFlash-style) get
/// exactly what plain decoding of the committed tokens computes, for the prompt and for every
/// accepted token: through `generate`, and through the server's prefill in blocks with and
/// without a prefix cache (which once handed them the prompt's last token only).
#[test]
fn drafters_receive_the_targets_features_of_committed_tokens() {
    for (rel, how) in [
        ("llama/tiny/model-f32.gguf", "generate"),
        ("qwen3_5/tiny/model-f32.gguf", "generate"),
        ("llama/tiny/model-f32.gguf", "blocks"),
        ("qwen3_5/tiny/model-f32.gguf", "blocks"),
        ("llama/tiny/model-f32.gguf", "prefix cache"),
        ("qwen3_5/tiny/model-f32.gguf", "prefix cache"),
    ] {
        let model = load(rel);
        let prompt: Vec<u32> = vec![1, 17, 9, 23, 42, 5, 17, 9];
        let mut session = Session::new(model.clone(), 256);
        let seen = Arc::new(Mutex::new(Seen::default()));
        let recorder = Recorder {
            inner: NgramDrafter::default(),
            seen: seen.clone(),
            width: model.config.hidden,
        };
        let fixed = PolicyConfig {
            max_budget: 4,
            max_depth: 4,
            adaptive: false,
        };
        session.set_speculator(Some(Speculator::new(Box::new(recorder), fixed)));
        let options = GenerateOptions {
            logprobs: None,
            sampling: SamplingParams::default(),
            max_tokens: 60,
            stop_tokens: Vec::new(),
            constraint: None,
        };
        let cache = Mutex::new(PrefixCache::new(64 << 20, 4));
        match how {
            "generate" => session.generate(&prompt, &options, &mut |_| Flow::Continue),
            "blocks" => session.generate_cached(None, &prompt, &options, &mut |_| Flow::Continue),
            _ => session.generate_cached(Some(&cache), &prompt, &options, &mut |_| Flow::Continue),
        }
        .unwrap();
        let rec = seen.lock().unwrap();
        // Plain decoding of the same tokens, one at a time after the prompt.
        let mut state = model.new_state(256);
        let (mut hidden, mut taps) = model.forward_taps(&mut state, &prompt, &[1, 0]).unwrap();
        for &t in &rec.tokens[prompt.len()..] {
            let (h, tp) = model.forward_taps(&mut state, &[t], &[1, 0]).unwrap();
            hidden.extend(h);
            taps.extend(tp);
        }
        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert!(rec.tokens.len() > prompt.len() + 30, "{rel} {how}");
        assert_eq!(
            bits(&rec.hidden),
            bits(&hidden),
            "{rel} {how}: hidden states"
        );
        assert_eq!(bits(&rec.taps), bits(&taps), "{rel} {how}: layer outputs");
    }
}

/// A toy grammar over a four-token alphabet: never the same token twice in a row, and a
/// token ≥ 32 only after token 7.
#[derive(Clone)]
struct NoRepeat {
    vocab: usize,
    last: Option<u32>,
}

impl NoRepeat {
    const ALPHABET: [u32; 4] = [7, 11, 40, 53];
}

impl TokenConstraint for NoRepeat {
    fn mask(&mut self) -> Result<TokenMask, ConstraintError> {
        let mut m = TokenMask::none(self.vocab);
        for t in Self::ALPHABET {
            if Some(t) != self.last && (t < 32 || self.last == Some(7)) {
                m.allow(t);
            }
        }
        Ok(m)
    }
    fn advance(&mut self, token: u32) -> Result<(), ConstraintError> {
        if !self.mask()?.is_allowed(token) {
            return Err(ConstraintError(format!("{token} not allowed")));
        }
        self.last = Some(token);
        Ok(())
    }
    fn fork(&self) -> Box<dyn TokenConstraint> {
        Box::new(self.clone())
    }
}

/// Under a constraint, speculative decoding still gives plain decoding's tokens (the
/// acceptance walk samples every node from the masked distribution), greedy and sampled, with
/// a drafter that knows nothing of the constraint; and every token obeys it.
#[test]
fn constrained_speculation_equals_constrained_plain_decoding() {
    let mut accepted = 0;
    for (rel, kv) in [
        ("llama/tiny/model-f32.gguf", KvType::F32),
        ("llama/tiny/model-f32.gguf", KvType::F16),
        ("qwen3_5/tiny/model-f32.gguf", KvType::F32),
        ("qwen3_5/tiny/model-f32.gguf", KvType::Q8_0),
    ] {
        let target = load_as(rel, kv).unwrap();
        let vocab = target.config.vocab;
        let constraint = Constraint::new(NoRepeat { vocab, last: None });
        let prompt: Vec<u32> = vec![1, 7, 11, 7, 40, 11, 53, 7];
        for (name, sampling) in samplings() {
            let options = GenerateOptions {
                logprobs: None,
                sampling: sampling.clone(),
                max_tokens: 120,
                stop_tokens: Vec::new(),
                constraint: Some(constraint.clone()),
            };
            let run = |session: &mut Session| {
                let g = session
                    .generate(&prompt, &options, &mut |_| Flow::Continue)
                    .unwrap();
                (g.tokens, g.stats.spec)
            };
            let (plain, _) = run(&mut Session::new(target.clone(), 512));
            assert_eq!(plain.len(), 120);
            let mut check = NoRepeat { vocab, last: None };
            for &t in &plain {
                check.advance(t).unwrap();
            }
            for policy in policies() {
                let mut session = Session::new(target.clone(), 512);
                let drafter = Box::new(NgramDrafter::default());
                session.set_speculator(Some(Speculator::new(drafter, policy)));
                let (spec, stats) = run(&mut session);
                assert_eq!(spec, plain, "{rel} {kv} {name} {policy:?}");
                accepted += stats.unwrap().accepted_tokens();
            }
        }
    }
    assert!(
        accepted > 0,
        "no draft token was accepted under the constraint"
    );
}
