//! `kasoku serve` end to end, over real sockets: the official `openai` Python client, and the
//! clients agents are built on (`openai`, `anthropic`, `langchain-openai`) on Qwen2.5-Coder
//! (installed into cached venvs, skipped when PyPI is unreachable), disconnects freeing the
//! session, concurrent streams matching solo answers, and the prefix cache on SmolLM2 and on
//! the hybrid (Gated DeltaNet) fixture.

mod common;

use common::fixture;

#[path = "../src/bench_client/http_client.rs"]
#[allow(dead_code)]
mod http_client;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use http_client::Url;
use serde_json::{json, Value};

/// The `openai` package version the client tests pin.
const OPENAI_VERSION: &str = "2.8.1";
/// The versions of the other clients the agent test pins.
const ANTHROPIC_VERSION: &str = "2.16.0";
const LANGCHAIN_OPENAI_VERSION: &str = "1.1.9";
const LANGCHAIN_CORE_VERSION: &str = "1.8.3";

fn smollm2() -> Option<String> {
    kasoku_fetch::ensure_for_test("smollm2-135m").map(|p| p.display().to_string())
}

/// A running server, killed on drop.
struct Server {
    child: Child,
    url: Url,
    base: String,
    id: String,
}

impl Server {
    fn start(model: &str, extra: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_kasoku"))
            .args(["serve", "--model", model, "--port", "0", "--threads", "2"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start kasoku serve");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let mut seen = String::new();
        let (base, id) = loop {
            let Some(Ok(line)) = lines.next() else {
                let _ = child.kill();
                panic!("kasoku serve exited before listening:\n{seen}");
            };
            seen.push_str(&line);
            seen.push('\n');
            if let Some(at) = line.find(" on http://") {
                let rest = &line[at + 4..];
                let url = rest.split_whitespace().next().unwrap().to_string();
                let id = line[..at]
                    .split('\'')
                    .nth(1)
                    .expect("model id in the banner")
                    .to_string();
                break (url, id);
            }
        };
        // Keep draining stderr so the server never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Server {
            child,
            url: Url::parse(&base).unwrap(),
            base,
            id,
        }
    }

    fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let r = http_client::request(
            &self.url,
            "POST",
            path,
            Some(&body.to_string()),
            None,
            Duration::from_secs(300),
        )
        .unwrap();
        let status = r.status;
        let text = r.text().unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text}")),
        )
    }

    /// A streaming chat: the text and the usage chunk.
    fn stream(&self, body: &Value) -> (String, Value) {
        let mut body = body.clone();
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
        let r = http_client::request(
            &self.url,
            "POST",
            "/v1/chat/completions",
            Some(&body.to_string()),
            None,
            Duration::from_secs(300),
        )
        .unwrap();
        assert_eq!(r.status, 200);
        let (mut text, mut usage) = (String::new(), Value::Null);
        for line in r.body.lines() {
            let line = line.unwrap();
            let Some(data) = line.strip_prefix("data: ") else {
                continue;
            };
            if data == "[DONE]" {
                break;
            }
            let v: Value = serde_json::from_str(data).unwrap();
            if let Some(t) = v["choices"][0]["delta"]["content"].as_str() {
                text.push_str(t);
            }
            if v["usage"].is_object() {
                usage = v["usage"].clone();
            }
        }
        (text, usage)
    }

    fn metric(&self, name: &str) -> f64 {
        let r = http_client::request(
            &self.url,
            "GET",
            "/metrics",
            None,
            None,
            Duration::from_secs(10),
        )
        .unwrap();
        let text = r.text().unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no metric {name} in\n{text}"))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn chat_body(model: &str, question: &str, max_tokens: usize) -> Value {
    json!({
        "model": model,
        "messages": [{"role": "user", "content": question}],
        "temperature": 0,
        "max_tokens": max_tokens,
    })
}

/// A Python that can import `packages` (pinned `name==version` specs) whose import names are
/// `imports`: a venv made once under the cache named `venv-{label}`, or failing that (no venv
/// module) a `pip install --target` directory on `PYTHONPATH`. `None` (with a note) when they
/// cannot be installed (no PyPI).
fn python_with(
    label: &str,
    packages: &[&str],
    imports: &str,
) -> Option<(PathBuf, Option<PathBuf>)> {
    let root = kasoku_fetch::models_dir()
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(std::env::temp_dir);
    let venv = root.join(format!("venv-{label}"));
    let target = root.join(format!("pylib-{label}"));
    let venv_python = venv.join("bin/python");
    let works = |python: &Path, path: Option<&Path>| {
        let mut c = Command::new(python);
        c.args(["-c", &format!("import {imports}")])
            .stderr(Stdio::null());
        if let Some(p) = path {
            c.env("PYTHONPATH", p);
        }
        c.status().is_ok_and(|s| s.success())
    };
    let system = PathBuf::from("python3");
    if works(&venv_python, None) {
        return Some((venv_python, None));
    }
    if works(&system, Some(&target)) {
        return Some((system, Some(target)));
    }
    if std::env::var("KASOKU_OFFLINE").is_ok_and(|v| v == "1") {
        eprintln!("note: KASOKU_OFFLINE=1 and {imports} is not installed; skipping {label}");
        return None;
    }
    let pip = |python: &Path, extra: &[&std::ffi::OsStr]| {
        Command::new(python)
            .args(["-m", "pip", "install", "-q", "--disable-pip-version-check"])
            .args(extra)
            .args(packages)
            .status()
            .is_ok_and(|s| s.success())
    };
    let venv_made = Command::new("python3")
        .args(["-m", "venv"])
        .arg(&venv)
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    // pip may complain about unrelated packages yet install fine: judge by the import.
    if venv_made {
        let _ = pip(&venv_python, &[]);
        if works(&venv_python, None) {
            return Some((venv_python, None));
        }
    }
    let _ = std::fs::remove_dir_all(&venv);
    let _ = pip(&system, &["--target".as_ref(), target.as_os_str()]);
    if works(&system, Some(&target)) {
        return Some((system, Some(target)));
    }
    eprintln!("note: could not install {packages:?} (no PyPI?); skipping {label}");
    None
}

/// Runs a client script against `server` and checks that it passed.
fn run_client(server: &Server, python: (PathBuf, Option<PathBuf>), script: &str) {
    let (python, pythonpath) = python;
    let mut command = Command::new(python);
    if let Some(p) = pythonpath {
        command.env("PYTHONPATH", p);
    }
    let out = command
        .arg(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests")
                .join(script),
        )
        .env("KASOKU_URL", &server.base)
        .env("KASOKU_MODEL_ID", &server.id)
        .env("KASOKU_API_KEY", "test-key")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("checks passed"), "{stdout}");
}

#[test]
fn the_official_openai_client_works() {
    let Some(model) = smollm2() else { return };
    let openai = format!("openai=={OPENAI_VERSION}");
    let label = format!("openai-{OPENAI_VERSION}");
    let Some(python) = python_with(&label, &[&openai], "openai") else {
        return;
    };
    let server = Server::start(&model, &["--api-key", "test-key", "--ctx-size", "2048"]);
    run_client(&server, python, "serve_openai.py");
}

/// What coding agents and agent frameworks are built on, on a model that can drive tools:
/// the `openai` and `anthropic` clients and `langchain-openai` (serve_agents.py says what
/// each checks).
#[test]
fn agent_clients_work() {
    let Some(model) = kasoku_fetch::ensure_for_test("qwen2.5-coder-0.5b") else {
        return;
    };
    let packages = [
        format!("openai=={OPENAI_VERSION}"),
        format!("anthropic=={ANTHROPIC_VERSION}"),
        format!("langchain-openai=={LANGCHAIN_OPENAI_VERSION}"),
        format!("langchain-core=={LANGCHAIN_CORE_VERSION}"),
    ];
    let packages: Vec<&str> = packages.iter().map(String::as_str).collect();
    let label = format!(
        "agents-{OPENAI_VERSION}-{ANTHROPIC_VERSION}-{LANGCHAIN_OPENAI_VERSION}-{LANGCHAIN_CORE_VERSION}"
    );
    let Some(python) = python_with(&label, &packages, "openai, anthropic, langchain_openai") else {
        return;
    };
    let server = Server::start(
        &model.display().to_string(),
        &["--api-key", "test-key", "--ctx-size", "4096"],
    );
    run_client(&server, python, "serve_agents.py");
}

#[test]
fn a_disconnect_mid_stream_frees_the_session() {
    let Some(model) = smollm2() else { return };
    let server = Server::start(
        &model,
        &["--parallel", "1", "--queue-size", "0", "--ctx-size", "2048"],
    );
    let mut long = chat_body(&server.id, "Count from one to a thousand.", 1900);
    long["ignore_eos"] = json!(true);
    long["stream"] = json!(true);
    let r = http_client::request(
        &server.url,
        "POST",
        "/v1/chat/completions",
        Some(&long.to_string()),
        None,
        Duration::from_secs(60),
    )
    .unwrap();
    assert_eq!(r.status, 200);
    let mut lines = r.body.lines();
    let mut chunks = 0;
    while chunks < 3 {
        let line = lines.next().unwrap().unwrap();
        chunks += line.starts_with("data: ") as usize;
    }
    // The only session is busy and no request may wait: 503, in OpenAI's error shape.
    let short = chat_body(&server.id, "Say hi.", 4);
    let (status, v) = server.post("/v1/chat/completions", &short);
    assert_eq!(status, 503, "{v}");
    assert_eq!(v["error"]["code"], "queue_full");
    drop(lines);
    // The connection is closed. The session must be free at once: the next request does not
    // wait for 1900 tokens. (The worker notices at its next token: retry a 503 for a moment.)
    let start = Instant::now();
    let (status, v) = loop {
        let (status, v) = server.post("/v1/chat/completions", &short);
        if status != 503 || start.elapsed() > Duration::from_secs(2) {
            break (status, v);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status, 200, "{v}");
    let queued_ms = v["usage"]["timings"]["queue_ms"].as_f64().unwrap();
    assert!(
        queued_ms < 2000.0 && start.elapsed() < Duration::from_secs(10),
        "waited {queued_ms} ms in the queue, {:?} in all",
        start.elapsed()
    );
    assert_eq!(
        server.metric("kasoku_requests_total{outcome=\"cancelled\"}"),
        1.0
    );
}

#[test]
fn concurrent_streams_give_the_same_text_as_solo_requests() {
    let Some(model) = smollm2() else { return };
    let server = Server::start(&model, &["--parallel", "2", "--ctx-size", "1024"]);
    let questions = [
        "What is the capital of France?",
        "Name three colors.",
        "Why is the sky blue?",
    ];
    let bodies: Vec<Value> = questions
        .iter()
        .map(|q| {
            let mut b = chat_body(&server.id, q, 24);
            b["cache_prompt"] = json!(false);
            b
        })
        .collect();
    let solo: Vec<String> = bodies.iter().map(|b| server.stream(b).0).collect();
    let together: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = bodies
            .iter()
            .map(|b| s.spawn(|| server.stream(b).0))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for ((q, a), b) in questions.iter().zip(&solo).zip(&together) {
        assert!(!a.is_empty(), "{q}: empty answer");
        assert_eq!(a, b, "{q}: concurrent answer differs from the solo one");
    }
}

/// A request sharing a long prefix with an earlier one reuses it (`cached_tokens`), answers as
/// an uncached request does, and reaches its first token sooner.
fn check_prefix_reuse(server: &Server, path: &str, first: Value, second: Value, min_cached: u64) {
    let (status, a) = server.post(path, &first);
    assert_eq!(status, 200, "{a}");
    assert_eq!(a["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let (_, hit) = server.post(path, &second);
    let mut uncached = second.clone();
    uncached["cache_prompt"] = json!(false);
    let (_, miss) = server.post(path, &uncached);
    let cached = hit["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(
        cached >= min_cached,
        "cached {cached} < {min_cached}: {hit}"
    );
    assert_eq!(miss["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let text = |v: &Value| {
        let c = &v["choices"][0];
        c["message"]["content"]
            .as_str()
            .or(c["text"].as_str())
            .unwrap()
            .to_string()
    };
    assert_eq!(
        text(&hit),
        text(&miss),
        "cached and uncached answers differ"
    );
    let ttft = |v: &Value| v["usage"]["timings"]["ttft_ms"].as_f64().unwrap();
    assert!(
        ttft(&hit) < ttft(&miss),
        "cached TTFT {:.1} ms not below uncached {:.1} ms",
        ttft(&hit),
        ttft(&miss)
    );
}

#[test]
fn the_prefix_cache_reuses_a_shared_prefix() {
    let Some(model) = smollm2() else { return };
    let server = Server::start(&model, &["--ctx-size", "2048"]);
    // ~500 shared tokens.
    let system = "You are a careful assistant. ".repeat(5)
        + &"The library opens at nine, closes at five, and lends books for three weeks. "
            .repeat(30);
    let body = |q: &str| {
        json!({
            "model": server.id,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": q}],
            "temperature": 0,
            "max_tokens": 12,
        })
    };
    check_prefix_reuse(
        &server,
        "/v1/chat/completions",
        body("When does the library open?"),
        body("How long can I keep a book?"),
        400,
    );
}

#[test]
fn the_prefix_cache_works_on_a_hybrid_model() {
    let server = Server::start(
        &fixture("qwen3_5/tiny/model-f32.gguf"),
        &["--ctx-size", "4096", "--prefix-cache-block", "64"],
    );
    // ~1700 tokens: prefilling them takes far longer than restoring a checkpoint.
    let shared = "the quick brown fox jumps over the lazy dog and ".repeat(60);
    let body = |tail: &str| {
        json!({
            "model": server.id,
            "prompt": format!("{shared}{tail}"),
            "temperature": 0,
            "max_tokens": 8,
        })
    };
    check_prefix_reuse(
        &server,
        "/v1/completions",
        body("then it sleeps"),
        body("finally a cat arrives"),
        1024,
    );
}

/// bench/load_test.py, shortened: 4 concurrent streaming clients on 2 sessions for 20 s, no
/// error and no memory growth after warm-up (the full run is a minute: bench/load_test.py).
#[test]
fn a_short_load_test_has_no_errors_and_no_memory_growth() {
    let Some(model) = smollm2() else { return };
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../bench/load_test.py");
    let out = Command::new("python3")
        .arg(script)
        .args(["--kasoku", env!("CARGO_BIN_EXE_kasoku"), "--model", &model])
        .args(["--clients", "4", "--parallel", "2", "--duration", "20"])
        .args([
            "--warmup",
            "8",
            "--max-tokens",
            "16",
            "--max-growth-mb",
            "64",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let summary: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(summary["errors"], 0, "{summary}");
    assert!(summary["requests"].as_u64().unwrap() >= 4, "{summary}");
}

/// With speculative decoding the server answers exactly as without it, in fewer target passes
/// (a draft model drafting for a fixture model), and reports the passes and accepted tokens.
#[test]
fn speculative_serving_answers_like_plain_serving_in_fewer_passes() {
    let target = fixture("llama/tiny/model-f32.gguf");
    let draft = fixture("llama/tiny/model-q4_0.gguf");
    let plain = Server::start(&target, &["--spec", "none", "--no-prefix-cache"]);
    let spec = Server::start(
        &target,
        &[
            "--spec",
            "draft",
            "--draft",
            &draft,
            "--fixed-budget",
            "--tree-budget",
            "4",
            "--no-prefix-cache",
        ],
    );
    let body = |server: &Server| {
        json!({
            "model": server.id,
            "prompt": "one two three four one two three four one two",
            "temperature": 0,
            "max_tokens": 64,
            "ignore_eos": true,
        })
    };
    let (s1, a) = plain.post("/v1/completions", &body(&plain));
    let (s2, b) = spec.post("/v1/completions", &body(&spec));
    assert_eq!((s1, s2), (200, 200), "{a} {b}");
    assert_eq!(a["choices"][0]["text"], b["choices"][0]["text"]);
    let n = |v: &Value, k: &str| v["usage"][k].as_u64().unwrap();
    assert_eq!(n(&a, "completion_tokens"), 64);
    assert_eq!(n(&a, "spec_accepted_tokens"), 0);
    assert!(n(&b, "spec_accepted_tokens") > 0, "{b}");
    assert!(n(&b, "spec_verify_ct") < n(&a, "spec_verify_ct"), "{a} {b}");
}

/// SIGTERM while a stream is live: the stream gets its final chunk (`finish_reason`, usage)
/// and `[DONE]` after the grace period, and the process exits 0.
#[test]
fn sigterm_during_a_stream_ends_it_cleanly() {
    let Some(model) = smollm2() else { return };
    let mut server = Server::start(
        &model,
        &[
            "--parallel",
            "1",
            "--ctx-size",
            "2048",
            "--shutdown-grace",
            "0.5",
        ],
    );
    let mut long = chat_body(&server.id, "Count from one to a thousand.", 1900);
    long["ignore_eos"] = json!(true);
    long["stream"] = json!(true);
    long["stream_options"] = json!({"include_usage": true});
    let r = http_client::request(
        &server.url,
        "POST",
        "/v1/chat/completions",
        Some(&long.to_string()),
        None,
        Duration::from_secs(60),
    )
    .unwrap();
    assert_eq!(r.status, 200);
    let mut lines = r.body.lines();
    let mut data = Vec::new();
    while data.len() < 3 {
        let line = lines.next().unwrap().unwrap();
        if let Some(d) = line.strip_prefix("data: ") {
            data.push(d.to_string());
        }
    }
    let killed = Command::new("kill")
        .args(["-TERM", &server.child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    for line in lines {
        let line = line.unwrap();
        if let Some(d) = line.strip_prefix("data: ") {
            data.push(d.to_string());
        }
    }
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{data:?}");
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let finishes: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"].get(0))
        .map(|c| &c["finish_reason"])
        .filter(|f| !f.is_null())
        .collect();
    assert_eq!(finishes, [&json!("length")]);
    let usage = &chunks.last().unwrap()["usage"];
    assert!(
        usage["completion_tokens"].as_u64().unwrap() < 1900,
        "{usage}"
    );
    let start = Instant::now();
    let status = loop {
        if let Some(s) = server.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "still running after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status}");
}

/// The flags reach the server: --cors-origin allows that origin, others are refused, and a
/// foreign Host is refused.
#[test]
fn cors_origin_and_host_flags_are_honoured() {
    let server = Server::start(
        &fixture("llama/tiny/model-f32.gguf"),
        &[
            "--cors-origin",
            "http://localhost:5173",
            "--no-prefix-cache",
        ],
    );
    let ask = |headers: &str| {
        use std::io::{Read, Write};
        let body = json!({"model": server.id, "prompt": "one", "max_tokens": 1}).to_string();
        let mut s =
            std::net::TcpStream::connect((server.url.host.as_str(), server.url.port)).unwrap();
        write!(
            s,
            "POST /v1/completions HTTP/1.1\r\n{headers}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    };
    let host = format!("Host: {}:{}\r\n", server.url.host, server.url.port);
    assert!(ask(&host).starts_with("HTTP/1.1 200"));
    let allowed = ask(&format!("{host}Origin: http://localhost:5173\r\n"));
    assert!(allowed.starts_with("HTTP/1.1 200"), "{allowed}");
    assert!(allowed
        .to_ascii_lowercase()
        .contains("access-control-allow-origin: http://localhost:5173"));
    assert!(ask(&format!("{host}Origin: https://evil.example\r\n")).starts_with("HTTP/1.1 403"));
    let rebound = format!("Host: attacker.example:{}\r\n", server.url.port);
    assert!(ask(&rebound).starts_with("HTTP/1.1 403"));
}
