//! The engine's `Session` on tiny fixture models: prefix reuse gives the same tokens as a fresh
//! session, sampling is reproducible per seed, stop conditions end generation, bad input is an
//! error.

mod common;

use std::sync::Arc;

use kasoku::engine::{
    self, EngineError, FinishReason, Flow, GenerateOptions, LoadedModel, PromptOptions,
    SamplingParams, Session,
};
use kasoku::tokenizer::ChatMessage;

fn tiny(rel: &str) -> LoadedModel {
    LoadedModel::load(common::fixture(rel)).unwrap()
}

fn options(temperature: f32, seed: u64, max_tokens: usize) -> GenerateOptions {
    GenerateOptions {
        logprobs: None,
        sampling: SamplingParams {
            temperature,
            top_k: 40,
            top_p: 0.95,
            seed,
            ..Default::default()
        },
        max_tokens,
        stop_tokens: Vec::new(),
        constraint: None,
    }
}

fn run(session: &mut Session, prompt: &[u32], opts: &GenerateOptions) -> Vec<u32> {
    session
        .generate(prompt, opts, &mut |_| Flow::Continue)
        .unwrap()
        .tokens
}

#[test]
fn same_seed_same_tokens_different_seed_different_tokens() {
    for fixture in ["llama/tiny/model-f32.gguf", "qwen3_5/tiny/model-f32.gguf"] {
        let model = tiny(fixture);
        let prompt: Vec<u32> = vec![5, 17, 99, 23, 42];
        let a = run(
            &mut Session::new(Arc::clone(&model.model), 128),
            &prompt,
            &options(1.0, 7, 40),
        );
        let b = run(
            &mut Session::new(Arc::clone(&model.model), 128),
            &prompt,
            &options(1.0, 7, 40),
        );
        let c = run(
            &mut Session::new(Arc::clone(&model.model), 128),
            &prompt,
            &options(1.0, 8, 40),
        );
        assert_eq!(a.len(), 40);
        assert_eq!(a, b, "{fixture}: same seed");
        assert_ne!(a, c, "{fixture}: different seeds");
    }
}

#[test]
fn reusing_the_cached_prefix_gives_the_same_tokens_as_a_fresh_session() {
    for fixture in ["llama/tiny/model-f32.gguf", "qwen3_5/tiny/model-f32.gguf"] {
        let model = tiny(fixture);
        let opts = options(0.0, 0, 12);
        let first: Vec<u32> = vec![3, 14, 15, 92, 65, 35];
        let mut session = Session::new(Arc::clone(&model.model), 128);
        let answer = run(&mut session, &first, &opts);
        // Second turn: the first prompt, its answer, then more tokens.
        let mut second = first.clone();
        second.extend(&answer);
        second.extend([89, 79, 32]);
        let generation = session
            .generate(&second, &opts, &mut |_| Flow::Continue)
            .unwrap();
        assert!(
            generation.stats.cached_tokens > 0,
            "{fixture}: nothing reused"
        );
        let fresh = run(
            &mut Session::new(Arc::clone(&model.model), 128),
            &second,
            &opts,
        );
        assert_eq!(generation.tokens, fresh, "{fixture}");
        // A prompt that diverges from the cache midway.
        let mut third = first[..3].to_vec();
        third.extend([7, 7, 7]);
        let reused = run(&mut session, &third, &opts);
        let fresh = run(
            &mut Session::new(Arc::clone(&model.model), 128),
            &third,
            &opts,
        );
        assert_eq!(reused, fresh, "{fixture}: diverging prompt");
    }
}

#[test]
fn stop_tokens_max_tokens_and_callback_stop() {
    let model = tiny("llama/tiny/model-f32.gguf");
    let prompt = vec![1u32, 2, 3];
    let opts = options(0.0, 0, 10);
    let free = run(
        &mut Session::new(Arc::clone(&model.model), 64),
        &prompt,
        &opts,
    );
    assert_eq!(free.len(), 10);
    // Stopping on the third generated token: two tokens come out, finish reason stop.
    let stop = GenerateOptions {
        logprobs: None,
        stop_tokens: vec![free[2]],
        ..opts.clone()
    };
    let g = Session::new(Arc::clone(&model.model), 64)
        .generate(&prompt, &stop, &mut |_| Flow::Continue)
        .unwrap();
    let first_stop = free.iter().position(|&t| t == free[2]).unwrap();
    assert_eq!(g.tokens, free[..first_stop]);
    assert_eq!(g.finish, FinishReason::Stop);
    // Plain decoding: one token per target pass, whether it ends on a stop token or on length.
    assert_eq!(g.stats.tokens_per_pass(), 1.0);
    let g = Session::new(Arc::clone(&model.model), 64)
        .generate(&prompt, &opts, &mut |_| Flow::Continue)
        .unwrap();
    assert_eq!(g.stats.tokens_per_pass(), 1.0);
    let mut seen = 0;
    let g = Session::new(Arc::clone(&model.model), 64)
        .generate(&prompt, &opts, &mut |_| {
            seen += 1;
            if seen == 4 {
                Flow::Stop
            } else {
                Flow::Continue
            }
        })
        .unwrap();
    assert_eq!(g.tokens.len(), 4);
    assert_eq!(g.finish, FinishReason::Stop);
    // The context fills up: finish reason length, no error.
    let g = Session::new(Arc::clone(&model.model), 8)
        .generate(&prompt, &opts, &mut |_| Flow::Continue)
        .unwrap();
    assert_eq!(g.finish, FinishReason::ContextFull);
    assert!(g.tokens.len() <= 5);
}

#[test]
fn bad_input_is_an_error_and_the_session_still_works() {
    let model = tiny("llama/tiny/model-f32.gguf");
    let mut session = Session::new(Arc::clone(&model.model), 16);
    let opts = options(0.0, 0, 4);
    assert!(matches!(
        session.generate(&[], &opts, &mut |_| Flow::Continue),
        Err(EngineError::EmptyPrompt)
    ));
    let long: Vec<u32> = (0..16).collect();
    assert!(matches!(
        session.generate(&long, &opts, &mut |_| Flow::Continue),
        Err(EngineError::PromptTooLong { .. })
    ));
    let out_of_vocab = vec![1u32, 1_000_000];
    assert!(session
        .generate(&out_of_vocab, &opts, &mut |_| Flow::Continue)
        .is_err());
    let bad = GenerateOptions {
        logprobs: None,
        sampling: SamplingParams {
            top_p: 0.0,
            ..Default::default()
        },
        ..opts.clone()
    };
    assert!(matches!(
        session.generate(&[1, 2], &bad, &mut |_| Flow::Continue),
        Err(EngineError::Param(_))
    ));
    assert_eq!(run(&mut session, &[1, 2, 3], &opts).len(), 4);
}

#[test]
fn a_prompt_longer_than_its_context_can_hold_is_refused_untokenized() {
    let model = tiny("llama/tiny");
    let bound = 256 * engine::PROMPT_BYTES_PER_TOKEN;
    let at = |raw: bool| PromptOptions {
        raw,
        context: Some(256),
        ..Default::default()
    };
    // 4 MB would take seconds to tokenize; refused at once, raw or through the template.
    let huge = vec![ChatMessage::new("user", "a".repeat(4 << 20))];
    for raw in [true, false] {
        let start = std::time::Instant::now();
        let e = engine::prompt_tokens(&model, &huge, &at(raw)).unwrap_err();
        assert!(
            matches!(e, engine::TextError::PromptTooLong { bytes, context: 256 } if bytes >= 4 << 20),
            "{e}"
        );
        assert!(e.to_string().contains("not tokenized"), "{e}");
        assert!(start.elapsed().as_millis() < 500, "{:?}", start.elapsed());
    }
    // At the bound a raw prompt is tokenized; the template's own text counts too.
    let edge = vec![ChatMessage::new("user", "a".repeat(bound))];
    assert!(engine::prompt_tokens(&model, &edge, &at(true)).is_ok());
    let e = engine::prompt_tokens(&model, &edge, &at(false)).unwrap_err();
    assert!(
        matches!(e, engine::TextError::PromptTooLong { bytes, .. } if bytes > bound),
        "{e}"
    );
}

#[test]
fn chat_text_streams_and_stop_strings_cut_the_answer() {
    let model = tiny("llama/tiny");
    let messages = vec![ChatMessage::new("user", "The quick brown fox")];
    let prompt = engine::prompt_tokens(&model, &messages, &Default::default()).unwrap();
    let opts = options(0.0, 0, 24);
    let mut session = Session::new(Arc::clone(&model.model), 256);
    let mut streamed = String::new();
    let (generation, text) =
        engine::generate_text(&mut session, &model, &prompt, &opts, &[], &mut |piece| {
            streamed.push_str(piece)
        })
        .unwrap();
    assert_eq!(streamed, text);
    assert_eq!(generation.tokens.len(), 24);
    // Cut at a stop string taken from the middle of the free answer.
    let chars: Vec<char> = text.chars().collect();
    if chars.len() > 6 {
        let stop: String = chars[chars.len() / 2..chars.len() / 2 + 2].iter().collect();
        let expected = &text[..text.find(&stop).unwrap()];
        let mut fresh = Session::new(Arc::clone(&model.model), 256);
        let (g, cut) =
            engine::generate_text(&mut fresh, &model, &prompt, &opts, &[stop], &mut |_| {})
                .unwrap();
        assert_eq!(cut, expected);
        assert_eq!(g.finish, FinishReason::Stop);
    }
}
