//! Tokenizer tests: real GGUF vocabularies against llama.cpp's ids
//! (tests/fixtures/tokenizer/*.json, made by tools/tokenizer_reference.py; skipped when the
//! model is not cached), the tiny HF fixtures (tokenizer.json vs the GGUF converted from it),
//! and streaming.

use std::path::PathBuf;

use super::*;
use crate::format::test_util::{cached_model, QWEN25_05B, SMOLLM2};

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn fixture(name: &str) -> serde_json::Value {
    let path = repo_root().join("tests/fixtures/tokenizer").join(name);
    serde_json::from_str(&std::fs::read_to_string(&path).expect("fixture")).expect("fixture JSON")
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// Checks every case of a reference file; returns the tokenizer.
fn check_against_llama_cpp(model: &str, fixture_name: &str) -> Option<Tokenizer> {
    let path = cached_model(model)?;
    let gguf = GgufFile::open(&path).unwrap();
    let tok = Tokenizer::from_gguf(&gguf).unwrap();
    let reference = fixture(fixture_name);
    assert_eq!(
        tok.token_count() as u64,
        reference["n_vocab"].as_u64().unwrap()
    );
    assert_eq!(tok.bos().map(u64::from), reference["bos"].as_u64());
    assert_eq!(tok.eos().map(u64::from), reference["eos"].as_u64());
    assert!(tok.warnings().is_empty(), "{:?}", tok.warnings());
    let cases = reference["cases"].as_array().unwrap();
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let parse_special = case["parse_special"].as_bool().unwrap();
        let expected = ids(&case["ids"]);
        let got = tok.encode(text, parse_special).unwrap();
        assert_eq!(
            got, expected,
            "{model}: encode({text:?}, parse_special={parse_special})"
        );
        let decoded = case["decoded"].as_str().unwrap();
        assert_eq!(
            tok.decode(&expected),
            decoded,
            "{model}: decode of {text:?}"
        );
        let mut stream = tok.stream_decoder();
        let mut streamed: String = expected.iter().map(|&id| stream.push(id)).collect();
        streamed.push_str(&stream.flush());
        assert_eq!(streamed, decoded, "{model}: streamed decode of {text:?}");
    }
    Some(tok)
}

#[test]
fn smollm2_gguf_matches_llama_cpp() {
    let Some(tok) = check_against_llama_cpp(SMOLLM2, "smollm2-135m.json") else {
        return;
    };
    assert!(!tok.add_bos());
    // <|im_end|> (eos) and <|endoftext|> both end generation.
    assert!(tok.is_eog(2) && tok.is_eog(0), "{:?}", tok.eos_ids());
    assert!(!tok.is_eog(1));
    assert_eq!(tok.id_to_piece(1), Some("<|im_start|>"));
    assert_eq!(tok.piece_to_id("<|im_start|>"), Some(1));
    assert_eq!(tok.decode_skip_special(&[1, 19556, 2]), "Hello");
    assert_eq!(
        tok.encode_with_bos("Hello", false).unwrap(),
        tok.encode("Hello", false).unwrap()
    );
}

#[test]
fn qwen25_gguf_matches_llama_cpp() {
    let Some(tok) = check_against_llama_cpp(QWEN25_05B, "qwen2.5-coder-0.5b.json") else {
        return;
    };
    assert!(!tok.add_bos());
    assert!(
        tok.is_eog(151645) && tok.is_eog(151643),
        "{:?}",
        tok.eos_ids()
    );
    assert!(!tok.is_eog(151644));
    assert!(
        tok.is_control(151644) && !tok.is_control(151657),
        "<tool_call> is user-defined, not control"
    );
}

#[test]
fn stream_decoder_waits_for_whole_characters() {
    let Some(path) = cached_model(QWEN25_05B) else {
        return;
    };
    let tok = Tokenizer::from_gguf(&GgufFile::open(path).unwrap()).unwrap();
    let text = "emoji 🤖🎉 and 日本語のテキスト, Привет";
    let ids = tok.encode(text, false).unwrap();
    // Some token holds part of a character (so the test exercises the waiting).
    assert!(ids
        .iter()
        .any(|&id| std::str::from_utf8(tok.token_bytes(id).unwrap()).is_err()));
    let mut stream = tok.stream_decoder();
    let mut out = String::new();
    let mut waited = false;
    for &id in &ids {
        let piece = stream.push(id);
        assert!(
            !piece.contains('\u{fffd}'),
            "partial character emitted: {piece:?}"
        );
        waited |= piece.is_empty() && stream.pending_bytes() > 0;
        out.push_str(&piece);
    }
    assert!(waited);
    assert_eq!(stream.flush(), "");
    assert_eq!(out, text);

    // A stream cut mid-character flushes a replacement character.
    let mut stream = tok.stream_decoder();
    let partial = ids
        .iter()
        .position(|&id| std::str::from_utf8(tok.token_bytes(id).unwrap()).is_err())
        .unwrap();
    let head: String = ids[..=partial].iter().map(|&id| stream.push(id)).collect();
    assert!(text.starts_with(&head));
    assert_eq!(stream.flush(), "\u{fffd}");
    // Control tokens are skipped on request.
    let mut stream = tok.stream_decoder().skip_special(true);
    assert_eq!(stream.push(151644), "");
}

/// The tiny fixtures' HF tokenizer.json and the GGUF llama.cpp converted from it agree.
#[test]
fn tiny_fixtures_hf_dir_and_gguf_agree() {
    let texts = [
        "The quick brown fox jumps over the lazy dog.",
        "def f(x):\n    return x * 12345\n\n",
        "  spaces   and\ttabs\n\n",
        "<|im_start|>user\nHi<|im_end|>\n",
        "naïve café 日本",
    ];
    for fixture in ["llama/tiny", "qwen2/tiny", "qwen3/tiny", "qwen3_5/tiny"] {
        let dir = repo_root().join("tests/fixtures").join(fixture);
        let hf = Tokenizer::from_hf_dir(&dir).unwrap();
        let gguf =
            Tokenizer::from_gguf(&GgufFile::open(dir.join("model-f32.gguf")).unwrap()).unwrap();
        assert_eq!(hf.spelling(), Spelling::ByteLevel);
        assert_eq!(hf.add_bos(), gguf.add_bos(), "{fixture}");
        if hf.add_bos() {
            // (Without BOS, llama.cpp's converter still records one where HF says none.)
            assert_eq!(hf.bos(), gguf.bos(), "{fixture}");
        }
        for text in texts {
            for special in [true, false] {
                let a = hf.encode(text, special).unwrap();
                let b = gguf.encode(text, special).unwrap();
                assert_eq!(a, b, "{fixture}: {text:?} special={special}");
                assert_eq!(hf.decode(&a), text, "{fixture}");
            }
        }
        // The reference's tokens decode to its text.
        let reference: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
                .unwrap();
        let tokens = ids(&reference["tokens"]);
        assert_eq!(
            hf.decode(&tokens),
            reference["text"].as_str().unwrap(),
            "{fixture}"
        );
        assert_eq!(
            hf.encode_with_bos(reference["text"].as_str().unwrap(), true)
                .unwrap(),
            tokens,
            "{fixture}"
        );
    }
}

#[test]
fn hf_dir_special_tokens() {
    let dir = repo_root().join("tests/fixtures/qwen3_5/tiny");
    let tok = Tokenizer::from_hf_dir(&dir).unwrap();
    let im_end = tok.piece_to_id("<|im_end|>").unwrap();
    let eot = tok.piece_to_id("<|endoftext|>").unwrap();
    assert!(tok.is_eog(im_end) && tok.is_eog(eot), "{:?}", tok.eos_ids());
    assert!(!tok.add_bos());
    assert!(tok.chat_template_source().is_some());
    let llama = Tokenizer::from_hf_dir(repo_root().join("tests/fixtures/llama/tiny")).unwrap();
    assert!(llama.add_bos(), "the post-processor adds <|begin_of_text|>");
    let missing = Tokenizer::from_hf_dir(repo_root().join("tests/fixtures")).unwrap_err();
    assert!(missing.to_string().contains("tokenizer.json"), "{missing}");
}

/// Templates rendered by transformers' apply_chat_template (tools/chat_template_reference.py).
#[test]
fn chat_templates_match_transformers() {
    let reference = fixture("chat_templates.json");
    let mut checked = 0;
    for t in reference["templates"].as_array().unwrap() {
        let name = t["name"].as_str().unwrap();
        let source = t["template"].as_str().unwrap();
        let (bos, eos) = (
            t["bos_token"].as_str().unwrap(),
            t["eos_token"].as_str().unwrap(),
        );
        let template = ChatTemplate::new(source, bos, eos, name).unwrap();
        for case in t["cases"].as_array().unwrap() {
            let messages: Vec<ChatMessage> =
                serde_json::from_value(case["messages"].clone()).unwrap();
            let extra = case["extra"].as_object().unwrap();
            let gen = case["add_generation_prompt"].as_bool().unwrap();
            let got = template.render(&messages, gen, extra).unwrap();
            assert_eq!(
                got,
                case["expected"].as_str().unwrap(),
                "{name}: {}",
                case["name"]
            );
            checked += 1;
        }
        // The template is the one the model file carries.
        if let Some(file) = t["gguf"].as_str() {
            if let Some(path) = cached_model(file) {
                let gguf = GgufFile::open(path).unwrap();
                let from_file = ChatTemplate::from_gguf(&gguf).unwrap();
                assert_eq!(
                    (
                        from_file.source(),
                        from_file.bos_token(),
                        from_file.eos_token()
                    ),
                    (source, bos, eos)
                );
                let tok = Tokenizer::from_gguf(&gguf).unwrap();
                assert_eq!(tok.chat_template_source(), Some(source));
            }
        }
        if let Some(dir) = t["hf_dir"].as_str() {
            let from_dir = ChatTemplate::from_hf_dir(repo_root().join(dir)).unwrap();
            assert_eq!(
                (
                    from_dir.source(),
                    from_dir.bos_token(),
                    from_dir.eos_token()
                ),
                (source, bos, eos)
            );
        }
    }
    assert_eq!(checked, 14);
}

/// Load times of the real files (run with --ignored --nocapture).
#[test]
#[ignore]
fn load_timing() {
    for model in [SMOLLM2, QWEN25_05B] {
        let Some(path) = cached_model(model) else {
            continue;
        };
        let t0 = std::time::Instant::now();
        let gguf = GgufFile::open(&path).unwrap();
        let t1 = std::time::Instant::now();
        let tok = Tokenizer::from_gguf(&gguf).unwrap();
        let t2 = std::time::Instant::now();
        let text =
            "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n"
                .repeat(100);
        let ids = tok.encode(&text, true).unwrap();
        let t3 = std::time::Instant::now();
        eprintln!(
            "{model}: GgufFile::open {:?}, Tokenizer::from_gguf {:?}, encode {} bytes -> {} tokens {:?}",
            t1 - t0,
            t2 - t1,
            text.len(),
            ids.len(),
            t3 - t2
        );
    }
}

/// A SentencePiece vocabulary (tools/spm_fixture.py) against llama.cpp's ids.
#[test]
fn sentencepiece_gguf_matches_llama_cpp() {
    let dir = repo_root().join("tests/fixtures/tokenizer");
    let gguf = GgufFile::open(dir.join("spm-tiny.gguf")).unwrap();
    let tok = Tokenizer::from_gguf(&gguf).unwrap();
    let reference = fixture("spm-tiny.json");
    assert_eq!(
        tok.token_count() as u64,
        reference["n_vocab"].as_u64().unwrap()
    );
    assert_eq!(tok.spelling(), Spelling::SentencePiece);
    assert!(tok.add_bos());
    assert_eq!((tok.bos(), tok.eos()), (Some(1), Some(2)));
    for case in reference["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let special = case["parse_special"].as_bool().unwrap();
        let expected = ids(&case["ids"]);
        assert_eq!(
            tok.encode(text, special).unwrap(),
            expected,
            "{text:?} special={special}"
        );
        // A stream keeps the prefix space; decode drops it (as sentencepiece's decoder does).
        let pieces = case["pieces_concat"].as_str().unwrap();
        let mut stream = tok.stream_decoder();
        let mut streamed: String = expected.iter().map(|&id| stream.push(id)).collect();
        streamed.push_str(&stream.flush());
        assert_eq!(streamed, pieces, "{text:?}");
        assert_eq!(
            tok.decode(&expected),
            pieces.strip_prefix(' ').unwrap_or(pieces),
            "{text:?}"
        );
        if let Some(sp) = case["sentencepiece_decoded"].as_str() {
            assert_eq!(tok.decode(&expected), sp, "{text:?}");
        }
    }
    assert_eq!(
        tok.encode_with_bos("hello world", true).unwrap(),
        [1, 282, 283]
    );
}
