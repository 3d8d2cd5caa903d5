//! The `kasoku` command-line tool.
fn main() {}
