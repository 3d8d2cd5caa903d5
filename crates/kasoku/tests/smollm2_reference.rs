//! SmolLM2-135M-Instruct Q4_1, real weights, against llama.cpp run on the same file
//! (tests/fixtures/smollm2/reference.json, made by tools/smollm2_reference.py): next-token
//! logits at every position of a 42-token prompt, and a greedy continuation.
//!
//! Both engines compute the same integer products (int8 activations with f16 scales), but add
//! the per-block f32 results in a different order. Those last-bit differences occasionally tip
//! an activation's int8 rounding the other way, which moves this model's logits by up to ~0.3
//! (measured: ~0.2-0.5 at some positions, 0 at others). So the thresholds are:
//! - top-1 agrees at every position where llama.cpp's top-2 margin is at least 0.5 logits, and
//!   at no fewer than 38 of the 42 positions overall (measured: 39; the others are near-ties
//!   with margins 0.05-0.11; llama.cpp itself agrees with this reference at only 40 of 42
//!   positions when its KV cache is f16 instead of f32);
//! - the KL divergence of kasoku's distribution from llama.cpp's, over llama.cpp's top-20
//!   tokens, is below 0.01 nats on average and 0.05 at worst (measured: about 0.006 and 0.03);
//! - greedy "The capital of France is" continues with " Paris", and the first four tokens of
//!   llama.cpp's continuation agree.
//!
//! A wrong kernel, norm or RoPE layout gives KL values orders of magnitude above these.

mod common;

use kasoku::engine::sampler::argmax;
use kasoku::model::{Logits, Model};
use serde_json::Value;

fn reference() -> Value {
    let text = std::fs::read_to_string(common::fixture("smollm2/reference.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn log_sum_exp(row: &[f32]) -> f64 {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    max + row
        .iter()
        .map(|&l| (l as f64 - max).exp())
        .sum::<f64>()
        .ln()
}

#[test]
fn logits_match_llama_cpp_on_the_same_file() {
    let Some(path) = common::real_model("smollm2-135m") else {
        return;
    };
    let reference = reference();
    let tokens = ids(&reference["tokens"]);
    let model = Model::load(&path).unwrap();
    let vocab = model.config.vocab;
    let mut state = model.new_state(tokens.len() + 1);
    let logits = model.forward(&mut state, &tokens, Logits::All).unwrap();

    let mut kls = Vec::new();
    let mut agree = 0;
    for (pos, expected) in reference["positions"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
    {
        let row = &logits[pos * vocab..(pos + 1) * vocab];
        let top = ids(&expected["top_ids"]);
        let top_logits: Vec<f64> = expected["top_logits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        let ref_lse = expected["logsumexp"].as_f64().unwrap();
        let margin = top_logits[0] - top_logits[1];
        if argmax(row) == top[0] {
            agree += 1;
        } else {
            assert!(
                margin < 0.5,
                "top-1 differs from llama.cpp at position {pos}, where its margin is {margin}"
            );
        }
        let our_lse = log_sum_exp(row);
        let kl: f64 = top
            .iter()
            .zip(&top_logits)
            .map(|(&id, &l)| {
                let p = (l - ref_lse).exp();
                let q = (row[id as usize] as f64 - our_lse).exp();
                p * (p / q).ln()
            })
            .sum();
        kls.push(kl.max(0.0));
    }
    assert!(
        agree >= 38,
        "top-1 agrees at only {agree} of {} positions",
        kls.len()
    );
    let mean = kls.iter().sum::<f64>() / kls.len() as f64;
    let worst = kls.iter().copied().fold(0.0, f64::max);
    eprintln!("KL(llama.cpp || kasoku) over top-20: mean {mean:.2e}, max {worst:.2e}");
    assert!(mean < 0.01, "mean KL {mean}");
    assert!(worst < 0.05, "max KL {worst}");
}

#[test]
fn greedy_continuation_matches_llama_cpp() {
    let Some(path) = common::real_model("smollm2-135m") else {
        return;
    };
    let reference = reference();
    let greedy = &reference["greedy"];
    let prompt = ids(&greedy["prompt_tokens"]);
    let expected = ids(&greedy["continuation"]);
    let model = Model::load(&path).unwrap();
    let mut state = model.new_state(64);
    let mut logits = model.forward(&mut state, &prompt, Logits::Last).unwrap();
    let mut got = Vec::new();
    for _ in 0..expected.len() {
        let t = argmax(&logits);
        got.push(t);
        logits = model.forward(&mut state, &[t], Logits::Last).unwrap();
    }
    assert_eq!(got[0], 7042, "' Paris' expected first, got {got:?}");
    assert_eq!(
        got[..4],
        expected[..4],
        "llama.cpp continues with {:?}",
        greedy["text"]
    );
}
