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
}
