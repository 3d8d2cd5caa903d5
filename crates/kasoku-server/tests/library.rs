//! The server driven as a library, as another program would: `Server::new` over a loaded
//! model, `serve` on a listener of our own, a completion over a socket, and a clean stop
//! through the shutdown handle (the session threads exit and `serve` returns `Ok`); the
//! context a model gets by default, and what memory does to it.

mod common;

use std::path::{Path, PathBuf};

use common::Running;
use kasoku::engine::LoadedModel;
use kasoku::format::{write_gguf, GgufFile, MetaValue};
use kasoku_server::{RequestApi, Server, ServerConfig, ServerError};
use serde_json::json;

#[test]
fn a_program_can_serve_a_model_and_stop_it() {
    let config = ServerConfig {
        sessions: Some(1),
        prefix_cache: None,
        model_id: Some("tiny".into()),
        ..ServerConfig::default()
    };
    let server = Running::start("llama/tiny/model-f32.gguf", config);
    assert_eq!(server.id, "tiny");
    let body = json!({
        "model": "tiny",
        "prompt": "one two three",
        "temperature": 0,
        "max_tokens": 5,
        "ignore_eos": true,
    });
    let r = server.request("POST", "/v1/completions", Some(&body.to_string()));
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["usage"]["completion_tokens"], 5);
    assert!(v["choices"][0]["text"].is_string());
    let models = server.request("GET", "/v1/models", None).json();
    assert_eq!(models["data"][0]["id"], "tiny");
    server.stop().expect("serve returns Ok after shutdown");
}

#[test]
fn a_configuration_that_cannot_work_is_refused_at_new() {
    let model =
        kasoku::engine::LoadedModel::load(common::fixture("llama/tiny/model-f32.gguf")).unwrap();
    let config = ServerConfig {
        context: Some(1),
        ..ServerConfig::default()
    };
    let err = kasoku_server::Server::new(model, config)
        .err()
        .expect("refused");
    assert!(matches!(err, ServerError::Config(_)), "{err}");
    assert!(err.to_string().contains("context"), "{err}");
    let model =
        kasoku::engine::LoadedModel::load(common::fixture("llama/tiny/model-f32.gguf")).unwrap();
    let config = ServerConfig {
        max_body_bytes: 8 << 20,
        body_memory_bytes: 4 << 20,
        ..ServerConfig::default()
    };
    let err = kasoku_server::Server::new(model, config)
        .err()
        .expect("refused");
    assert!(err.to_string().contains("body memory"), "{err}");
}

/// Request bodies mutated at random from valid ones (bytes flipped, cut, repeated, spliced)
/// never panic the request path: each is a prompt or an error answer in OpenAI's shape. The
/// fuzz target drives the same entry point for millions of inputs; this is its quick replay.
#[test]
fn mutated_request_bodies_are_answered_never_panic() {
    let model =
        kasoku::engine::LoadedModel::load(common::fixture("llama/tiny/model-f32.gguf")).unwrap();
    let server = kasoku_server::Server::new(
        model,
        ServerConfig {
            model_id: Some("tiny".into()),
            prefix_cache: None,
            ..ServerConfig::default()
        },
    )
    .unwrap();
    let seeds: Vec<(RequestApi, Vec<u8>)> = [
        (RequestApi::Chat, json!({"model": "tiny", "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi<|eot_id|>"}], "temperature": 0.5, "stop": ["\n"], "stream": true, "stream_options": {"include_usage": true}, "response_format": {"type": "json_object"}})),
        (RequestApi::Chat, json!({"model": "tiny", "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}, {"role": "assistant", "content": null, "reasoning_content": "r"}], "chat_template_kwargs": {"enable_thinking": true}, "max_completion_tokens": 3})),
        (RequestApi::Completion, json!({"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 2, "seed": 7, "top_k": 3, "logprobs": 0})),
        (RequestApi::Completion, json!({"model": "tiny", "prompt": "one two", "repetition_penalty": 1.1, "n": 1})),
        (RequestApi::Messages, json!({"model": "tiny", "max_tokens": 8, "system": [{"type": "text", "text": "be brief"}], "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}}]}, {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "2"}]}], "stop_sequences": ["x"]})),
        (RequestApi::Responses, json!({"model": "tiny", "instructions": "be brief", "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}, {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{\"a\": 1}"}, {"type": "function_call_output", "call_id": "c1", "output": "2"}], "max_output_tokens": 8})),
    ]
    .into_iter()
    .map(|(api, v)| (api, v.to_string().into_bytes()))
    .collect();
    for (api, body) in &seeds {
        let prepared = server.prepare_request(*api, body);
        assert!(prepared.is_ok(), "{api:?} seed refused: {prepared:?}");
    }
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = |n: usize| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % n.max(1) as u64) as usize
    };
    let alphabet = b"{}[]\":,0123456789-.eE truefalsnul\\u00<|>";
    for _ in 0..3000 {
        let (api, seed) = &seeds[next(seeds.len())];
        let mut body = seed.clone();
        for _ in 0..1 + next(4) {
            let at = next(body.len());
            match next(4) {
                0 if at < body.len() => body[at] = alphabet[next(alphabet.len())],
                1 => body.truncate(at),
                2 => {
                    let end = (at + next(16)).min(body.len());
                    let piece = body[at..end].to_vec();
                    body.splice(
                        at..at,
                        piece.iter().cycle().take(piece.len() * next(8)).copied(),
                    );
                }
                _ => body.insert(at, next(256) as u8),
            }
        }
        match server.prepare_request(*api, &body) {
            Ok(tokens) => assert!(tokens > 0),
            Err((status, answer)) => {
                assert!((400..600).contains(&status), "{status}");
                let v: serde_json::Value = serde_json::from_str(&answer).unwrap();
                assert!(v["error"]["message"].is_string(), "{answer}");
            }
        }
    }
}

/// The tiny llama fixture declaring a context of `ctx` tokens (its weights do not care), in a
/// directory of its own that is removed on drop: a long-context model that prefills 16k
/// tokens in moments.
struct LongContextFixture(PathBuf);

impl LongContextFixture {
    fn new(ctx: u32) -> LongContextFixture {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("kasoku-long-context-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = GgufFile::open(common::fixture("llama/tiny/model-f32.gguf")).unwrap();
        let mut meta = file.metadata().clone();
        meta.insert("llama.context_length".into(), MetaValue::U32(ctx));
        let meta: Vec<(String, MetaValue)> = meta.into_iter().collect();
        let tensors: Vec<_> = file
            .tensor_infos()
            .iter()
            .map(|t| {
                let bytes = file.tensor(&t.name).unwrap().data.as_slice().to_vec();
                (t.name.clone(), t.dtype, t.shape.clone(), bytes)
            })
            .collect();
        write_gguf(dir.join("tiny-long.gguf"), &meta, &tensors).unwrap();
        LongContextFixture(dir)
    }

    fn path(&self) -> PathBuf {
        self.0.join("tiny-long.gguf")
    }
}

impl Drop for LongContextFixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `n` token ids of the tiny vocabulary (no control tokens), from `seed`.
fn token_ids(n: usize, seed: u64) -> Vec<u32> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            10 + ((x >> 33) % 360) as u32
        })
        .collect()
}

/// A model whose own context is 32768 tokens gets all of it by default: a 16384-token prompt
/// is accepted whole, sent again (one token longer) it is served from the prefix cache, and a
/// prompt the context cannot hold is refused, never cut.
#[test]
fn a_16k_prompt_fits_the_models_own_context_and_is_prefix_cached() {
    let fixture = LongContextFixture::new(32768);
    let config = ServerConfig {
        sessions: Some(1),
        model_id: Some("tiny".into()),
        ..ServerConfig::default()
    };
    let server = Running::start_path(&fixture.path(), config);
    let prompt = token_ids(16384, 7);
    let complete = |prompt: &[u32]| {
        let body = json!({
            "model": "tiny",
            "prompt": prompt,
            "temperature": 0,
            "max_tokens": 2,
            "ignore_eos": true,
        });
        server.request("POST", "/v1/completions", Some(&body.to_string()))
    };
    let first = complete(&prompt);
    assert_eq!(first.status, 200, "{}", first.body);
    let usage = &first.json()["usage"];
    assert_eq!(usage["prompt_tokens"], 16384, "{usage}");
    assert_eq!(usage["completion_tokens"], 2, "{usage}");
    let mut longer = prompt.clone();
    longer.push(42);
    let second = complete(&longer);
    assert_eq!(second.status, 200, "{}", second.body);
    let usage = &second.json()["usage"];
    assert_eq!(usage["prompt_tokens"], 16385, "{usage}");
    let cached = usage["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(cached >= 16384, "{usage}");
    // A prompt as long as the context: refused with both numbers.
    let whole = complete(&token_ids(32768, 8));
    assert_eq!(whole.status, 400, "{}", whole.body);
    let error = &whole.json()["error"];
    assert_eq!(error["code"], "context_length_exceeded");
    let message = error["message"].as_str().unwrap();
    assert!(message.contains("32768"), "{message}");
    server.stop().unwrap();
}

/// Memory decides the context: a default one is shortened to what the sessions' KV caches
/// can fill (with a note saying so), an explicit one that cannot fit is refused with the
/// numbers.
#[test]
fn memory_shortens_a_default_context_and_refuses_an_explicit_one() {
    let fixture = LongContextFixture::new(32768);
    let load = |path: &Path| LoadedModel::load(path).unwrap();
    // f16, 2 layers × (keys, values) × 2 heads × 16 values × 2 bytes = 256 bytes a token.
    assert_eq!(load(&fixture.path()).model.kv_bytes_per_token(), 256);
    let config = ServerConfig {
        sessions: Some(1),
        prefix_cache: None,
        memory_available: Some(4 << 20),
        ..ServerConfig::default()
    };
    let model = load(&fixture.path());
    let scratch = kasoku::model::footprint::scratch_bytes(&model.model.config);
    let server = Server::new(model, config.clone()).unwrap();
    // 90% of 4 MiB, less one pass's scratch (864 KiB), over 256 bytes a token, down to a
    // multiple of 1024.
    assert_eq!(scratch, 884_736);
    assert_eq!(
        server.context(),
        ((4 << 20) / 100 * 90 - 884_736) / 256 / 1024 * 1024
    );
    assert_eq!(server.context(), 11264);
    let note = server.context_note().expect("a note");
    assert!(
        note.contains("32768") && note.contains("11264") && note.contains("0.8 MiB of scratch"),
        "{note}"
    );
    let explicit = ServerConfig {
        context: Some(32768),
        ..config
    };
    let err = Server::new(load(&fixture.path()), explicit)
        .err()
        .expect("refused")
        .to_string();
    assert!(
        err.contains("32768 tokens") && err.contains("8.0 MiB") && err.contains("--ctx-size"),
        "{err}"
    );
}
