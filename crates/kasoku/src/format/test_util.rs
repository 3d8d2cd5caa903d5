//! Test helpers shared by the format and tokenizer tests: scratch directories and the cached
//! real models (tests that need a model skip, with a note, when it is not in the cache).

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

/// The path of a cached model file (`$KASOKU_MODELS`, else `~/.cache/kasoku/models`), or `None`
/// with a note on stderr when it is absent (fetch it with `shared/models/fetch.sh`).
pub fn cached_model(file: &str) -> Option<PathBuf> {
    let dir = match std::env::var_os("KASOKU_MODELS") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(std::env::var_os("HOME")?).join(".cache/kasoku/models"),
    };
    let path = dir.join(file);
    if path.is_file() {
        Some(path)
    } else {
        eprintln!(
            "note: {} not cached; skipping this real-model test",
            path.display()
        );
        None
    }
}

pub const SMOLLM2: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
pub const QWEN25_05B: &str = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";
