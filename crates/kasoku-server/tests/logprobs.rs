//! `logprobs` end to end on Qwen2.5-Coder-0.5B: chat (`logprobs` + `top_logprobs`) and
//! completions (`logprobs: N`), streamed and not, with speculative decoding on. Under greedy
//! decoding the chosen token is the most likely one, the entries spell the answer, the numbers
//! are log-probabilities, and a stream carries the same numbers as the whole answer.

mod common;

use common::Running;
use kasoku_server::ServerConfig;
use serde_json::{json, Value};

fn qwen_coder() -> Option<Running> {
    let path = kasoku_fetch::ensure_for_test("qwen2.5-coder-0.5b")?;
    let config = ServerConfig {
        sessions: Some(1),
        context: Some(2048),
        model_id: Some("coder".into()),
        ..ServerConfig::default()
    };
    Some(Running::start_path(&path, config))
}

fn post(server: &Running, path: &str, body: &Value) -> (u16, Value) {
    let r = server.request("POST", path, Some(&body.to_string()));
    (r.status, r.json())
}

/// The `data:` payloads of a streamed answer, without `[DONE]`.
fn chunks(server: &Running, path: &str, body: &Value) -> Vec<Value> {
    let r = server.request("POST", path, Some(&body.to_string()));
    assert_eq!(r.status, 200);
    r.events()
        .iter()
        .filter(|e| e.as_str() != "[DONE]")
        .map(|e| serde_json::from_str(e).unwrap())
        .collect()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6 * (1.0 + a.abs())
}

#[test]
fn chat_and_completion_logprobs_describe_the_answer() {
    let Some(server) = qwen_coder() else { return };
    let body = json!({
        "model": "coder",
        "messages": [{"role": "user", "content": "Write a haiku about the sea."}],
        "temperature": 0,
        // Penalties would move the choice away from the model's own most likely token.
        "repetition_penalty": 1.0,
        "max_tokens": 24,
        "logprobs": true,
        "top_logprobs": 3,
    });
    let (status, v) = post(&server, "/v1/chat/completions", &body);
    assert_eq!(status, 200, "{v}");
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(
        content.len() as u64,
        v["usage"]["completion_tokens"].as_u64().unwrap(),
        "one entry per generated token"
    );
    let mut spelled = Vec::new();
    for e in content {
        let lp = e["logprob"].as_f64().unwrap();
        assert!(lp <= 0.0, "{e}");
        let top = e["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3, "{e}");
        let tops: Vec<f64> = top.iter().map(|t| t["logprob"].as_f64().unwrap()).collect();
        assert!(tops.windows(2).all(|w| w[0] >= w[1]), "{e}");
        assert!(tops.iter().map(|l| l.exp()).sum::<f64>() <= 1.0 + 1e-5);
        // Greedy: the emitted token is the most likely one.
        assert_eq!(top[0]["token"], e["token"], "{e}");
        assert!(close(tops[0], lp), "{e}");
        spelled.extend(
            e["bytes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|b| b.as_u64().unwrap() as u8),
        );
    }
    let text = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert_eq!(String::from_utf8_lossy(&spelled).trim(), text.trim());

    // Streamed: the chunks' entries are the same tokens with the same numbers.
    let mut stream = body.clone();
    stream["stream"] = json!(true);
    let streamed: Vec<Value> = chunks(&server, "/v1/chat/completions", &stream)
        .iter()
        .filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array().cloned())
        .flatten()
        .collect();
    assert_eq!(streamed.len(), content.len());
    for (s, e) in streamed.iter().zip(content) {
        assert_eq!(s["token"], e["token"]);
        assert!(close(
            s["logprob"].as_f64().unwrap(),
            e["logprob"].as_f64().unwrap()
        ));
    }

    // Without logprobs the field is null.
    let mut plain = body.clone();
    plain.as_object_mut().unwrap().remove("logprobs");
    plain.as_object_mut().unwrap().remove("top_logprobs");
    let (_, v) = post(&server, "/v1/chat/completions", &plain);
    assert!(v["choices"][0]["logprobs"].is_null(), "{v}");

    // Completions: tokens spell the text, offsets count their bytes, top maps hold 2 entries.
    let body = json!({
        "model": "coder", "prompt": "def fibonacci(n):", "temperature": 0,
        "repetition_penalty": 1.0, "max_tokens": 16, "logprobs": 2,
    });
    let (status, v) = post(&server, "/v1/completions", &body);
    assert_eq!(status, 200, "{v}");
    let lp = &v["choices"][0]["logprobs"];
    let tokens: Vec<&str> = lp["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(tokens.len(), 16);
    assert_eq!(tokens.concat(), v["choices"][0]["text"].as_str().unwrap());
    let offsets: Vec<u64> = lp["text_offset"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o.as_u64().unwrap())
        .collect();
    assert_eq!(offsets[0], 0);
    for i in 1..tokens.len() {
        assert_eq!(offsets[i], offsets[i - 1] + tokens[i - 1].len() as u64);
    }
    for (i, top) in lp["top_logprobs"].as_array().unwrap().iter().enumerate() {
        let top = top.as_object().unwrap();
        assert!(!top.is_empty() && top.len() <= 2, "{top:?}");
        let chosen = lp["token_logprobs"][i].as_f64().unwrap();
        let best = top
            .values()
            .map(|l| l.as_f64().unwrap())
            .fold(f64::MIN, f64::max);
        assert!(
            close(best, chosen),
            "greedy picks the most likely: {top:?} {chosen}"
        );
    }
    // Streamed, the offsets continue across chunks.
    let mut stream = body.clone();
    stream["stream"] = json!(true);
    let streamed: Vec<u64> = chunks(&server, "/v1/completions", &stream)
        .iter()
        .filter_map(|c| {
            c["choices"][0]["logprobs"]["text_offset"]
                .as_array()
                .cloned()
        })
        .flatten()
        .map(|o| o.as_u64().unwrap())
        .collect();
    assert_eq!(streamed, offsets);

    // Out of range: a 400 naming the parameter.
    let mut bad = body.clone();
    bad["logprobs"] = json!(50);
    let (status, v) = post(&server, "/v1/completions", &bad);
    assert_eq!(status, 400);
    assert_eq!(v["error"]["param"], "logprobs");
}
