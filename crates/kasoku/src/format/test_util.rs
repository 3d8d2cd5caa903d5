//! Test helpers shared by the format and tokenizer tests: scratch directories and the cached
//! real models (fetched when absent, as CI needs them; skipped only with `KASOKU_OFFLINE=1`).

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A fresh, empty directory under the system temp dir, removed when dropped.
pub struct ScratchDir(pub PathBuf);

impl ScratchDir {
    pub fn new(tag: &str) -> ScratchDir {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("kasoku-test-{}-{tag}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create scratch dir");
        ScratchDir(dir)
    }

    pub fn path(&self) -> &std::path::Path {
        &self.0
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The path of a real model file, fetched into the cache (`$KASOKU_MODELS`, else
/// `~/.cache/kasoku/models`) by kasoku's own pinned, hashed fetcher when absent. With
/// `KASOKU_OFFLINE=1` a missing model skips the test instead (`None`, with a note).
pub fn cached_model(file: &str) -> Option<PathBuf> {
    let known = kasoku_fetch::KNOWN_MODELS
        .iter()
        .find(|m| m.file == file)
        .unwrap_or_else(|| panic!("{file} is not a known model"));
    kasoku_fetch::ensure_for_test(known.name)
}

pub const SMOLLM2: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
pub const QWEN25_05B: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";
