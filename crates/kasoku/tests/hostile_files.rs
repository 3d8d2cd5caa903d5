//! Hostile checkpoints, each built in its test from a committed fixture: absurd sizes,
//! overflowing token ids, NaN-producing RoPE and norm values, unsupported settings. Every one
//! must fail at once with an error naming the field (never hang, abort on an allocation or
//! panic), while the fixtures themselves keep loading.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kasoku::engine::LoadedModel;
use kasoku::format::{write_gguf, GgufFile, HfConfig, MetaValue};
use kasoku::model::ModelConfig;
use kasoku::quant::DType;
use kasoku::tokenizer::Tokenizer;
use serde_json::{json, Value};

/// A fresh directory, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("kasoku-hostile-{}-{tag}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

type Tensors = Vec<(String, DType, Vec<usize>, Vec<u8>)>;

/// Writes a copy of the GGUF `src` to `dst` with its metadata and tensors edited.
fn edited_gguf(
    src: &Path,
    dst: &Path,
    edit: impl FnOnce(&mut BTreeMap<String, MetaValue>, &mut Tensors),
) {
    let file = GgufFile::open(src).unwrap();
    let mut meta = file.metadata().clone();
    let mut tensors: Tensors = file
        .tensor_infos()
        .iter()
        .map(|t| {
            let bytes = file.tensor(&t.name).unwrap().data.as_slice().to_vec();
            (t.name.clone(), t.dtype, t.shape.clone(), bytes)
        })
        .collect();
    edit(&mut meta, &mut tensors);
    let meta: Vec<(String, MetaValue)> = meta.into_iter().collect();
    write_gguf(dst, &meta, &tensors).unwrap();
}

fn fixture_gguf(rel: &str) -> PathBuf {
    common::fixture(rel).join("model-f32.gguf")
}

/// The error of loading `path` (tokenizer, template and weights, as `kasoku run` does).
fn load_error(path: &Path) -> String {
    match LoadedModel::load(path) {
        Ok(_) => panic!("{} loaded", path.display()),
        Err(e) => e.to_string(),
    }
}

/// The llama fixture with one metadata value replaced: the load error.
fn llama_gguf_error(key: &str, value: MetaValue) -> String {
    let dir = Scratch::new("gguf");
    let path = dir.join("m.gguf");
    edited_gguf(&fixture_gguf("llama/tiny"), &path, |meta, _| {
        meta.insert(key.to_string(), value);
    });
    load_error(&path)
}

#[test]
fn absurd_gguf_sizes_name_the_field() {
    for key in [
        "llama.block_count",
        "llama.embedding_length",
        "llama.attention.head_count",
        "llama.attention.head_count_kv",
        "llama.attention.key_length",
        "llama.feed_forward_length",
        "llama.context_length",
        "llama.rope.dimension_count",
    ] {
        for value in [1u64 << 31, 1 << 40, 1 << 63, u64::MAX] {
            let e = llama_gguf_error(key, MetaValue::U64(value));
            assert!(
                e.contains(&format!("'{key}'")) && e.contains("limit"),
                "{key} = {value}: {e}"
            );
        }
    }
    // The declared width must match the embedding's rows.
    let e = llama_gguf_error("llama.embedding_length", MetaValue::U32(32));
    assert!(e.contains("token_embd.weight"), "{e}");
}

#[test]
fn out_of_range_gguf_token_ids_name_the_key() {
    for key in [
        "tokenizer.ggml.bos_token_id",
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.eot_token_id",
    ] {
        for value in [
            MetaValue::U64(1 << 40),
            MetaValue::U32(384),
            MetaValue::I32(-7),
        ] {
            let e = llama_gguf_error(key, value.clone());
            assert!(e.contains(key), "{key} = {value:?}: {e}");
        }
    }
    let e = llama_gguf_error("tokenizer.ggml.tokens", MetaValue::Array(Vec::new()));
    assert!(e.contains("tokenizer.ggml.tokens"), "{e}");
}

#[test]
fn degenerate_gguf_rope_and_norm_values_are_errors() {
    for (key, value, expect) in [
        ("llama.rope.freq_base", MetaValue::F32(0.0), "rope theta"),
        ("llama.rope.freq_base", MetaValue::F32(-1.0), "rope theta"),
        (
            "llama.rope.freq_base",
            MetaValue::F32(f32::NAN),
            "rope theta",
        ),
        (
            "llama.rope.freq_base",
            MetaValue::F64(f64::INFINITY),
            "rope theta",
        ),
        (
            "llama.attention.layer_norm_rms_epsilon",
            MetaValue::F32(0.0),
            "rms eps",
        ),
        (
            "llama.attention.layer_norm_rms_epsilon",
            MetaValue::F32(f32::NAN),
            "rms eps",
        ),
        // 1e-300 is 0 as the f32 the norm uses.
        (
            "llama.attention.layer_norm_rms_epsilon",
            MetaValue::F64(1e-300),
            "rms eps",
        ),
        (
            "llama.rope.scaling.type",
            MetaValue::U32(1),
            "llama.rope.scaling.type",
        ),
        (
            "llama.rope.scaling.type",
            MetaValue::String("yarn".into()),
            "llama.rope.scaling.type",
        ),
    ] {
        let e = llama_gguf_error(key, value.clone());
        assert!(e.contains(expect), "{key} = {value:?}: {e}");
    }
    for factor in [0.0, -2.0, f32::NAN, f32::INFINITY] {
        let dir = Scratch::new("linear");
        let path = dir.join("m.gguf");
        edited_gguf(&fixture_gguf("llama/tiny"), &path, |meta, _| {
            meta.insert(
                "llama.rope.scaling.type".into(),
                MetaValue::String("linear".into()),
            );
            meta.insert("llama.rope.scaling.factor".into(), MetaValue::F32(factor));
        });
        let e = load_error(&path);
        assert!(e.contains("linear rope scaling factor"), "{factor}: {e}");
    }
    // Llama 3 scaling as GGUF stores it: frequency divisors, of which a 0 gives NaN logits.
    for divisor in [0.0f32, -1.0, f32::NAN] {
        let dir = Scratch::new("freqs");
        let path = dir.join("m.gguf");
        edited_gguf(
            &fixture_gguf("llama/tiny_rope_llama3"),
            &path,
            |_, tensors| {
                let t = tensors
                    .iter_mut()
                    .find(|t| t.0 == "rope_freqs.weight")
                    .expect("the llama3 fixture has rope_freqs");
                t.3[4..8].copy_from_slice(&divisor.to_le_bytes());
            },
        );
        let e = load_error(&path);
        assert!(e.contains("rope_freqs.weight"), "{divisor}: {e}");
    }
}

#[test]
fn unsupported_gguf_settings_name_the_key() {
    for (key, value) in [
        ("llama.expert_count", MetaValue::U32(8)),
        ("llama.attention.value_length", MetaValue::U32(32)),
        ("llama.attention.sliding_window", MetaValue::U32(16)),
        (
            "llama.attention.head_count_kv",
            MetaValue::Array(vec![MetaValue::U32(2), MetaValue::U32(1)]),
        ),
    ] {
        let e = llama_gguf_error(key, value.clone());
        assert!(e.contains(key), "{key} = {value:?}: {e}");
    }
    // Settings that change nothing still load: a window as long as the context, a per-layer
    // kv head count that is the same everywhere, an expert count of 0.
    for (key, value) in [
        ("llama.attention.sliding_window", MetaValue::U32(256)),
        (
            "llama.attention.head_count_kv",
            MetaValue::Array(vec![MetaValue::U32(2), MetaValue::U32(2)]),
        ),
        ("llama.expert_count", MetaValue::U32(0)),
    ] {
        let dir = Scratch::new("benign");
        let path = dir.join("m.gguf");
        edited_gguf(&fixture_gguf("llama/tiny"), &path, |meta, _| {
            meta.insert(key.into(), value);
        });
        LoadedModel::load(&path).unwrap_or_else(|e| panic!("{key}: {e}"));
    }
}

/// The config of fixture `rel` with its config.json edited (keys set at the top level, or
/// removed when the value is null).
fn hf_config(rel: &str, edits: &Value) -> Result<ModelConfig, String> {
    let dir = Scratch::new("hf");
    let text = std::fs::read_to_string(common::fixture(rel).join("config.json")).unwrap();
    let mut config: Value = serde_json::from_str(&text).unwrap();
    for (k, v) in edits.as_object().unwrap() {
        let obj = config.as_object_mut().unwrap();
        if v.is_null() {
            obj.remove(k);
        } else {
            obj.insert(k.clone(), v.clone());
        }
    }
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let hf = HfConfig::load(&dir.0).map_err(|e| e.to_string())?;
    ModelConfig::from_hf(&hf).map_err(|e| e.to_string())
}

#[test]
fn absurd_config_json_sizes_name_the_field() {
    for (rel, key) in [
        ("llama/tiny", "num_hidden_layers"),
        ("llama/tiny", "hidden_size"),
        ("llama/tiny", "num_attention_heads"),
        ("llama/tiny", "num_key_value_heads"),
        ("llama/tiny", "head_dim"),
        ("llama/tiny", "intermediate_size"),
        ("llama/tiny", "vocab_size"),
        ("llama/tiny", "max_position_embeddings"),
        ("qwen3_5/tiny", "linear_num_key_heads"),
        ("qwen3_5/tiny", "linear_num_value_heads"),
        ("qwen3_5/tiny", "linear_key_head_dim"),
        ("qwen3_5/tiny", "linear_value_head_dim"),
        ("qwen3_5/tiny", "linear_conv_kernel_dim"),
    ] {
        for value in [1u64 << 31, 1 << 40, 1 << 63, u64::MAX] {
            let e = hf_config(rel, &json!({ key: value })).unwrap_err();
            assert!(
                e.contains(&format!("'{key}'")),
                "{rel} {key} = {value}: {e}"
            );
        }
    }
    // Through the whole load too: a Hugging Face directory with 2^40 layers.
    let dir = Scratch::new("hf-load");
    for file in [
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        std::fs::copy(common::fixture("llama/tiny").join(file), dir.join(file)).unwrap();
    }
    let text = std::fs::read_to_string(common::fixture("llama/tiny/config.json")).unwrap();
    let mut config: Value = serde_json::from_str(&text).unwrap();
    config["num_hidden_layers"] = json!(1u64 << 40);
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let e = load_error(&dir.0);
    assert!(e.contains("'num_hidden_layers'"), "{e}");
}

#[test]
fn degenerate_config_json_rope_values_are_errors() {
    let llama3 = |edit: Value| {
        let mut rope = json!({"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
            "original_max_position_embeddings": 64, "rope_theta": 500000.0, "rope_type": "llama3"});
        for (k, v) in edit.as_object().unwrap() {
            rope[k] = v.clone();
        }
        hf_config(
            "llama/tiny_rope_llama3",
            &json!({ "rope_parameters": rope }),
        )
    };
    assert!(llama3(json!({})).is_ok());
    for edit in [
        json!({"factor": 0.0}),
        json!({"factor": -8.0}),
        json!({"low_freq_factor": 0.0}),
        json!({"high_freq_factor": 1.0}),
        json!({"original_max_position_embeddings": 0}),
        json!({"rope_theta": 0.0}),
        json!({"rope_theta": -1.0}),
    ] {
        let e = llama3(edit.clone()).unwrap_err();
        assert!(e.contains("rope") || e.contains("theta"), "{edit}: {e}");
    }
    let linear = |factor: f64| {
        hf_config(
            "llama/tiny",
            &json!({"rope_parameters": {"rope_type": "linear", "factor": factor, "rope_theta": 10000.0}}),
        )
    };
    assert!(linear(2.0).is_ok());
    assert!(linear(0.0)
        .unwrap_err()
        .contains("linear rope scaling factor"));
    for partial in [0.0, -0.5, 1.5] {
        let e = hf_config(
            "qwen3_5/tiny",
            &json!({"rope_parameters": {"rope_theta": 1e7,
            "partial_rotary_factor": partial, "rope_type": "default"}}),
        )
        .unwrap_err();
        assert!(e.contains("partial_rotary_factor"), "{partial}: {e}");
    }
    let e = hf_config("llama/tiny", &json!({"rms_norm_eps": 0.0})).unwrap_err();
    assert!(e.contains("rms eps"), "{e}");
}

#[test]
fn unsupported_config_json_settings_name_the_field() {
    for (rel, edit, field) in [
        ("llama/tiny", json!({"hidden_act": "gelu"}), "hidden_act"),
        (
            "qwen3_5/tiny",
            json!({"hidden_act": "gelu_pytorch_tanh"}),
            "hidden_act",
        ),
        (
            "llama/tiny",
            json!({"model_type": "mistral", "sliding_window": 128}),
            "sliding_window",
        ),
        (
            "qwen2/tiny",
            json!({"use_sliding_window": true, "sliding_window": 128}),
            "sliding_window",
        ),
        (
            "qwen3/tiny",
            json!({"layer_types": ["full_attention", "sliding_attention", "full_attention"]}),
            "layer_types",
        ),
        ("llama/tiny", json!({"mlp_bias": true}), "mlp_bias"),
        (
            "llama/tiny",
            json!({"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}),
            "yarn",
        ),
    ] {
        let e = hf_config(rel, &edit).unwrap_err();
        assert!(e.contains(field), "{rel} {edit}: {e}");
    }
    // What transformers itself ignores, or windows that cover the whole context, still load.
    for (rel, edit) in [
        ("llama/tiny", json!({"sliding_window": 16})),
        (
            "llama/tiny",
            json!({"model_type": "mistral", "sliding_window": 256}),
        ),
        (
            "qwen2/tiny",
            json!({"use_sliding_window": false, "sliding_window": 16}),
        ),
        (
            "qwen2/tiny",
            json!({"use_sliding_window": true, "sliding_window": null}),
        ),
    ] {
        hf_config(rel, &edit).unwrap_or_else(|e| panic!("{rel} {edit}: {e}"));
    }
}

/// A GGUF with nothing but a tokenizer.
fn tokenizer_gguf(path: &Path, model: &str, tokens: Vec<String>, extra: Vec<(&str, MetaValue)>) {
    let mut meta = vec![
        ("tokenizer.ggml.model", MetaValue::String(model.into())),
        (
            "tokenizer.ggml.tokens",
            MetaValue::Array(tokens.into_iter().map(MetaValue::String).collect()),
        ),
    ];
    meta.extend(extra);
    let none: &[(&str, DType, [usize; 1], [u8; 0])] = &[];
    write_gguf(path, &meta, none).unwrap();
}

#[test]
fn sentencepiece_vocabulary_of_huge_tokens_is_refused_quickly() {
    let dir = Scratch::new("spm");
    let path = dir.join("t.gguf");
    // 40 tokens of 8000 bytes: recovering merges from them would hash ~10^12 bytes.
    let tokens: Vec<String> = (0..40).map(|i| "ab".repeat(4000 + i)).collect();
    tokenizer_gguf(&path, "llama", tokens, vec![]);
    let e = Tokenizer::from_gguf(&GgufFile::open(&path).unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains("too long"), "{e}");
}

#[test]
fn huge_ids_in_tokenizer_json_are_refused() {
    let dir = Scratch::new("tokjson");
    let text = std::fs::read_to_string(common::fixture("llama/tiny/tokenizer.json")).unwrap();
    let mut tok: Value = serde_json::from_str(&text).unwrap();
    tok["model"]["vocab"]["<huge>"] = json!(4_000_000_000u64);
    std::fs::write(dir.join("tokenizer.json"), tok.to_string()).unwrap();
    let e = Tokenizer::from_hf_dir(&dir.0).unwrap_err().to_string();
    assert!(e.contains("4000000000") && e.contains("limit"), "{e}");
}

/// The llama fixture's tokenizer.json with `edit` applied, alone in a scratch directory.
fn edited_tokenizer_json(tag: &str, edit: impl FnOnce(&mut Value)) -> Scratch {
    let dir = Scratch::new(tag);
    let text = std::fs::read_to_string(common::fixture("llama/tiny/tokenizer.json")).unwrap();
    let mut tok: Value = serde_json::from_str(&text).unwrap();
    edit(&mut tok);
    std::fs::write(dir.join("tokenizer.json"), tok.to_string()).unwrap();
    dir
}

/// A SentencePiece "precompiled" normalizer whose character map declares an empty trie (the 4
/// bytes of a zero length, base64): the `tokenizers` library loads it and then indexes the empty
/// trie, out of bounds, whenever it normalizes text.
fn empty_precompiled_normalizer(tok: &mut Value) {
    tok["normalizer"] = json!({"type": "Precompiled", "precompiled_charsmap": "AAAAAA=="});
}

#[test]
fn a_tokenizer_json_that_panics_the_library_on_encode_gives_errors() {
    let dir = edited_tokenizer_json("panic-encode", empty_precompiled_normalizer);
    // Saying whether prompts start with BOS spares the loader its probe encode (next test).
    std::fs::write(
        dir.join("tokenizer_config.json"),
        r#"{"add_bos_token": false}"#,
    )
    .unwrap();
    let t = Tokenizer::from_hf_dir(&dir.0).unwrap();
    for parse_special in [true, false] {
        let e = t.encode("hello", parse_special).unwrap_err().to_string();
        assert!(
            e.contains("panicked") && e.contains("index out of bounds"),
            "{e}"
        );
    }
    // Still usable for what does not go through the library's encoder.
    assert_eq!(t.decode(&[71, 68]), "he");
}

#[test]
fn a_tokenizer_json_that_panics_the_library_at_load_is_an_error() {
    // Without add_bos_token the loader encodes a probe text to see whether the post-processor
    // puts BOS first: that encode panics inside the library.
    let dir = edited_tokenizer_json("panic-load", empty_precompiled_normalizer);
    let e = Tokenizer::from_hf_dir(&dir.0).unwrap_err().to_string();
    assert!(
        e.contains("tokenizer.json") && e.contains("panicked"),
        "{e}"
    );
}

#[test]
fn eos_ids_beyond_u32_are_not_truncated() {
    let dir = Scratch::new("eos");
    std::fs::copy(
        common::fixture("llama/tiny/tokenizer.json"),
        dir.join("tokenizer.json"),
    )
    .unwrap();
    // 2^32 + 1 would become token 1 if cut to 32 bits.
    std::fs::write(
        dir.join("config.json"),
        r#"{"model_type": "llama", "eos_token_id": [4294967297, 3]}"#,
    )
    .unwrap();
    let t = Tokenizer::from_hf_dir(&dir.0).unwrap();
    assert!(t.eos_ids().contains(&3), "{:?}", t.eos_ids());
    assert!(!t.eos_ids().contains(&1), "{:?}", t.eos_ids());
}

#[test]
fn fixtures_still_load() {
    for rel in [
        "llama/tiny",
        "llama/tiny_rope_llama3",
        "qwen2/tiny",
        "qwen3/tiny",
        "qwen3_5/tiny",
    ] {
        LoadedModel::load(fixture_gguf(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"));
        LoadedModel::load(common::fixture(rel)).unwrap_or_else(|e| panic!("{rel} (HF): {e}"));
    }
}
