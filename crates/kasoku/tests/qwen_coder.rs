//! Qwen2.5-Coder-0.5B-Instruct Q4_K_M (real weights: Q4_K, Q6_K, Q5_0, Q8_0 tensors; QKV bias;
//! NEOX RoPE): greedy decoding of the raw prompt "def fibonacci(n):\n" writes a function that
//! Python itself parses.

mod common;

use std::sync::Arc;

use kasoku::engine::{self, GenerateOptions, LoadedModel, PromptOptions, SamplingParams, Session};
use kasoku::tokenizer::ChatMessage;

#[test]
fn greedy_fibonacci_is_valid_python() {
    let Some(path) = common::real_model("qwen2.5-coder-0.5b") else {
        return;
    };
    let model = LoadedModel::load(&path).unwrap();
    let prompt_text = "def fibonacci(n):\n";
    let prompt = engine::prompt_tokens(
        &model,
        &[ChatMessage::new("user", prompt_text)],
        &PromptOptions {
            raw: true,
            think: false,
        },
    )
    .unwrap();
    let options = GenerateOptions {
        sampling: SamplingParams::default(),
        max_tokens: 160,
        stop_tokens: engine::stop_tokens(&model),
        constraint: None,
    };
    let mut session = Session::new(Arc::clone(&model.model), 512);
    // The model closes its code with a Markdown fence and then explains it: stop there.
    let (_, completion) = engine::generate_text(
        &mut session,
        &model,
        &prompt,
        &options,
        &["```".to_string()],
        &mut |_| {},
    )
    .unwrap();
    let source = format!("{prompt_text}{completion}");
    assert!(
        completion.contains("return"),
        "no return statement in:\n{source}"
    );
    let checked = std::process::Command::new("python3")
        .args(["-c", "import ast, sys; ast.parse(sys.stdin.read())"])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            child.stdin.take().unwrap().write_all(source.as_bytes())?;
            child.wait_with_output()
        })
        .expect("python3 runs");
    assert!(
        checked.status.success(),
        "not valid Python ({}):\n{source}",
        String::from_utf8_lossy(&checked.stderr)
    );
}
