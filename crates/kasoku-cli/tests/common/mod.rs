//! Helpers shared by the CLI's integration tests.

use std::path::PathBuf;

/// `tests/fixtures/<rel>` at the repository root, as a command-line argument.
pub fn fixture(rel: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(rel)
        .display()
        .to_string()
}
