//! The server driven as a library, as another program would: `Server::new` over a loaded
//! model, `serve` on a listener of our own, a completion over a socket, and a clean stop
//! through the shutdown handle (the session threads exit and `serve` returns `Ok`).

mod common;

use common::Running;
use kasoku_server::{ServerConfig, ServerError};
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
    let seeds: Vec<(bool, Vec<u8>)> = [
        (true, json!({"model": "tiny", "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi<|eot_id|>"}], "temperature": 0.5, "stop": ["\n"], "stream": true, "stream_options": {"include_usage": true}, "response_format": {"type": "json_object"}})),
        (true, json!({"model": "tiny", "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}, {"role": "assistant", "content": null, "reasoning_content": "r"}], "chat_template_kwargs": {"enable_thinking": true}, "max_completion_tokens": 3})),
        (false, json!({"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 2, "seed": 7, "top_k": 3, "logprobs": 0})),
        (false, json!({"model": "tiny", "prompt": "one two", "repetition_penalty": 1.1, "n": 1})),
    ]
    .into_iter()
    .map(|(chat, v)| (chat, v.to_string().into_bytes()))
    .collect();
    for (chat, body) in &seeds {
        assert!(server.prepare_request(*chat, body).is_ok(), "seed refused");
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
        let (chat, seed) = &seeds[next(seeds.len())];
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
        match server.prepare_request(*chat, &body) {
            Ok(tokens) => assert!(tokens > 0),
            Err((status, answer)) => {
                assert!((400..600).contains(&status), "{status}");
                let v: serde_json::Value = serde_json::from_str(&answer).unwrap();
                assert!(v["error"]["message"].is_string(), "{answer}");
            }
        }
    }
}
