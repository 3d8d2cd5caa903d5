//! The `kasoku` binary end to end on committed fixtures: run, logits, inspect, and clear
//! errors (exit code 1, a message, never a panic) for bad input.

mod common;

use common::fixture;

use std::process::{Command, Output};

fn kasoku(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kasoku"))
        .args(args)
        .output()
        .expect("run kasoku")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn run_streams_an_answer_and_prints_statistics() {
    for model in [
        fixture("llama/tiny"),
        fixture("qwen3_5/tiny/model-f32.gguf"),
    ] {
        let out = kasoku(&[
            "run",
            "--model",
            &model,
            "-m",
            "hello there",
            "-n",
            "8",
            "--threads",
            "1",
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        let err = stderr(&out);
        for field in [
            "time to first token",
            "prefill",
            "generation",
            "tokens/pass",
            "peak memory",
            "total",
        ] {
            assert!(err.contains(field), "statistics lack '{field}': {err}");
        }
        assert!(!out.stdout.is_empty());
    }
}

#[test]
fn interactive_chat_answers_each_turn() {
    use std::io::Write;
    let mut child = Command::new(env!("CARGO_BIN_EXE_kasoku"))
        .args(["run", "--model", &fixture("llama/tiny"), "-n", "4"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"hello\nand again\n/exit\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert_eq!(err.matches("tokens/pass").count(), 2, "{err}");
    // The second turn reuses the first turn's cache.
    assert!(err.contains("cached"), "{err}");
}

#[test]
fn logits_match_the_transformers_reference() {
    let reference: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixture("llama/tiny/reference.json")).unwrap(),
    )
    .unwrap();
    let tokens: Vec<String> = reference["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.to_string())
        .collect();
    let out = kasoku(&[
        "logits",
        "--model",
        &fixture("llama/tiny/model-f32.gguf"),
        "--tokens",
        &tokens.join(","),
        "--device",
        "cpu",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("device: cpu"), "{}", stderr(&out));
    let ours: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(ours["tokens"], reference["tokens"]);
    let (ours, theirs) = (
        ours["logits"].as_array().unwrap(),
        reference["logits"].as_array().unwrap(),
    );
    assert_eq!(ours.len(), theirs.len());
    for (a, b) in ours.iter().zip(theirs) {
        for (x, y) in a.as_array().unwrap().iter().zip(b.as_array().unwrap()) {
            let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
            assert!((x - y).abs() <= 1e-4 * y.abs().max(1.0), "{x} vs {y}");
        }
    }
}

/// The device flag: the default is the GPU where one is usable, else the CPU (stderr says
/// which and why); an asked-for GPU that is not there is an error, not a silent fallback.
#[test]
fn logits_pick_a_device_and_say_which() {
    let model = fixture("llama/tiny/model-f32.gguf");
    let out = kasoku(&["logits", "--model", &model, "--tokens", "1,2,3"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("device: cpu (") || err.contains("device: cuda:0"),
        "{err}"
    );
    let cuda = kasoku(&[
        "logits", "--model", &model, "--tokens", "1,2,3", "--device", "cuda",
    ]);
    if err.contains("device: cpu (") {
        assert!(!cuda.status.success());
        assert!(
            stderr(&cuda).contains("no usable CUDA device"),
            "{}",
            stderr(&cuda)
        );
    } else {
        assert!(cuda.status.success(), "{}", stderr(&cuda));
    }
    let bad = kasoku(&[
        "logits", "--model", &model, "--tokens", "1", "--device", "tpu",
    ]);
    assert!(!bad.status.success());
    assert!(
        stderr(&bad).contains("expected cpu, cuda or cuda:N"),
        "{}",
        stderr(&bad)
    );
}

#[test]
fn inspect_describes_gguf_and_hf_checkpoints() {
    let out = kasoku(&["inspect", &fixture("qwen3_5/tiny/model-f32.gguf")]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("qwen35")
            && text.contains("Gated DeltaNet")
            && text.contains("chat template"),
        "{text}"
    );
    let out = kasoku(&["inspect", &fixture("qwen2/tiny")]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn bad_input_gives_a_clear_error_not_a_panic() {
    let dir = std::env::temp_dir().join(format!("kasoku-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let truncated = dir.join("truncated.gguf");
    let bytes = std::fs::read(fixture("llama/tiny/model-f32.gguf")).unwrap();
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    let garbage = dir.join("garbage.gguf");
    std::fs::write(&garbage, b"this is not a model").unwrap();
    let truncated = truncated.display().to_string();
    let garbage = garbage.display().to_string();
    let tiny_gguf = fixture("llama/tiny/model-f32.gguf");
    let tiny_dir = fixture("llama/tiny");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["run", "--model", "no-such-model", "-m", "hi"],
            "known model",
        ),
        (
            vec!["run", "--model", &truncated, "-m", "hi"],
            "truncated.gguf",
        ),
        (vec!["run", "--model", &garbage, "-m", "hi"], "garbage.gguf"),
        (
            vec!["logits", "--model", &tiny_gguf, "--tokens", "1,99999999"],
            "vocabulary",
        ),
        (
            vec!["run", "--model", &tiny_dir, "-m", "hi", "--top-p", "2"],
            "top_p",
        ),
    ];
    for (args, expected) in cases {
        let out = kasoku(&args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.contains(expected),
            "{args:?}: error should mention '{expected}': {err}"
        );
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--spec` changes how the answer is computed, never what it is; speculation prints its
/// statistics; bad speculation options are clear errors.
#[test]
fn speculative_run_answers_like_plain_decoding() {
    let tiny = fixture("llama/tiny/model-f32.gguf");
    let draft = fixture("llama/tiny/model-q4_0.gguf");
    let answer = |extra: &[&str]| {
        let mut args = vec![
            "run",
            "--model",
            &tiny,
            "--raw",
            "-m",
            "one two three one two",
            "-n",
            "120",
            "--ignore-eos",
            "--threads",
            "1",
        ];
        args.extend_from_slice(extra);
        let out = kasoku(&args);
        assert!(out.status.success(), "{extra:?}: {}", stderr(&out));
        let err = stderr(&out);
        (out.stdout, err)
    };
    let (plain, _) = answer(&["--spec", "none"]);
    for extra in [
        &["--spec", "ngram", "--fixed-budget", "--tree-budget", "6"][..],
        &["--spec", "draft", "--draft", &draft][..],
        // The f32 file as its own draft: requantized to Q4_0 (the default), and kept as is.
        &["--spec", "draft", "--draft", &tiny][..],
        &[
            "--spec",
            "draft",
            "--draft",
            &tiny,
            "--draft-format",
            "none",
        ][..],
        &["--spec", "auto"][..],
    ] {
        let (out, err) = answer(extra);
        assert_eq!(out, plain, "{extra:?}");
        assert!(err.contains("speculation ("), "{extra:?}: {err}");
    }
    let bad = kasoku(&["run", "--model", &tiny, "-m", "x", "--spec", "magic"]);
    assert!(!bad.status.success());
    assert!(
        stderr(&bad).contains("unknown speculation"),
        "{}",
        stderr(&bad)
    );
    let bad_format = kasoku(&["run", "--model", &tiny, "-m", "x", "--draft-format", "q3"]);
    assert!(!bad_format.status.success());
    assert!(
        stderr(&bad_format).contains("unknown draft format"),
        "{}",
        stderr(&bad_format)
    );
    let no_draft = kasoku(&["run", "--model", &tiny, "-m", "x", "--spec", "draft"]);
    assert!(!no_draft.status.success());
    assert!(
        stderr(&no_draft).contains("--draft"),
        "{}",
        stderr(&no_draft)
    );
    let no_mtp = kasoku(&["run", "--model", &tiny, "-m", "x", "--spec", "mtp"]);
    assert!(
        stderr(&no_mtp).contains("multi-token-prediction"),
        "{}",
        stderr(&no_mtp)
    );
}

/// `--spec dflash --draft DIR` (and `auto` given a DFlash checkpoint) answers like plain
/// decoding; a DFlash checkpoint made for another target, or none, is a clear error.
#[test]
fn dflash_run_answers_like_plain_decoding() {
    let tiny = fixture("llama/tiny/model-f32.gguf");
    let dflash = fixture("qwen2/tiny_dflash");
    let answer = |extra: &[&str]| {
        let mut args = vec![
            "run",
            "--model",
            &tiny,
            "--raw",
            "-m",
            "one two three one two",
            "-n",
            "80",
            "--ignore-eos",
            "--threads",
            "1",
        ];
        args.extend_from_slice(extra);
        let out = kasoku(&args);
        assert!(out.status.success(), "{extra:?}: {}", stderr(&out));
        let err = stderr(&out);
        (out.stdout, err)
    };
    let (plain, _) = answer(&["--spec", "none"]);
    for extra in [
        &["--spec", "dflash", "--draft", &dflash][..],
        &["--spec", "auto", "--draft", &dflash][..],
        &[
            "--spec",
            "dflash",
            "--draft",
            &dflash,
            "--fixed-budget",
            "--tree-budget",
            "6",
        ][..],
    ] {
        let (out, err) = answer(extra);
        assert_eq!(out, plain, "{extra:?}");
        assert!(err.contains("speculation (dflash"), "{extra:?}: {err}");
    }
    let none = kasoku(&["run", "--model", &tiny, "-m", "x", "--spec", "dflash"]);
    assert!(!none.status.success());
    assert!(
        stderr(&none).contains("DFlash checkpoint"),
        "{}",
        stderr(&none)
    );
    let other = fixture("qwen3/tiny/model-f32.gguf");
    let wrong = kasoku(&["run", "--model", &other, "-m", "x", "--draft", &dflash]);
    assert!(!wrong.status.success());
    let err = stderr(&wrong);
    assert!(err.contains("num_target_layers 2 does not match"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    // The shipped drafters are listed with the models kasoku fetches.
    let list = kasoku(&["fetch", "--list"]);
    let listed = String::from_utf8_lossy(&list.stdout);
    assert!(
        listed.contains("qwen2.5-coder-1.5b-dflash") && listed.contains("(shipped)"),
        "{listed}"
    );
    // A shipped drafter's name is found in the checkout and checked against the target.
    let shipped = kasoku(&[
        "run",
        "--model",
        &tiny,
        "-m",
        "x",
        "--draft",
        "qwen2.5-coder-1.5b-dflash",
    ]);
    assert!(!shipped.status.success());
    let err = stderr(&shipped);
    assert!(
        err.contains("drafters/qwen2.5-coder-1.5b-dflash") && err.contains("hidden size 1536"),
        "{err}"
    );
}

/// `bench --prompts --compare` runs every strategy on every prompt, in turns; greedy decoding
/// gives each strategy the same number of tokens, and only the drafting strategies verify.
#[test]
fn bench_compares_strategies_prompt_by_prompt() {
    let dir = std::env::temp_dir().join(format!("kasoku-compare-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let prompts = dir.join("prompts.jsonl");
    std::fs::write(
        &prompts,
        "{\"prompt\": \"one two three one two\"}\n{\"prompt\": \"a b a b a\"}\n",
    )
    .unwrap();
    let json = dir.join("out.json");
    let tiny = fixture("llama/tiny/model-f32.gguf");
    let draft = fixture("llama/tiny/model-q4_0.gguf");
    let out = kasoku(&[
        "bench",
        "--model",
        &tiny,
        "--draft",
        &draft,
        "--prompts",
        prompts.to_str().unwrap(),
        "--compare",
        "none,ngram,auto+draft",
        "--gen-tokens",
        "24",
        "--threads",
        "1",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let strategies = v["strategies"].as_array().unwrap();
    let labels: Vec<&str> = strategies
        .iter()
        .map(|s| s["label"].as_str().unwrap())
        .collect();
    assert_eq!(labels, ["none", "ngram", "auto+draft"]);
    let generated = |s: &serde_json::Value| -> Vec<u64> {
        s["prompts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["generated"].as_u64().unwrap())
            .collect()
    };
    for s in strategies {
        assert_eq!(generated(s), generated(&strategies[0]), "{}", s["label"]);
    }
    assert!(strategies[0]["prompts"][0]["verify_passes"].is_null());
    assert!(
        strategies[2]["prompts"][0]["verify_passes"]
            .as_u64()
            .unwrap()
            > 0
    );
    let bad = kasoku(&["bench", "--model", &tiny, "--compare", "none"]);
    assert!(
        stderr(&bad).contains("--compare needs --prompts"),
        "{}",
        stderr(&bad)
    );
    // The prompts' device is the one asked for, never a silent CPU: a GPU that is not there
    // is an error; one that is runs every strategy.
    assert_eq!(v["device"], "cpu");
    let on_gpu = kasoku(&[
        "bench",
        "--model",
        &tiny,
        "--prompts",
        prompts.to_str().unwrap(),
        "--compare",
        "none,ngram",
        "--gen-tokens",
        "8",
        "--device",
        "cuda",
        "--json",
        json.to_str().unwrap(),
    ]);
    let probe = kasoku(&["logits", "--model", &tiny, "--tokens", "1"]);
    if stderr(&probe).contains("device: cpu (") {
        assert!(!on_gpu.status.success());
        let err = stderr(&on_gpu);
        assert!(err.contains("no usable CUDA device"), "{err}");
    } else {
        assert!(on_gpu.status.success(), "{}", stderr(&on_gpu));
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        assert_eq!(v["device"], "cuda:0");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The README's first command (`kasoku run -m "What is the capital of France?"`, the default
/// model, greedy): a right, well-formed answer, then the statistics line.
#[test]
fn the_readmes_first_command_answers_correctly() {
    if kasoku_fetch::ensure_for_test(kasoku_fetch::DEFAULT_MODEL).is_none() {
        return;
    }
    let out = kasoku(&["run", "-m", "What is the capital of France?", "-n", "32"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let answer = String::from_utf8_lossy(&out.stdout);
    assert_eq!(answer.trim(), "The capital of France is Paris.", "{answer}");
    let err = stderr(&out);
    assert!(
        err.contains("[stop]") && err.contains("time to first token"),
        "{err}"
    );
}

/// `kasoku fetch --verify` on a cache holding a corrupt model (with a marker claiming it was
/// checked) and a partial file of a killed fetch: both reported and removed, exit status 1;
/// run again, the cache is clean and it exits 0.
#[test]
fn fetch_verify_removes_corrupt_models_and_leftovers() {
    let dir = std::env::temp_dir().join(format!("kasoku-verify-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let model = kasoku_fetch::find("smollm2-135m").unwrap();
    let file = dir.join(model.file);
    std::fs::write(&file, b"not a model").unwrap();
    std::fs::write(dir.join(format!("{}.verified", model.file)), model.sha256).unwrap();
    let partial = dir.join(format!("{}.999999999-0.part", model.file));
    std::fs::write(&partial, b"half").unwrap();
    let verify = || {
        Command::new(env!("CARGO_BIN_EXE_kasoku"))
            .args(["fetch", "--verify"])
            .env("KASOKU_MODELS", &dir)
            .output()
            .unwrap()
    };
    let out = verify();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(1), "{stdout}{}", stderr(&out));
    assert!(
        stdout.contains("corrupt") && stdout.contains(model.file),
        "{stdout}"
    );
    assert!(
        stdout.contains("0 ok, 1 corrupt, 1 leftovers removed"),
        "{stdout}"
    );
    assert!(!file.exists() && !partial.exists());
    let again = verify();
    assert!(again.status.success(), "{}", stderr(&again));
    assert!(String::from_utf8_lossy(&again.stdout).contains("0 ok, 0 corrupt, 0 leftovers"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `kasoku quantize` from an HF directory and from a GGUF file: the output runs, gives logits,
/// and `run --quantize` converts on load; refusals are clear errors.
#[test]
fn quantize_writes_checkpoints_that_every_command_loads() {
    let tmp = std::env::temp_dir().join(format!("kasoku-cli-quantize-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let out_of = |name: &str| tmp.join(name).to_string_lossy().into_owned();
    for (src, format, name) in [
        (fixture("qwen2/tiny"), "m", "hf-m"),
        (fixture("llama/tiny/model-f32.gguf"), "l", "gguf-l"),
        (fixture("qwen3/tiny"), "mixed", "hf-mixed"),
    ] {
        let out = out_of(name);
        let q = kasoku(&["quantize", &src, &out, "--format", format]);
        assert!(q.status.success(), "{}", stderr(&q));
        assert!(String::from_utf8_lossy(&q.stdout).contains("bits per weight"));
        let run = kasoku(&["run", "--model", &out, "-m", "hello", "--raw", "-n", "4"]);
        assert!(run.status.success(), "{name}: {}", stderr(&run));
        let logits = kasoku(&[
            "logits", "--model", &out, "--tokens", "1,2,3", "--device", "cpu",
        ]);
        assert!(logits.status.success(), "{name}: {}", stderr(&logits));
        let json: serde_json::Value = serde_json::from_slice(&logits.stdout).unwrap();
        assert!(json.is_object() || json.is_array(), "{name}");
        let inspect = kasoku(&["inspect", &out]);
        let text = String::from_utf8_lossy(&inspect.stdout);
        let grid = if format == "l" {
            "L/g32 rot32"
        } else {
            "M/g64 rot32"
        };
        assert!(
            inspect.status.success() && text.contains(grid),
            "{name}: {text}"
        );
    }
    let conv = kasoku(&[
        "run",
        "--model",
        &fixture("qwen2/tiny"),
        "--quantize",
        "l",
        "-m",
        "hi",
        "--raw",
        "-n",
        "3",
    ]);
    assert!(conv.status.success(), "{}", stderr(&conv));
    // Refusals: an occupied output, a kasoku checkpoint as input, an unknown format.
    let again = kasoku(&[
        "quantize",
        &fixture("qwen2/tiny"),
        &out_of("hf-m"),
        "--format",
        "m",
    ]);
    assert!(!again.status.success() && stderr(&again).contains("not an empty directory"));
    let twice = kasoku(&["quantize", &out_of("hf-m"), &out_of("x"), "--format", "m"]);
    assert!(!twice.status.success() && stderr(&twice).contains("already"));
    let bad = kasoku(&[
        "quantize",
        &fixture("qwen2/tiny"),
        &out_of("y"),
        "--format",
        "q4",
    ]);
    assert!(!bad.status.success() && stderr(&bad).contains("not m, l or mixed"));
    let _ = std::fs::remove_dir_all(&tmp);
}

/// `run` picks its device as `logits` does: the default says which (a GPU only when it can
/// run the request), an asked-for GPU that is absent or cannot run the request is an error
/// with the reason, and `--device cpu` runs here whatever the machine has.
#[test]
fn run_picks_a_device_and_says_which() {
    let model = fixture("qwen2/tiny/model-f32.gguf");
    let args = |extra: &[&str]| {
        let mut a = vec!["run", "--model", &model, "--raw", "-m", "hello", "-n", "4"];
        a.extend_from_slice(extra);
        a.into_iter().map(String::from).collect::<Vec<_>>()
    };
    let run = |extra: &[&str]| {
        let a = args(extra);
        kasoku(&a.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let default = run(&[]);
    assert!(default.status.success(), "{}", stderr(&default));
    let err = stderr(&default);
    let has_gpu = err.contains("device cuda:0");
    assert!(has_gpu || err.contains("device: cpu ("), "{err}");
    // MTP drafting is not on the GPU path: the default takes the CPU and an explicit GPU is
    // refused with the reason.
    let mtp = run(&["--spec", "mtp", "--device", "cuda"]);
    assert!(!mtp.status.success());
    let why = stderr(&mtp);
    assert!(
        why.contains("no usable CUDA device") || why.contains("prompt lookup only"),
        "{why}"
    );
    let cpu = run(&["--device", "cpu"]);
    assert!(cpu.status.success(), "{}", stderr(&cpu));
    assert!(!stderr(&cpu).contains("device: cpu ("));
    // A GGUF draft model (here the model itself) runs beside the target wherever the target
    // runs, on the GPU when there is one (no fallback), and answers as plain decoding does.
    let drafted = run(&["--spec", "draft", "--draft", &model]);
    assert!(drafted.status.success(), "{}", stderr(&drafted));
    let why = stderr(&drafted);
    if has_gpu {
        assert!(why.contains("device cuda:0"), "{why}");
        assert!(why.contains("loaded draft"), "{why}");
    }
    assert_eq!(drafted.stdout, run(&["--spec", "none"]).stdout);
}

/// `serve` picks its device as `run` does and says which at startup; an asked-for GPU that
/// is absent is an error with the reason (exit 1), never a CPU server.
#[test]
fn serve_picks_a_device_and_says_which() {
    use std::io::{BufRead, BufReader};
    let model = fixture("qwen2/tiny/model-f32.gguf");
    let banner = |device: &[&str]| -> (String, bool) {
        let mut child = Command::new(env!("CARGO_BIN_EXE_kasoku"))
            .args(["serve", "--model", &model, "--port", "0", "--threads", "1"])
            .args(device)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("start kasoku serve");
        let mut seen = String::new();
        for line in BufReader::new(child.stderr.take().unwrap()).lines() {
            let Ok(line) = line else { break };
            seen += &line;
            seen.push('\n');
            if line.contains(" on http://") {
                let _ = child.kill();
                let _ = child.wait();
                return (seen, true);
            }
        }
        let status = child.wait().unwrap();
        assert!(!status.success(), "exited 0 without serving:\n{seen}");
        (seen, false)
    };
    let (cpu, served) = banner(&["--device", "cpu"]);
    assert!(served && cpu.contains("(device cpu, "), "{cpu}");
    let (default, served) = banner(&[]);
    assert!(served, "{default}");
    assert!(
        default.contains("(device cuda:0, ") || default.contains("device: cpu ("),
        "{default}"
    );
    if default.contains("device: cpu (") {
        // No usable GPU here: asking for one is an error naming why.
        let (err, served) = banner(&["--device", "cuda"]);
        assert!(!served);
        assert!(err.contains("no usable CUDA device"), "{err}");
    }
    // MTP drafting does not run on the GPU: refused when the GPU is asked for.
    let (err, served) = banner(&["--device", "cuda", "--spec", "mtp"]);
    assert!(!served);
    assert!(
        err.contains("no usable CUDA device") || err.contains("prompt lookup only"),
        "{err}"
    );
}
