//! kasoku's own formats on the tiny transformers fixtures (tests/fixtures/{llama,qwen2,qwen3}/
//! tiny: Hugging Face directories with `reference.json`, logits from transformers in f32):
//! quantized as they load to L, M and mixed, rotated and not, the logits stay within a stated
//! distance of transformers' (relative L2 over every position; the f32 model itself is under
//! 1e-4): L below 0.045 and within 1.4x GGUF Q8_0's distance, M and mixed below 0.35 and
//! within 1.2x Q4_0's (these random-init models measure 0.024-0.036 for L against Q8_0's
//! 0.024-0.030, and 0.18-0.30 for M and mixed against Q4_0's 0.25-0.32); a checkpoint written by
//! `format::kasoku_write` from the directory (HF names) or from the f32 GGUF (GGUF names,
//! `kasoku.gguf` beside) loads through `LoadedModel` to the very logits of quantizing at load;
//! damaged copies are refused with an error naming the problem.

mod common;

use std::path::Path;

use kasoku::engine::LoadedModel;
use kasoku::format::checkpoint::GGUF_META;
use kasoku::format::kasoku_write::{write_quantized, Naming};
use kasoku::format::{write_gguf, Checkpoint, MetaValue};
use kasoku::model::{KvType, Logits, Model};
use kasoku::quant::kasoku::{Recipe, Scheme};
use kasoku::quant::Target;

const FIXTURES: [&str; 3] = ["llama/tiny", "qwen2/tiny", "qwen3/tiny"];

fn reference(dir: &Path) -> (Vec<u32>, Vec<f32>) {
    let text = std::fs::read_to_string(dir.join("reference.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let tokens = v["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect();
    let logits = v["logits"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|row| row.as_array().unwrap().iter())
        .map(|x| x.as_f64().unwrap() as f32)
        .collect();
    (tokens, logits)
}

fn logits(model: &Model, tokens: &[u32]) -> Vec<f32> {
    let mut st = model.new_state(tokens.len() + 4);
    model.forward(&mut st, tokens, Logits::All).unwrap()
}

fn rel(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den).sqrt()
}

/// Fraction of positions whose argmax agrees.
fn top1(a: &[f32], b: &[f32], vocab: usize) -> f64 {
    let arg = |r: &[f32]| {
        r.iter()
            .enumerate()
            .fold((0, f32::MIN), |m, (i, &v)| if v > m.1 { (i, v) } else { m })
            .0
    };
    let rows = a.len() / vocab;
    let same = a
        .chunks_exact(vocab)
        .zip(b.chunks_exact(vocab))
        .filter(|(x, y)| arg(x) == arg(y))
        .count();
    same as f64 / rows as f64
}

#[test]
fn fixtures_quantized_at_load_stay_close_to_transformers() {
    for fx in FIXTURES {
        let dir = common::fixture(fx);
        let (tokens, want) = reference(&dir);
        let f32_model = Model::load(&dir).unwrap();
        let vocab = f32_model.config.vocab;
        let base = rel(&logits(&f32_model, &tokens), &want);
        assert!(base < 1e-4, "{fx}: the f32 model is off ({base})");
        // GGUF's Q8_0 and Q4_0 (requantized at load from the same f32 weights) as yardsticks.
        let gguf = |to| {
            let g = Model::load_with(&dir, Some(Target::Gguf(to))).unwrap();
            rel(&logits(&g, &tokens), &want)
        };
        let (q8, q4) = (
            gguf(kasoku::quant::DType::Q8_0),
            gguf(kasoku::quant::DType::Q4_0),
        );
        eprintln!("{fx} Q8_0: rel {q8:.4}; Q4_0: rel {q4:.4}");
        for (scheme, bound) in [
            (Scheme::L, 0.045f64.min(1.4 * q8)),
            (Scheme::M, 0.35f64.min(1.2 * q4)),
            (Scheme::Mixed, 0.35f64.min(1.2 * q4)),
        ] {
            for rotate in [true, false] {
                let recipe = Recipe {
                    rotate,
                    ..Recipe::new(scheme)
                };
                let m = Model::load_with(&dir, Some(Target::Kasoku(recipe))).unwrap();
                let got = logits(&m, &tokens);
                let (r, agree) = (rel(&got, &want), top1(&got, &want, vocab));
                eprintln!("{fx} {recipe:?}: rel {r:.4} top-1 {agree:.2}");
                assert!(r < bound, "{fx} {recipe:?}: rel {r} >= {bound}");
                assert!(r > base, "{fx} {recipe:?}: quantization changed nothing");
            }
        }
    }
}

/// Writes a metadata-only GGUF beside GGUF-named weights, as `kasoku quantize` does.
fn write_from_gguf(gguf: &Path, out: &Path, recipe: Recipe) {
    let Checkpoint::Gguf(file) = Checkpoint::open(gguf).unwrap() else {
        panic!("not a GGUF file")
    };
    let meta: Vec<(&String, MetaValue)> = file
        .metadata()
        .iter()
        .map(|(k, v)| (k, v.clone()))
        .collect();
    let none: [(&str, kasoku::quant::DType, [usize; 0], [u8; 0]); 0] = [];
    write_gguf(out.join(GGUF_META), &meta, &none).unwrap();
    write_quantized(
        &file,
        Naming::Gguf,
        recipe,
        &out.join("model.safetensors"),
        &mut |_, _, _| {},
    )
    .unwrap();
}

#[test]
fn written_checkpoints_load_everywhere_and_damage_is_refused() {
    let tmp = std::env::temp_dir().join(format!("kasoku-formats-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    for fx in FIXTURES {
        let dir = common::fixture(fx);
        let (tokens, _) = reference(&dir);
        let recipe = Recipe::new(Scheme::M);
        let at_load = logits(
            &Model::load_with(&dir, Some(Target::Kasoku(recipe))).unwrap(),
            &tokens,
        );
        // From the HF directory: HF names, side files copied.
        let hf_out = tmp.join(format!("{}-hf", fx.replace('/', "-")));
        std::fs::create_dir_all(&hf_out).unwrap();
        for f in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
            std::fs::copy(dir.join(f), hf_out.join(f)).unwrap();
        }
        let Checkpoint::Hf(hf) = Checkpoint::open(&dir).unwrap() else {
            panic!("{fx} is not an HF directory")
        };
        write_quantized(
            &hf,
            Naming::Hf(&hf),
            recipe,
            &hf_out.join("model.safetensors"),
            &mut |_, _, _| {},
        )
        .unwrap();
        let loaded = LoadedModel::load_with(&hf_out, KvType::F32).unwrap();
        assert_eq!(logits(&loaded.model, &tokens), at_load, "{fx} from HF");
        let text = loaded.tokenizer.decode(&tokens);
        assert!(!text.is_empty());
        // From the f32 GGUF: GGUF names and metadata. The GGUF's Q/K rows follow llama.cpp's
        // order for llama, so its logits are compared with its own quantization at load.
        let gguf = dir.join("model-f32.gguf");
        let g_out = tmp.join(format!("{}-gguf", fx.replace('/', "-")));
        std::fs::create_dir_all(&g_out).unwrap();
        write_from_gguf(&gguf, &g_out, recipe);
        let loaded = LoadedModel::load_with(&g_out, KvType::F32).unwrap();
        let gguf_at_load = logits(
            &Model::load_with(&gguf, Some(Target::Kasoku(recipe))).unwrap(),
            &tokens,
        );
        assert_eq!(
            logits(&loaded.model, &tokens),
            gguf_at_load,
            "{fx} from GGUF"
        );
        assert!(rel(&gguf_at_load, &at_load) < 0.05, "{fx}: GGUF vs HF");
        let via_loader =
            LoadedModel::load_as(&dir, KvType::F32, Some(Target::Kasoku(recipe))).unwrap();
        assert_eq!(logits(&via_loader.model, &tokens), at_load, "{fx} load_as");

        // Damage: a truncated weights file; a spec that disagrees with the model's shapes.
        let weights = std::fs::read(hf_out.join("model.safetensors")).unwrap();
        std::fs::write(
            hf_out.join("model.safetensors"),
            &weights[..weights.len() - 100],
        )
        .unwrap();
        let e = LoadedModel::load_with(&hf_out, KvType::F32)
            .err()
            .expect("a truncated file loads")
            .to_string();
        assert!(e.contains("model.safetensors"), "{fx}: {e}");
        std::fs::write(hf_out.join("model.safetensors"), &weights).unwrap();
        let mut cfg: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(hf_out.join("config.json")).unwrap())
                .unwrap();
        cfg["intermediate_size"] = serde_json::json!(192);
        std::fs::write(hf_out.join("config.json"), cfg.to_string()).unwrap();
        let e = LoadedModel::load_with(&hf_out, KvType::F32)
            .err()
            .expect("a mismatched checkpoint loads")
            .to_string();
        assert!(e.contains("ffn") && e.contains("192"), "{fx}: {e}");
    }
    let _ = std::fs::remove_dir_all(&tmp);
}
