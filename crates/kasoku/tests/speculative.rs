//! Speculative decoding gives exactly the tokens plain decoding gives: every architecture's
//! fixture (the Qwen3.5 hybrid included), greedy and sampled, with each drafter, over a few
//! hundred tokens, with fixed and adaptive tree budgets.

mod common;

use std::sync::Arc;

use kasoku::engine::{Flow, GenerateOptions, SamplingParams, Session, Speculator};
use kasoku::model::Model;
use kasoku::spec::draft_model::DraftModelConfig;
use kasoku::spec::{DraftModelDrafter, Drafter, MtpDrafter, NgramDrafter, PolicyConfig, SpecStats};

const TOKENS: usize = 240;

fn load(rel: &str) -> Arc<Model> {
    Arc::new(Model::load(common::fixture(rel)).unwrap())
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

fn generate(
    session: &mut Session,
    prompt: &[u32],
    sampling: &SamplingParams,
) -> (Vec<u32>, Option<SpecStats>) {
    let options = GenerateOptions {
        sampling: sampling.clone(),
        max_tokens: TOKENS,
        stop_tokens: Vec::new(),
    };
    let g = session
        .generate(prompt, &options, &mut |_| Flow::Continue)
        .unwrap();
    (g.tokens, g.stats.spec)
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
    let target = load(target_rel);
    let prompt: Vec<u32> = vec![1, 17, 9, 23, 42, 5, 17, 9];
    let mut accepted = 0;
    for (name, sampling) in samplings() {
        let (plain, _) = generate(&mut Session::new(target.clone(), 512), &prompt, &sampling);
        assert_eq!(plain.len(), TOKENS);
        for policy in policies() {
            let mut session = Session::new(target.clone(), 512);
            session.set_speculator(Some(Speculator::new(make(&target), policy)));
            let (spec, stats) = generate(&mut session, &prompt, &sampling);
            assert_eq!(spec, plain, "{target_rel} {name} {policy:?}");
            let stats = stats.expect("speculative statistics");
            accepted += stats.accepted_tokens();
            // A second answer in the same session (prefix reuse with a drafter) matches too.
            let mut prompt2 = prompt.clone();
            prompt2.extend_from_slice(&plain[..20]);
            let (again, _) = generate(&mut session, &prompt2, &sampling);
            let (fresh, _) = generate(&mut Session::new(target.clone(), 512), &prompt2, &sampling);
            assert_eq!(again, fresh, "{target_rel} {name}: second answer");
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
        accepted += check(f, &|_| Box::new(NgramDrafter::default()));
    }
    assert!(
        accepted > 0,
        "the n-gram drafter never got a token accepted"
    );
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
}

#[test]
fn mtp_speculation_equals_plain_decoding() {
    let accepted = check("qwen3_5/tiny_mtp/model-f32.gguf", &|t| {
        Box::new(MtpDrafter::new(t.clone()).unwrap())
    });
    let _ = accepted; // random MTP weights rarely agree with the trunk; exactness is the point
    let hf = check("qwen3_5/tiny_mtp", &|t| {
        Box::new(MtpDrafter::new(t.clone()).unwrap())
    });
    let _ = hf;
}
