//! Shared helpers for integration tests: fixture paths and real models.

#![allow(dead_code)]

use std::path::PathBuf;

/// `tests/fixtures/<rel>` at the repository root.
pub fn fixture(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(rel)
}

/// A real model by its known name, fetched into the cache if absent (pinned, hashed).
/// With `KASOKU_OFFLINE=1` a missing model skips the test instead (returns `None`).
pub fn real_model(name: &str) -> Option<PathBuf> {
    kasoku_fetch::ensure_for_test(name)
}
