//! The server's device path without a GPU: the same weights served by `Server::new` (CPU
//! sessions) and by `Server::on_device` over `HostDevice` (a CPU model behind the device
//! interface, handing back only ids and, when asked, logits) answer every kind of request
//! alike: greedy and sampled, streamed or not, stop strings, max_tokens, logprobs, constrained
//! JSON, prompt lookup and a drafter on the device (a draft model; here the CPU's draft-model
//! drafter stands in); the device is named in /metrics and /v1/models; settings the device
//! path cannot honour are refused at startup with the reason.

mod common;

use std::sync::Arc;

use common::{fixture, Running};
use kasoku::engine::{HostDevice, LoadedModel, SpecKind};
use kasoku::spec::PolicyConfig;
use kasoku_server::{DeviceDrafter, DeviceServed, Server, ServerConfig, ServerError, Speculation};
use serde_json::{json, Value};

const MODEL: &str = "llama/tiny/model-f32.gguf";

fn config(kind: SpecKind) -> ServerConfig {
    ServerConfig {
        sessions: Some(1),
        model_id: Some("tiny".into()),
        // A fixed budget: the tests count passes, which must not hang on this machine's
        // timings.
        speculation: Speculation {
            kind,
            policy: PolicyConfig {
                adaptive: false,
                ..PolicyConfig::default()
            },
            ..Speculation::default()
        },
        ..ServerConfig::default()
    }
}

/// The device server over `HostDevice` and a handle on the device (its logits counter).
fn device_server(config: ServerConfig) -> Result<(Server, Arc<HostDevice>), ServerError> {
    device_server_drafting(config, None)
}

/// [`device_server`] with a drafter on the device.
fn device_server_drafting(
    config: ServerConfig,
    drafter: Option<DeviceDrafter>,
) -> Result<(Server, Arc<HostDevice>), ServerError> {
    let loaded = LoadedModel::load(fixture(MODEL)).unwrap();
    let device = Arc::new(HostDevice::new(loaded.model.clone(), "host:0"));
    let served = DeviceServed {
        path: loaded.path.clone(),
        tokenizer: loaded.tokenizer.clone(),
        template: loaded.template.clone(),
        defaults: loaded.defaults.clone(),
        model: device.clone(),
        drafter,
    };
    Ok((Server::on_device(served, config, 4096)?, device))
}

fn post(server: &Running, path: &str, body: &Value) -> Value {
    let r = server.request("POST", path, Some(&body.to_string()));
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()
}

/// A streamed chat answer's text and finish reason.
fn streamed(server: &Running, body: &Value) -> (String, String) {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let r = server.request("POST", "/v1/chat/completions", Some(&body.to_string()));
    assert_eq!(r.status, 200, "{}", r.body);
    let (mut text, mut finish) = (String::new(), String::new());
    for e in r.events().iter().filter(|e| *e != "[DONE]") {
        let v: Value = serde_json::from_str(e).unwrap();
        let choice = &v["choices"][0];
        text += choice["delta"]["content"].as_str().unwrap_or("");
        if let Some(f) = choice["finish_reason"].as_str() {
            finish = f.to_string();
        }
    }
    (text, finish)
}

fn chat(question: &str, extra: Value) -> Value {
    let mut body = json!({
        "model": "tiny",
        "messages": [{"role": "user", "content": question}],
        "max_tokens": 24,
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

fn answer(v: &Value) -> (String, String) {
    let c = &v["choices"][0];
    let text = c["message"]["content"]
        .as_str()
        .or(c["text"].as_str())
        .unwrap_or("")
        .to_string();
    (text, c["finish_reason"].as_str().unwrap().to_string())
}

#[test]
fn the_device_path_answers_as_the_cpu_does() {
    let cpu = Running::start(MODEL, config(SpecKind::None));
    let (server, device) = device_server(config(SpecKind::None)).unwrap();
    assert_eq!(server.device(), "host:0");
    let dev = Running::serve(server);
    let greedy = chat(
        "one two three",
        json!({"temperature": 0, "ignore_eos": true}),
    );
    let a = post(&cpu, "/v1/chat/completions", &greedy);
    let b = post(&dev, "/v1/chat/completions", &greedy);
    assert_eq!(answer(&a), answer(&b));
    assert!(!answer(&a).0.is_empty());
    assert_eq!(a["usage"]["completion_tokens"], 24);
    assert_eq!(device.logits_rows(), 0, "greedy: only ids crossed");
    assert_eq!(streamed(&cpu, &greedy), streamed(&dev, &greedy));
    // Sampled with a seed, penalties, a stop string, max_tokens: top-k draws from the device's
    // selection, no row of logits.
    let hot = chat(
        "tell me a story",
        json!({"temperature": 0.9, "top_p": 0.9, "top_k": 30, "seed": 5,
               "frequency_penalty": 0.3, "max_tokens": 30}),
    );
    let a = post(&cpu, "/v1/chat/completions", &hot);
    let b = post(&dev, "/v1/chat/completions", &hot);
    assert_eq!(answer(&a), answer(&b));
    assert!(device.top_selections() > 0);
    assert_eq!(device.logits_rows(), 0, "top-k: selections, not rows");
    assert_eq!(streamed(&cpu, &hot), streamed(&dev, &hot));
    let text = answer(&a).0;
    let stop: String = text.chars().skip(3).take(2).collect();
    assert_eq!(stop.chars().count(), 2, "{text:?}");
    {
        let stop = stop.as_str();
        let mut with_stop = hot.clone();
        with_stop["stop"] = json!([stop]);
        let a = post(&cpu, "/v1/chat/completions", &with_stop);
        let b = post(&dev, "/v1/chat/completions", &with_stop);
        assert_eq!(answer(&a), answer(&b));
        assert_eq!(answer(&b).1, "stop");
        assert!(!answer(&b).0.contains(stop));
    }
    // Log-probabilities, and a raw completion.
    let lp = chat(
        "hello",
        json!({"logprobs": true, "top_logprobs": 3, "seed": 1, "temperature": 0.7}),
    );
    let a = post(&cpu, "/v1/chat/completions", &lp);
    let b = post(&dev, "/v1/chat/completions", &lp);
    assert_eq!(a["choices"][0]["logprobs"], b["choices"][0]["logprobs"]);
    assert!(
        b["choices"][0]["logprobs"]["content"]
            .as_array()
            .unwrap()
            .len()
            > 1
    );
    let raw = json!({"model": "tiny", "prompt": "a b c d", "max_tokens": 10, "temperature": 0});
    assert_eq!(
        answer(&post(&cpu, "/v1/completions", &raw)),
        answer(&post(&dev, "/v1/completions", &raw))
    );
    // Constrained output: the grammar's mask on the host logits.
    let js = chat(
        "give me json",
        json!({"response_format": {"type": "json_object"}, "max_tokens": 40, "temperature": 0}),
    );
    let a = post(&cpu, "/v1/chat/completions", &js);
    let b = post(&dev, "/v1/chat/completions", &js);
    assert_eq!(answer(&a), answer(&b));
    // Anthropic's messages and the Responses API go through the same sessions.
    // (Anthropic's API has no seed: greedy, to compare.)
    let msg = json!({"model": "tiny", "max_tokens": 16, "temperature": 0,
                     "messages": [{"role": "user", "content": "hi"}]});
    let (a, b) = (
        post(&cpu, "/v1/messages", &msg),
        post(&dev, "/v1/messages", &msg),
    );
    assert_eq!(a["content"], b["content"]);
    assert!(
        b["content"][0]["text"]
            .as_str()
            .is_some_and(|t| !t.is_empty()),
        "{b}"
    );
    let resp =
        json!({"model": "tiny", "input": "hello", "max_output_tokens": 16, "temperature": 0});
    let (a, b) = (
        post(&cpu, "/v1/responses", &resp),
        post(&dev, "/v1/responses", &resp),
    );
    assert_eq!(a["output"][0]["content"], b["output"][0]["content"]);
    // Where it runs, for the operator.
    let metrics = dev.request("GET", "/metrics", None).body;
    assert!(
        metrics.contains("kasoku_device_info{device=\"host:0\"} 1"),
        "{metrics}"
    );
    let cpu_metrics = cpu.request("GET", "/metrics", None).body;
    assert!(cpu_metrics.contains("kasoku_device_info{device=\"cpu\"} 1"));
    let models = dev.request("GET", "/v1/models", None).json();
    assert_eq!(models["data"][0]["meta"]["device"], "host:0");
}

#[test]
fn prompt_lookup_on_the_device_answers_like_plain_decoding_in_fewer_passes_greedy_or_sampled() {
    let (plain, _) = device_server(config(SpecKind::None)).unwrap();
    let (ngram, device) = device_server(config(SpecKind::Ngram)).unwrap();
    let (plain, ngram) = (Running::serve(plain), Running::serve(ngram));
    let text = "x = [1, 2, 3]; y = [1, 2, 3]; z = [1, 2, 3]; w = [1, 2, 3]; v = [1, 2,";
    let body = json!({"model": "tiny", "prompt": text, "max_tokens": 40, "temperature": 0, "ignore_eos": true});
    let a = post(&plain, "/v1/completions", &body);
    let b = post(&ngram, "/v1/completions", &body);
    assert_eq!(answer(&a), answer(&b));
    assert_eq!(device.logits_rows(), 0);
    let passes = |v: &Value| v["usage"]["spec_verify_ct"].as_u64().unwrap();
    assert!(
        passes(&b) < passes(&a),
        "{} passes with prompt lookup, {} without",
        passes(&b),
        passes(&a)
    );
    assert!(b["usage"]["spec_accepted_tokens"].as_u64() > Some(0));
    // Sampled with a seed: drafted too (a row or a top-k selection per visited node), the
    // same text.
    let mut hot = body.clone();
    hot["temperature"] = json!(0.7);
    hot["seed"] = json!(9);
    let a = post(&plain, "/v1/completions", &hot);
    let b = post(&ngram, "/v1/completions", &hot);
    assert_eq!(answer(&a), answer(&b));
    assert!(device.logits_rows() + device.top_selections() > 0);
    assert!(b["usage"]["spec_verify_ct"].as_u64().is_some());
    // A second request sharing the prefix reuses the device state's.
    let again = post(&ngram, "/v1/completions", &hot);
    assert_eq!(answer(&again), answer(&b));
    assert!(
        again["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64() > Some(0),
        "{again}"
    );
}

/// What a GPU's draft model would be: the Q4_0 file drafting for the f32 one, a drafter per
/// session (the CPU's draft-model drafter standing in).
fn q4_drafter(made: Arc<std::sync::atomic::AtomicUsize>) -> DeviceDrafter {
    use kasoku::spec::{draft_model::DraftModelConfig, DraftModelDrafter, Drafter};
    let draft = LoadedModel::load(fixture("llama/tiny/model-q4_0.gguf"))
        .unwrap()
        .model;
    Arc::new(move |ctx| {
        made.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let vocab = draft.config.vocab;
        let d = DraftModelDrafter::new(draft.clone(), ctx, vocab, DraftModelConfig::default())?;
        Ok(Box::new(d) as Box<dyn Drafter>)
    })
}

#[test]
fn a_drafter_on_the_device_answers_like_plain_decoding() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let made = Arc::new(AtomicUsize::new(0));
    let (plain, _) = device_server(config(SpecKind::None)).unwrap();
    let (drafted, _) =
        device_server_drafting(config(SpecKind::Draft), Some(q4_drafter(made.clone()))).unwrap();
    // One drafter proved at startup.
    assert_eq!(made.load(Ordering::Relaxed), 1);
    let (plain, drafted) = (Running::serve(plain), Running::serve(drafted));
    let body = json!({"model": "tiny", "prompt": "one two three one two", "max_tokens": 40, "temperature": 0, "ignore_eos": true});
    let a = post(&plain, "/v1/completions", &body);
    let b = post(&drafted, "/v1/completions", &body);
    assert_eq!(answer(&a), answer(&b));
    assert!(b["usage"]["spec_verify_ct"].as_u64() > Some(0), "{b}");
    assert!(
        made.load(Ordering::Relaxed) >= 2,
        "the session made its own"
    );
    let mut hot = body.clone();
    hot["temperature"] = json!(0.7);
    hot["seed"] = json!(9);
    assert_eq!(
        answer(&post(&plain, "/v1/completions", &hot)),
        answer(&post(&drafted, "/v1/completions", &hot))
    );
    // A drafter on the device with a CPU draft as well is a contradiction.
    let both = ServerConfig {
        speculation: Speculation {
            kind: SpecKind::Draft,
            draft: Some(LoadedModel::load(fixture(MODEL)).unwrap().model),
            ..Speculation::default()
        },
        ..config(SpecKind::Draft)
    };
    let e = device_server_drafting(both, Some(q4_drafter(made)))
        .err()
        .expect("refused")
        .to_string();
    assert!(e.contains("own drafter"), "{e}");
}

#[test]
fn what_the_device_cannot_do_is_refused_at_startup() {
    let err = |c: ServerConfig| device_server(c).err().expect("refused").to_string();
    let e = err(config(SpecKind::Mtp));
    assert!(e.contains("prompt lookup only"), "{e}");
    let e = err(ServerConfig {
        sessions: Some(2),
        ..config(SpecKind::None)
    });
    assert!(e.contains("one request at a time"), "{e}");
    let e = err(ServerConfig {
        context: Some(1),
        ..config(SpecKind::None)
    });
    assert!(e.contains("context"), "{e}");
}
