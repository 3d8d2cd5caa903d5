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
    eprintln!("{what}: batched vs transformers: relative max diff {d:.2e}");
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
    use crate::format::test_util::{cached_model, QWEN25_05B, SMOLLM2};

    fn gguf(rel: &str) {
        let dir = fixture_dir(rel);
        let file = dir.join("model-f32.gguf");
        if !file.exists() {
            // e.g. qwen3_5/tiny_vl: dk != dv, which llama.cpp's qwen35 loader cannot take.
            eprintln!("note: {rel} has no GGUF; skipped");
            return;
        }
        check_fixture(&dir, &file);
    }

    /// Logits of each quantized GGUF of a fixture against llama.cpp's for the same file.
    ///
    /// Both engines quantize activations to 8 bits before each product, so a 1e-7 difference
    /// upstream (an exp or a sum order) can flip one rounding and move a logit by ~1e-3 of its
    /// scale, which attention then carries to later positions. Observed: most positions agree
    /// to ~2e-7 relative; a flipped one to ~5e-4 (Q8_0) or ~1e-2 (Q4_1). So: every position
    /// within 3e-2 relative, at least one within 1e-5, and the same argmax wherever llama.cpp's
    /// top-2 margin exceeds 0.5.
    fn check_quantized(rel: &str) {
        let dir = fixture_dir(rel);
        if !dir.join("reference.json").exists() {
            eprintln!("note: fixture {rel} absent; skipped");
            return;
        }
        let text = std::fs::read_to_string(dir.join("reference.json")).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let r = reference(&dir);
        let vocab = r.vocab;
        for q in v["gguf"]["quantized"].as_array().into_iter().flatten() {
            let file = q["file"].as_str().unwrap();
            let want: Vec<f64> = q["llama_cpp_logits"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|row| row.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()))
                .collect();
            let model = Model::load(dir.join(file)).unwrap();
            let mut st = model.new_state(r.tokens.len());
            let got = model.forward(&mut st, &r.tokens, Logits::All).unwrap();
            let diffs: Vec<f64> = (0..r.tokens.len())
                .map(|p| {
                    rel_diff(
                        &got[p * vocab..(p + 1) * vocab],
                        &want[p * vocab..(p + 1) * vocab],
                    )
                })
                .collect();
            let shown = diffs
                .iter()
                .map(|d| format!("{d:.1e}"))
                .collect::<Vec<_>>()
                .join(" ");
            eprintln!("{rel}/{file}: per-position relative diff vs llama.cpp: {shown}");
            assert!(diffs.iter().all(|&d| d < 3e-2), "{rel}/{file}: {shown}");
            assert!(
                diffs.iter().any(|&d| d < 1e-5),
                "{rel}/{file}: no position agrees closely: {shown}"
            );
            for p in 0..r.tokens.len() {
                let w = &want[p * vocab..(p + 1) * vocab];
                let mut order: Vec<usize> = (0..vocab).collect();
                order.sort_by(|&a, &b| w[b].total_cmp(&w[a]));
                if w[order[0]] - w[order[1]] > 0.5 {
                    assert_eq!(
                        argmax(&got[p * vocab..(p + 1) * vocab]) as usize,
                        order[0],
                        "{rel}/{file} position {p}"
                    );
                }
            }
        }
    }

    fn hf(rel: &str) {
        let dir = fixture_dir(rel);
        check_fixture(&dir, &dir);
    }

    #[test]
    fn quantized_fixtures_match_llama_cpp() {
        check_quantized("llama/tiny");
        check_quantized("llama/smolshape");
    }

    #[test]
    fn llama_smolshape_gguf_and_hf() {
        if !fixture_dir("llama/smolshape").exists() {
            eprintln!("note: fixture llama/smolshape absent; skipped");
            return;
        }
        gguf("llama/smolshape");
        hf("llama/smolshape");
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

    /// Greedy decoding from `prompt` (batched prefill, then one token at a time).
    fn greedy(model: &Model, prompt: &[u32], n: usize) -> Vec<u32> {
        let mut st = model.new_state(prompt.len() + n);
        let mut last = model.forward(&mut st, prompt, Logits::Last).unwrap();
        let mut out = Vec::new();
        for _ in 0..n {
            let t = argmax(&last);
            out.push(t);
            last = model.forward(&mut st, &[t], Logits::Last).unwrap();
        }
        out
    }

    /// Qwen2.5-Coder-0.5B (Q4_K/Q6_K/Q5_0/Q8_0 mix, QKV bias, NEOX RoPE): greedy tokens equal
    /// llama.cpp's (`tools/llama_logits.py greedy MODEL --tokens ... -n N`, f32 KV cache),
    /// cut where llama.cpp's top-2 logit margin first drops below 0.5 (past that, a near-tie
    /// decides, and kernels that differ in rounding may rightly pick the other token).
    /// Prompts' ids from tests/fixtures/tokenizer/qwen2.5-coder-0.5b.json.
    #[test]
    fn qwen25_coder_05b_greedy_matches_llama_cpp() {
        let Some(path) = cached_model(QWEN25_05B) else {
            return;
        };
        let model = Model::load(&path).unwrap();
        // "def fibonacci(n):\n    if n < 2:\n        return n\n    return"
        let code = [
            750u32, 75698, 1445, 982, 262, 421, 308, 366, 220, 17, 510, 286, 470, 308, 198, 262,
            470,
        ];
        // " fibonacci(n-1) + fibonacci(n-2)\n\n# Example usage" (margins 6.9 9.9 0.76 5.9 ... 5.8)
        let want = [
            75698u32, 1445, 12, 16, 8, 488, 75698, 1445, 12, 17, 692, 2, 13383, 10431,
        ];
        assert_eq!(greedy(&model, &code, want.len()), want);
        // "The capital of France is" → " Paris" (margin 4.1; the next step's is 0.11)
        assert_eq!(greedy(&model, &[785, 6722, 315, 9625, 374], 1), [12095]);
    }

    /// Qwen2.5-Coder-1.5B (the speed target): "def fibonacci(n):\n" → llama.cpp's greedy
    /// "    if n <=" (same tool, f32 cache, decoding token by token: top-2 margins 4.35 1.09
    /// 5.86 0.74 7.14), cut where the margin first drops below 0.5, as for the 0.5B: the next
    /// token is llama.cpp's " 0" over " 1" by 0.038 (0.25 when it evaluates the sequence in
    /// one batch), a coin toss between correct engines (on this prompt kasoku's logits differ
    /// from llama.cpp's by up to 0.5, as much as llama.cpp's own f16 cache moves them).
    #[test]
    fn qwen25_coder_15b_greedy_matches_llama_cpp() {
        let Some(path) = cached_model("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf") else {
            return;
        };
        let model = Model::load(&path).unwrap();
        let want = [262u32, 421, 308, 2651, 220];
        assert_eq!(greedy(&model, &[750, 75698, 1445, 982], want.len()), want);
    }

    /// SmolLM2 greedy beyond " Paris" equals llama.cpp's (same tool and cut-off as above):
    /// " Paris.\n\nThe" (margins 2.4 1.1 1.3 1.8 0.9; the next step's is 0.03).
    #[test]
    fn smollm2_greedy_matches_llama_cpp() {
        let Some(path) = cached_model(SMOLLM2) else {
            return;
        };
        let model = Model::load(&path).unwrap();
        let want = [7042u32, 30, 198, 198, 504];
        assert_eq!(
            greedy(&model, &[504, 3575, 282, 4649, 314], want.len()),
            want
        );
    }

    /// SmolLM2 on a 42-token prompt against llama.cpp's top-20 logits per position
    /// (tests/fixtures/smollm2/reference.json, tools/smollm2_reference.py): same top-1 wherever
    /// llama.cpp's top-2 margin exceeds 0.5 (overall agreement is printed: 39-40 of 42 here,
    /// as for llama.cpp itself with an f16 cache), and top-20 logits within 1.5 (llama.cpp's
    /// own f16 cache moves them by up to 0.61; 8-bit activation rounding flips, see
    /// `check_quantized`, compound over 30 layers: measured 0.74, KL 0.032).
    #[test]
    fn smollm2_matches_llama_cpp_top20() {
        let Some(path) = cached_model(SMOLLM2) else {
            return;
        };
        let text = std::fs::read_to_string(fixture_dir("smollm2/reference.json")).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let tokens: Vec<u32> = v["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect();
        let model = Model::load(&path).unwrap();
        let vocab = model.config.vocab;
        let mut st = model.new_state(tokens.len());
        let got = model.forward(&mut st, &tokens, Logits::All).unwrap();
        let (mut agree, mut worst_kl, mut worst_abs) = (0, 0f64, 0f64);
        for (p, pos) in v["positions"].as_array().unwrap().iter().enumerate() {
            let ids: Vec<usize> = pos["top_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as usize)
                .collect();
            let ref_logits: Vec<f64> = pos["top_logits"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect();
            let ref_lse = pos["logsumexp"].as_f64().unwrap();
            let row = &got[p * vocab..(p + 1) * vocab];
            let m = row.iter().fold(f64::NEG_INFINITY, |m, &x| m.max(x as f64));
            let lse = m + row.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln();
            // KL(ref ‖ ours) over the reference's top-k (the bulk of its probability mass).
            let kl: f64 = ids
                .iter()
                .zip(&ref_logits)
                .map(|(&id, &l)| {
                    let lp = l - ref_lse;
                    lp.exp() * (lp - (row[id] as f64 - lse))
                })
                .sum();
            worst_kl = worst_kl.max(kl);
            for (&id, &l) in ids.iter().zip(&ref_logits) {
                worst_abs = worst_abs.max((row[id] as f64 - l).abs());
            }
            let top = argmax(row) as usize;
            if top == ids[0] {
                agree += 1;
            } else {
                eprintln!(
                    "position {p}: ours {top}, llama.cpp {} (margin {:.3})",
                    ids[0],
                    ref_logits[0] - ref_logits[1]
                );
                assert!(
                    ref_logits[0] - ref_logits[1] <= 0.5,
                    "position {p}: top-1 {top}, llama.cpp {} by a margin of {}",
                    ids[0],
                    ref_logits[0] - ref_logits[1]
                );
            }
        }
        eprintln!("smollm2 vs llama.cpp: top-1 agrees at {agree}/{} positions, worst top-20 KL {worst_kl:.2e}, max |Δ logit| over top-20 {worst_abs:.3}", tokens.len());
        assert!(
            worst_abs < 1.5 && worst_kl < 0.1,
            "max |Δ| {worst_abs}, KL {worst_kl}"
        );
    }

    /// Timing, not correctness: `cargo test --release -p kasoku --lib smollm2_speed -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn smollm2_speed() {
        let Some(path) = cached_model(SMOLLM2) else {
            return;
        };
        let model = Model::load(&path).unwrap();
        let prompt: Vec<u32> = (0..128u32).map(|i| 100 + (i * 37) % 4000).collect();
        let mut st = model.new_state(512);
        let t0 = std::time::Instant::now();
        let mut last = model.forward(&mut st, &prompt, Logits::Last).unwrap();
        let prefill = t0.elapsed().as_secs_f64();
        let t1 = std::time::Instant::now();
        let steps = 64;
        for _ in 0..steps {
            let tok = argmax(&last);
            last = model.forward(&mut st, &[tok], Logits::Last).unwrap();
        }
        let decode = t1.elapsed().as_secs_f64();
        eprintln!(
            "smollm2-135m Q4_1, {} threads: prefill {} tokens {:.1} tok/s; decode {:.1} tok/s",
            crate::kernels::threads::num_threads(),
            prompt.len(),
            prompt.len() as f64 / prefill,
            steps as f64 / decode
        );
    }
}
