//! Mutation fuzzing of every input kasoku takes from outside (GGUF files, safetensors files,
//! config.json, tokenizer.json, chat templates, the server's request bodies) on stable Rust:
//! no nightly toolchain and no coverage instrumentation are needed, so it runs anywhere the
//! workspace builds. A target is a function of bytes ([`targets`]); the runner ([`runner`])
//! feeds it its seeds and then mutants of them ([`mutate`]), catching panics and hangs and
//! saving the inputs that cause them. `tools/fuzz.sh [seconds-per-target]` runs every target;
//! `cargo test -p kasoku-fuzz` replays every seed and every saved crash.

pub mod mutate;
pub mod runner;
pub mod targets;
