//! The library driven only through its facade (the items at the crate root): load a model,
//! open a session, generate with options, stream tokens and text, read statistics. Uses the
//! tiny llama fixture, whose GGUF carries its tokenizer.

mod common;

use kasoku::{
    ChatMessage, EngineError, FinishReason, Flow, LoadedModel, PromptOptions, SamplingParams,
};

fn model() -> LoadedModel {
    LoadedModel::load(common::fixture("llama/tiny/model-f32.gguf")).unwrap()
}

#[test]
fn tokens_stream_as_sampled_and_statistics_count_them() {
    let model = model();
    let mut session = model.session(256);
    let chat = [ChatMessage::new("user", "hello there")];
    let raw = PromptOptions {
        raw: true,
        ..PromptOptions::default()
    };
    let prompt = kasoku::prompt_tokens(&model, &chat, &raw).unwrap();
    assert!(prompt.len() > 1, "{prompt:?}");
    let mut options = model.options(SamplingParams::default(), 12);
    options.stop_tokens.clear(); // run to the length limit
    let mut streamed = Vec::new();
    let first = session
        .generate(&prompt, &options, &mut |e| {
            streamed.push(e.token);
            Flow::Continue
        })
        .unwrap();
    assert_eq!(
        first.tokens, streamed,
        "every token streams as it is sampled"
    );
    assert_eq!(first.finish, FinishReason::Length);
    let stats = &first.stats;
    assert_eq!(stats.generated_tokens, 12);
    assert_eq!(stats.prompt_tokens, prompt.len());
    assert_eq!(stats.cached_tokens, 0);
    assert!(stats.total_time >= stats.prefill_time);
    assert!(
        (stats.tokens_per_pass() - 1.0).abs() < 1e-9,
        "plain decoding"
    );

    // The same prompt again in the same session: all but its last token come from the
    // session's cache, and greedy decoding gives the same answer.
    let again = session
        .generate(&prompt, &options, &mut |_| Flow::Continue)
        .unwrap();
    assert_eq!(again.tokens, first.tokens);
    assert_eq!(again.stats.cached_tokens, prompt.len() - 1);
    assert_eq!(again.stats.prompt_tokens, 1);

    // The caller may stop the answer after any token.
    let mut seen = 0;
    let stopped = model
        .session(256)
        .generate(&prompt, &options, &mut |_| {
            seen += 1;
            if seen == 3 {
                Flow::Stop
            } else {
                Flow::Continue
            }
        })
        .unwrap();
    assert_eq!(stopped.tokens, first.tokens[..3]);
    assert_eq!(stopped.finish, FinishReason::Stop);
}

#[test]
fn text_streams_in_pieces_that_make_the_answer() {
    let model = model();
    let chat = [ChatMessage::new("user", "count")];
    let raw = PromptOptions {
        raw: true,
        ..PromptOptions::default()
    };
    let prompt = kasoku::prompt_tokens(&model, &chat, &raw).unwrap();
    let sampling = SamplingParams {
        temperature: 0.8,
        seed: 3,
        ..SamplingParams::default()
    };
    let options = model.options(sampling, 16);
    let run = || {
        let mut pieces = String::new();
        let (generation, answer) = kasoku::generate_text(
            &mut model.session(256),
            &model,
            &prompt,
            &options,
            &[],
            &mut |piece| pieces.push_str(piece),
        )
        .unwrap();
        assert_eq!(pieces, answer);
        (generation.tokens, answer)
    };
    let (tokens, answer) = run();
    assert!(!tokens.is_empty());
    assert_eq!(run(), (tokens, answer), "the same seed gives the same text");
}

#[test]
fn bad_requests_are_errors() {
    let model = model();
    let options = model.options(SamplingParams::default(), 4);
    let mut session = model.session(8);
    let e = session
        .generate(&[], &options, &mut |_| Flow::Continue)
        .unwrap_err();
    assert!(matches!(e, EngineError::EmptyPrompt), "{e}");
    let long = vec![1u32; 8];
    let e = session
        .generate(&long, &options, &mut |_| Flow::Continue)
        .unwrap_err();
    assert!(
        matches!(e, EngineError::PromptTooLong { prompt: 8, ctx: 8 }),
        "{e}"
    );
    let bad = SamplingParams {
        temperature: -1.0,
        ..SamplingParams::default()
    };
    let e = session
        .generate(&[1, 2], &model.options(bad, 4), &mut |_| Flow::Continue)
        .unwrap_err();
    assert!(matches!(e, EngineError::Param(_)), "{e}");
    assert!(LoadedModel::load(common::fixture("no/such/model.gguf")).is_err());
}
