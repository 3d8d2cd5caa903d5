//! The fuzz targets, one per kind of input kasoku takes from outside: each is a function of
//! bytes that must return (an error is fine) and never panic or hang. Inputs that are files
//! are written to a scratch directory in memory (`/dev/shm` where there is one) and opened
//! through the same paths `kasoku run` uses. Seeds come from the repository's fixtures (named
//! here, not copied) and from `fuzz/corpus/<target>/`.

use std::path::{Path, PathBuf};

use kasoku::format::{GgufFile, HfCheckpoint, HfConfig};
use kasoku::model::dflash::Block;
use kasoku::model::{
    footprint, DFlash, DFlashConfig, Footprint, KvType, Logits, Model, ModelConfig,
};
use kasoku::tokenizer::{ChatMessage, ChatTemplate, Tokenizer};

/// A target's function of bytes.
pub type Run = Box<dyn FnMut(&[u8])>;

/// A target: its name, its fixture seeds (paths relative to the repository root), seeds taken
/// out of fixtures, and how to build its function (once per worker thread: the request-body
/// target loads a model).
pub struct Target {
    pub name: &'static str,
    pub fixture_seeds: &'static [&'static str],
    pub derived_seeds: fn() -> Vec<Vec<u8>>,
    /// Keywords of the format, for the mutator to insert.
    pub dictionary: &'static [&'static str],
    pub make: fn() -> Run,
}

/// Words every JSON target may use.
pub const JSON_WORDS: &[&str] = &[
    "null",
    "true",
    "false",
    "[]",
    "{}",
    "-1",
    "0",
    "1e309",
    "-0.0",
    "4294967296",
    "18446744073709551616",
    "\"\\ud800\"",
    "\"\"",
    ",",
    ":",
    "[[[[[[[[",
    "]]]]]]]]",
];

fn no_seeds() -> Vec<Vec<u8>> {
    Vec::new()
}

/// The real chat templates of tests/fixtures/tokenizer/chat_templates.json, each with a
/// message after the NUL byte.
fn fixture_templates() -> Vec<Vec<u8>> {
    let path = fixture("tokenizer/chat_templates.json");
    let text = std::fs::read_to_string(&path).expect("chat_templates.json");
    let all: serde_json::Value = serde_json::from_str(&text).expect("chat_templates.json");
    all["templates"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["template"].as_str())
        .map(|t| format!("{t}\0What is 2 + 2?").into_bytes())
        .collect()
}

/// Every target.
pub const TARGETS: &[Target] = &[
    Target {
        name: "gguf",
        fixture_seeds: &[
            "tests/fixtures/llama/tiny/model-q4_0.gguf",
            "tests/fixtures/llama/tiny/model-q8_0.gguf",
            "tests/fixtures/tokenizer/spm-tiny.gguf",
        ],
        derived_seeds: no_seeds,
        dictionary: &[
            "general.architecture",
            "llama",
            "qwen2",
            "qwen3",
            "qwen35",
            "llama.block_count",
            "llama.embedding_length",
            "llama.attention.head_count",
            "llama.context_length",
            "llama.rope.freq_base",
            "llama.rope.scaling.type",
            "llama.attention.sliding_window",
            "tokenizer.ggml.model",
            "tokenizer.ggml.tokens",
            "tokenizer.ggml.merges",
            "tokenizer.ggml.token_type",
            "tokenizer.ggml.bos_token_id",
            "tokenizer.chat_template",
            "token_embd.weight",
            "output.weight",
            "blk.0.attn_q.weight",
            "gpt2",
        ],
        make: || Box::new(gguf),
    },
    Target {
        name: "safetensors",
        fixture_seeds: &["tests/fixtures/llama/tiny/model.safetensors"],
        derived_seeds: no_seeds,
        dictionary: &[
            "\"dtype\"",
            "\"shape\"",
            "\"data_offsets\"",
            "\"F32\"",
            "\"F16\"",
            "\"BF16\"",
            "\"I64\"",
            "\"__metadata__\"",
            "model.layers.0.self_attn.q_proj.weight",
            "model.embed_tokens.weight",
            "lm_head.weight",
            "[0, 0]",
            "[]",
        ],
        make: || Box::new(safetensors),
    },
    Target {
        name: "config_json",
        fixture_seeds: &[
            "tests/fixtures/llama/tiny/config.json",
            "tests/fixtures/qwen2/tiny/config.json",
            "tests/fixtures/qwen3/tiny/config.json",
            "tests/fixtures/qwen3_5/tiny/config.json",
        ],
        derived_seeds: no_seeds,
        dictionary: &[
            "\"num_hidden_layers\"",
            "\"hidden_size\"",
            "\"intermediate_size\"",
            "\"num_attention_heads\"",
            "\"num_key_value_heads\"",
            "\"head_dim\"",
            "\"vocab_size\"",
            "\"max_position_embeddings\"",
            "\"rope_theta\"",
            "\"rope_scaling\"",
            "\"rope_parameters\"",
            "\"rope_type\"",
            "\"llama3\"",
            "\"linear\"",
            "\"yarn\"",
            "\"factor\"",
            "\"low_freq_factor\"",
            "\"high_freq_factor\"",
            "\"original_max_position_embeddings\"",
            "\"partial_rotary_factor\"",
            "\"layer_types\"",
            "\"sliding_window\"",
            "\"use_sliding_window\"",
            "\"hidden_act\"",
            "\"tie_word_embeddings\"",
            "\"rms_norm_eps\"",
            "\"text_config\"",
            "\"model_type\"",
            "\"qwen3_5\"",
            "\"full_attention_interval\"",
            "\"linear_num_key_heads\"",
            "\"eos_token_id\"",
        ],
        make: || Box::new(config_json),
    },
    Target {
        name: "tokenizer_json",
        fixture_seeds: &[
            "tests/fixtures/llama/tiny/tokenizer.json",
            "tests/fixtures/qwen2/tiny/tokenizer.json",
            "tests/fixtures/qwen3_5/tiny/tokenizer.json",
        ],
        derived_seeds: no_seeds,
        dictionary: &[
            "\"type\"",
            "\"BPE\"",
            "\"Unigram\"",
            "\"WordPiece\"",
            "\"WordLevel\"",
            "\"Precompiled\"",
            "\"precompiled_charsmap\"",
            "\"Split\"",
            "\"Regex\"",
            "\"ByteLevel\"",
            "\"Metaspace\"",
            "\"TemplateProcessing\"",
            "\"added_tokens\"",
            "\"special\"",
            "\"normalized\"",
            "\"merges\"",
            "\"vocab\"",
            "\"unk_token\"",
            "\"byte_fallback\"",
            "\"dropout\"",
            "\"truncation\"",
            "\"padding\"",
            "\"max_length\"",
            "\"stride\"",
            "\"pad_to_multiple_of\"",
            "\"Strip\"",
            "\"Replace\"",
            "\"Sequence\"",
            "\"NFKC\"",
            "\"Lowercase\"",
            "\"Fuse\"",
            "\"ByteFallback\"",
            "\"continuing_subword_prefix\"",
            "\"end_of_word_suffix\"",
        ],
        make: || Box::new(tokenizer_json),
    },
    Target {
        name: "chat_template",
        fixture_seeds: &[],
        derived_seeds: fixture_templates,
        dictionary: &[
            "{%",
            "%}",
            "{{",
            "}}",
            "{#",
            "#}",
            "{%- ",
            " -%}",
            "for ",
            " in ",
            "endfor",
            "if ",
            "elif ",
            "else",
            "endif",
            "set ",
            "endset",
            "macro ",
            "endmacro",
            "call ",
            "endcall",
            "caller()",
            "range(",
            "10**9",
            "*",
            "~",
            "**",
            "|tojson",
            "|join",
            "|list",
            "|length",
            "|map",
            "|select",
            "|sort",
            "|reverse",
            "|indent(",
            "|format(",
            "loop.",
            "loop(",
            "recursive",
            "messages",
            "message",
            "namespace(",
            "ns.",
            "raise_exception(",
            "strftime_now(",
            "[::-1]",
            ".split(",
            ".replace(",
            ".strip()",
            ".startswith(",
            ".items()",
            "'",
            "\"",
            "(",
            ")",
            "[",
            "]",
            "\0",
        ],
        make: || Box::new(chat_template),
    },
    Target {
        name: "request_body",
        fixture_seeds: &[],
        derived_seeds: other_api_bodies,
        dictionary: &[
            "\"messages\"",
            "\"tools\"",
            "\"logit_bias\"",
            "\"n\"",
            "\"stop\"",
            "\"max_tokens\"",
            "\"response_format\"",
            "\"json_schema\"",
            "\"json_object\"",
            "\"tool_choice\"",
            "\"logprobs\"",
            "\"top_logprobs\"",
            "\"suffix\"",
            "\"stream\"",
            "\"content\"",
            "\"role\"",
            "\"tool\"",
            "\"tool_calls\"",
            "\"function\"",
            "\"arguments\"",
            "\"temperature\"",
            "\"top_p\"",
            "\"repetition_penalty\"",
            "\"seed\"",
            "\"prompt\"",
            "<|im_start|>",
            "<|eot_id|>",
            "\"chat_template_kwargs\"",
            "\"$ref\"",
            "\"pattern\"",
            "\"enum\"",
            "\"system\"",
            "\"stop_sequences\"",
            "\"tool_use\"",
            "\"tool_result\"",
            "\"tool_use_id\"",
            "\"input_schema\"",
            "\"input\"",
            "\"instructions\"",
            "\"max_output_tokens\"",
            "\"input_text\"",
            "\"output_text\"",
            "\"function_call\"",
            "\"function_call_output\"",
            "\"call_id\"",
            "\"previous_response_id\"",
            "\"text\"",
            "\"type\"",
        ],
        make: request_body,
    },
];

/// The target of that name.
pub fn target(name: &str) -> Option<&'static Target> {
    TARGETS.iter().find(|t| t.name == name)
}

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A scratch directory of this thread's, in memory where possible (created on first use).
fn scratch(tag: &str) -> PathBuf {
    let base = if Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let thread = format!("{:?}", std::thread::current().id());
    let thread: String = thread.chars().filter(char::is_ascii_digit).collect();
    let dir = base.join(format!("kasoku-fuzz-{}-{thread}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch directory");
    dir
}

fn fixture(rel: &str) -> PathBuf {
    repo_root().join("tests/fixtures").join(rel)
}

/// Runs a loaded model on two tokens (weights from a mutated file reach the kernels).
fn run_two_tokens(model: &Model) {
    let mut state = model.new_state(8);
    let vocab = model.config.vocab as u32;
    let tokens = [1 % vocab.max(1), 2 % vocab.max(1)];
    let _ = model.forward(&mut state, &tokens, Logits::Last);
}

/// A GGUF file: metadata, model configuration, memory estimate, weights (and two tokens
/// through them), tokenizer and chat template.
fn gguf(data: &[u8]) {
    let path = scratch("gguf").join("m.gguf");
    std::fs::write(&path, data).expect("scratch write");
    let Ok(file) = GgufFile::open(&path) else {
        return;
    };
    if let Ok(config) = ModelConfig::from_gguf(&file) {
        let _ = Footprint::of(&config, &file, None, KvType::F16);
        let _ = footprint::scratch_bytes(&config);
        if let Ok(model) = Model::from_source(config, &file) {
            run_two_tokens(&model);
        }
    }
    if let Ok(tokenizer) = Tokenizer::from_gguf(&file) {
        exercise_tokenizer(&tokenizer);
    }
    if let Ok(template) = ChatTemplate::from_gguf(&file) {
        let _ = template.render(&conversation("hi"), true, &Default::default());
    }
}

/// A safetensors file next to the tiny llama's config.json: header, tensors, model.
fn safetensors(data: &[u8]) {
    let dir = scratch("safetensors");
    let config = dir.join("config.json");
    if !config.exists() {
        std::fs::copy(fixture("llama/tiny/config.json"), &config).expect("scratch copy");
    }
    std::fs::write(dir.join("model.safetensors"), data).expect("scratch write");
    let Ok(ckpt) = HfCheckpoint::open(&dir) else {
        return;
    };
    if let Ok(config) = ModelConfig::from_hf(ckpt.config()) {
        let _ = Footprint::of(&config, &ckpt, None, KvType::Q8_0);
        if let Ok(model) = Model::from_source(config, &ckpt) {
            run_two_tokens(&model);
        }
    }
}

/// A config.json next to the tiny llama's safetensors: the configuration, then the model
/// built from the fixed tensors under it.
fn config_json(data: &[u8]) {
    let dir = scratch("config");
    let weights = dir.join("model.safetensors");
    if !weights.exists() {
        std::fs::copy(fixture("llama/tiny/model.safetensors"), &weights).expect("scratch copy");
    }
    let path = dir.join("config.json");
    std::fs::write(&path, data).expect("scratch write");
    if let Ok(hf) = HfConfig::from_file(&path) {
        if let Ok(config) = ModelConfig::from_hf(&hf) {
            let _ = footprint::scratch_bytes(&config);
        }
        // Read as a DFlash drafter's config: loaded over the tiny drafter's tensors for the
        // tiny Qwen2 target when it fits them, then one block drafted.
        if let Ok(config) = DFlashConfig::from_hf(&hf) {
            dflash_block(config);
        }
    }
    if let Ok(ckpt) = HfCheckpoint::open(&dir) {
        if let Ok(config) = ModelConfig::from_hf(ckpt.config()) {
            if let Ok(model) = Model::from_source(config, &ckpt) {
                run_two_tokens(&model);
            }
        }
    }
}

/// Loads the tiny DFlash drafter's tensors under `config` and drafts one block.
fn dflash_block(config: DFlashConfig) {
    let Ok(target) = Model::load(fixture("qwen2/tiny/model-f32.gguf")) else {
        return;
    };
    let Ok(ckpt) = HfCheckpoint::open(fixture("qwen2/tiny_dflash")) else {
        return;
    };
    let Ok(net) = DFlash::from_source(config, &ckpt, &target, None) else {
        return;
    };
    let mut ctx = net.new_context();
    let feats = vec![0.25f32; 3 * net.feature_width()];
    if net.append_context(&mut ctx, &feats, &[0, 1, 2]).is_ok() {
        let block = Block {
            root: 7,
            pos: 3,
            rows: net.config.block_size - 1,
            head: target.head(),
        };
        let _ = net.draft(&target, &mut ctx, block, &mut Vec::new());
    }
}

/// Encodes, decodes and streams a few texts.
fn exercise_tokenizer(t: &Tokenizer) {
    for text in [
        "Hello, world! 123",
        "<|im_start|>user\nhé\u{1F600}</s>",
        " \n\t ",
    ] {
        for special in [true, false] {
            if let Ok(ids) = t.encode_with_bos(text, special) {
                let _ = t.decode(&ids);
                let _ = t.decode_skip_special(&ids);
                let mut stream = t.stream_decoder();
                for &id in &ids {
                    let _ = stream.push(id);
                }
                let _ = stream.flush();
            }
        }
    }
    let n = t.token_count() as u32;
    let _ = t.decode(&[0, n.saturating_sub(1), n, u32::MAX]);
    let _ = t.piece_to_id("hello");
}

/// A tokenizer.json, with the llama fixture's tokenizer_config.json beside it.
fn tokenizer_json(data: &[u8]) {
    let dir = scratch("tokenizer");
    let config = dir.join("tokenizer_config.json");
    if !config.exists() {
        std::fs::copy(fixture("llama/tiny/tokenizer_config.json"), &config).expect("scratch copy");
    }
    std::fs::write(dir.join("tokenizer.json"), data).expect("scratch write");
    if let Ok(t) = Tokenizer::from_hf_dir(&dir) {
        exercise_tokenizer(&t);
    }
}

fn conversation(user: &str) -> Vec<ChatMessage> {
    vec![
        ChatMessage::new("system", "Be brief."),
        ChatMessage::new("user", user),
        ChatMessage::new("assistant", "Sure."),
        ChatMessage::new("user", "Again?"),
    ]
}

/// A chat template source, then (after a NUL byte, when there is one) a user message.
fn chat_template(data: &[u8]) {
    let (source, message) = match data.iter().position(|&b| b == 0) {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, &b"hello"[..]),
    };
    let source = String::from_utf8_lossy(source);
    let message = String::from_utf8_lossy(message);
    let Ok(template) = ChatTemplate::new(&source, "<s>", "</s>", "fuzz") else {
        return;
    };
    let mut extra = serde_json::Map::new();
    extra.insert("enable_thinking".into(), false.into());
    extra.insert(
        "tools".into(),
        serde_json::json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]),
    );
    let _ = template.render(&conversation(&message), true, &extra);
}

/// Bodies for Anthropic's `/v1/messages` (selector byte 2) and OpenAI's `/v1/responses` (3),
/// beside the corpus's chat and completion bodies.
fn other_api_bodies() -> Vec<Vec<u8>> {
    let messages = serde_json::json!({"model": "tiny", "max_tokens": 8, "system": [{"type": "text", "text": "be brief"}], "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}}]}, {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "2"}]}], "tools": [{"name": "f", "input_schema": {"type": "object"}}], "stop_sequences": ["x"]});
    let responses = serde_json::json!({"model": "tiny", "instructions": "be brief", "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}, {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}, {"type": "function_call_output", "call_id": "c1", "output": "2"}], "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}], "max_output_tokens": 8});
    [(2u8, messages), (3, responses)]
        .into_iter()
        .map(|(selector, body)| {
            let mut bytes = vec![selector];
            bytes.extend(body.to_string().into_bytes());
            bytes
        })
        .collect()
}

/// A request body for the server's request path (tiny llama model): the first byte chooses
/// the route, modulo 4: /v1/chat/completions, /v1/completions, Anthropic's /v1/messages,
/// OpenAI's /v1/responses.
fn request_body() -> Run {
    let model = kasoku::engine::LoadedModel::load(fixture("llama/tiny/model-f32.gguf"))
        .expect("the tiny llama fixture loads");
    let server = kasoku_server::Server::new(
        model,
        kasoku_server::ServerConfig {
            model_id: Some("tiny".into()),
            prefix_cache: None,
            ..Default::default()
        },
    )
    .expect("a server on the tiny fixture");
    Box::new(move |data: &[u8]| {
        let Some((&first, body)) = data.split_first() else {
            return;
        };
        let api = match first % 4 {
            0 => kasoku_server::RequestApi::Chat,
            1 => kasoku_server::RequestApi::Completion,
            2 => kasoku_server::RequestApi::Messages,
            _ => kasoku_server::RequestApi::Responses,
        };
        let answer = server.prepare_request(api, body);
        if let Err((status, text)) = answer {
            // An error is an answer in OpenAI's shape: a 4xx/5xx with a JSON message.
            assert!((400..600).contains(&status), "status {status}");
            let v: serde_json::Value = serde_json::from_str(&text).expect("error body is JSON");
            assert!(v["error"]["message"].is_string(), "{text}");
        }
    })
}
