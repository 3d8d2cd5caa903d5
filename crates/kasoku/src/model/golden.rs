//! Golden tests: kasoku's logits against Hugging Face transformers' on the committed tiny
//! fixtures (`tests/fixtures/<arch>/<name>/`: `reference.json` made by tools/, a GGUF and a
//! safetensors copy of the same random weights), and greedy decoding of a real model.
//! Each fixture is checked batched and token by token (prefill 5, then one at a time).

use std::path::{Path, PathBuf};

use super::testing::rel_diff;
use super::{Logits, Model, ModelError};

const TOL: f64 = 1e-4;

pub(crate) fn fixture_dir(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(rel)
}

pub(crate) struct Reference {
    pub tokens: Vec<u32>,
    pub vocab: usize,
    /// `tokens.len() × vocab`.
    pub logits: Vec<f64>,
    pub greedy: Vec<u32>,
}

pub(crate) fn reference(dir: &Path) -> Reference {
    let text = std::fs::read_to_string(dir.join("reference.json")).expect("read reference.json");
    let v: serde_json::Value = serde_json::from_str(&text).expect("parse reference.json");
    let ids = |key: &str| -> Vec<u32> {
        v[key]
            .as_array()
            .unwrap_or_else(|| panic!("reference.json: no '{key}'"))
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect()
    };
    let logits: Vec<f64> = v["logits"]
        .as_array()
        .expect("logits")
        .iter()
        .flat_map(|row| row.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()))
        .collect();
    Reference {
        tokens: ids("tokens"),
        vocab: v["vocab_size"].as_u64().unwrap() as usize,
        logits,
        greedy: ids("greedy_continuation"),
    }
}

/// Loads `model_path` and checks it against the fixture in `dir`; returns false (with a note)
/// when the model uses something this build does not implement yet.
pub(crate) fn check_fixture(dir: &Path, model_path: &Path) -> bool {
    let r = reference(dir);
    let model = match Model::load(model_path) {
        Ok(m) => m,
        Err(ModelError::Unsupported(what)) => {
            eprintln!("note: {}: skipped ({what})", model_path.display());
            return false;
        }
        Err(e) => panic!("{}: {e}", model_path.display()),
    };
    assert_eq!(model.config.vocab, r.vocab);
    let what = model_path.display();
    let t = r.tokens.len();

    let mut st = model.new_state(t + r.greedy.len());
    let all = model.forward(&mut st, &r.tokens, Logits::All).unwrap();
    let d = rel_diff(&all, &r.logits);
    assert!(
        d < TOL,
        "{what}: batched logits differ from transformers by {d:e} (relative)"
    );

    let mut st = model.new_state(t);
    let mut stepped = model.forward(&mut st, &r.tokens[..5], Logits::All).unwrap();
    for &tok in &r.tokens[5..] {
        stepped.extend(model.forward(&mut st, &[tok], Logits::Last).unwrap());
    }
    let d = rel_diff(&stepped, &r.logits);
    assert!(
        d < TOL,
        "{what}: token-by-token logits differ from transformers by {d:e} (relative)"
    );

    // Greedy continuation, fed back one token at a time on top of the batched state.
    let mut st = model.new_state(t + r.greedy.len());
    let mut last = model.forward(&mut st, &r.tokens, Logits::Last).unwrap();
    for (i, &want) in r.greedy.iter().enumerate() {
        let got = argmax(&last);
        assert_eq!(got, want, "{what}: greedy token {i}");
        last = model.forward(&mut st, &[got], Logits::Last).unwrap();
    }
    true
}

pub(crate) fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::gguf::GgufFile;
    use crate::format::test_util::{cached_model, SMOLLM2};

    fn gguf(rel: &str) {
        let dir = fixture_dir(rel);
        check_fixture(&dir, &dir.join("model-f32.gguf"));
    }

    fn hf(rel: &str) {
        let dir = fixture_dir(rel);
        check_fixture(&dir, &dir);
    }

    #[test]
    fn llama_tiny_hf() {
        hf("llama/tiny");
    }

    #[test]
    fn llama3_rope_scaling_hf() {
        hf("llama/tiny_rope_llama3");
    }

    #[test]
    fn qwen2_tiny_hf() {
        hf("qwen2/tiny");
    }

    #[test]
    fn qwen3_tiny_hf() {
        hf("qwen3/tiny");
    }

    #[test]
    fn qwen35_tiny_hf() {
        hf("qwen3_5/tiny");
    }

    #[test]
    fn qwen35_tiny_vl_hf() {
        hf("qwen3_5/tiny_vl");
    }

    #[test]
    fn llama_tiny_gguf() {
        gguf("llama/tiny");
    }

    #[test]
    fn llama3_rope_scaling_gguf() {
        gguf("llama/tiny_rope_llama3");
    }

    #[test]
    fn qwen2_tiny_gguf() {
        gguf("qwen2/tiny");
    }

    #[test]
    fn qwen3_tiny_gguf() {
        gguf("qwen3/tiny");
    }

    #[test]
    fn qwen35_tiny_gguf() {
        gguf("qwen3_5/tiny");
    }

    #[test]
    fn qwen35_tiny_vl_gguf() {
        gguf("qwen3_5/tiny_vl");
    }

    /// SmolLM2-135M (Q4_1 weights, Q8_0 embedding): "The capital of France is" → " Paris".
    #[test]
    fn smollm2_capital_of_france() {
        let Some(path) = cached_model(SMOLLM2) else {
            return;
        };
        let model = Model::load(&path).unwrap();
        let file = GgufFile::open(&path).unwrap();
        let vocab = file.get_array("tokenizer.ggml.tokens").unwrap();
        let paris = vocab
            .iter()
            .position(|t| t.as_str() == Some("ĠParis"))
            .expect("token ' Paris'") as u32;
        // Ids of "The capital of France is" from tests/fixtures/tokenizer/smollm2-135m.json
        // (llama.cpp's tokenizer, cross-checked with transformers).
        let prompt = [504u32, 3575, 282, 4649, 314];
        let mut st = model.new_state(32);
        let logits = model.forward(&mut st, &prompt, Logits::Last).unwrap();
        assert_eq!(
            argmax(&logits),
            paris,
            "greedy continuation is not ' Paris'"
        );
        // The same through the cache one token at a time.
        let mut st = model.new_state(32);
        let mut last = Vec::new();
        for &t in &prompt {
            last = model.forward(&mut st, &[t], Logits::Last).unwrap();
        }
        assert_eq!(argmax(&last), paris);
        let d = rel_diff(&last, &logits.iter().map(|&v| v as f64).collect::<Vec<_>>());
        assert!(
            d < 1e-3,
            "batched vs token-by-token on quantized weights: {d:e}"
        );
    }
}
