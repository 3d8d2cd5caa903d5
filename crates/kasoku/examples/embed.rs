//! kasoku inside your own program: load a model, open a session, stream an answer, print the
//! statistics. Copy this file into an application that depends on the `kasoku` crate.
//!
//! `cargo run --release -p kasoku --example embed -- MODEL "your question"`, where MODEL is a
//! GGUF file or a Hugging Face directory (e.g. one that `kasoku fetch` put into
//! `~/.cache/kasoku/models`).

use std::io::Write;

use kasoku::{ChatMessage, LoadedModel, PromptOptions, SamplingParams};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args.next().ok_or("usage: embed MODEL [QUESTION]")?;
    let question = args
        .next()
        .unwrap_or_else(|| "What is the capital of France?".to_string());

    // Weights, tokenizer and chat template, loaded once; share `model` between threads.
    let model = LoadedModel::load(&path)?;
    // One conversation: its own KV cache, room for 4096 tokens (or the model's context).
    let mut session = model.session(model.max_context().min(4096));

    // The conversation so far, rendered through the model's chat template.
    let chat = vec![
        ChatMessage::new("system", "You are a concise assistant."),
        ChatMessage::new("user", question),
    ];
    let prompt = kasoku::prompt_tokens(&model, &chat, &PromptOptions::default())?;

    // Sampled at temperature 0.7 with a fixed seed (the same seed gives the same answer);
    // `SamplingParams::default()` is greedy. At most 256 tokens, ending at the model's
    // end-of-generation tokens.
    let sampling = SamplingParams {
        temperature: 0.7,
        top_p: 0.9,
        seed: 1,
        ..SamplingParams::default()
    };
    let options = model.options(sampling, 256);

    // Text arrives piece by piece (whole UTF-8 characters); no stop strings here.
    let mut stdout = std::io::stdout();
    let (generation, _answer) =
        kasoku::generate_text(&mut session, &model, &prompt, &options, &[], &mut |piece| {
            print!("{piece}");
            let _ = stdout.flush();
        })?;
    println!();

    let stats = &generation.stats;
    eprintln!(
        "{} tokens ({:?}), {:.1} tokens/s, first token after {:.3} s",
        stats.generated_tokens,
        generation.finish,
        stats.decode_tokens_per_second(),
        stats.time_to_first_token.as_secs_f64()
    );
    eprintln!("{}", stats.summary());
    Ok(())
}
