#!/bin/sh
# Fuzzes every kasoku input parser for SECONDS per target (default 60), at the lowest CPU
# priority: GGUF, safetensors, config.json, tokenizer.json, chat templates, server request
# bodies. Prints executions, executions per second and findings per target; a finding's input
# is saved under fuzz/crashes/<target>/ (replayed by `cargo test -p kasoku-fuzz` from then on).
# Extra arguments go to kasoku-fuzz (--target NAME, --time-limit-ms N, --seed N).
# Built with the test profile (optimized, overflow checks on, like a debug fuzzing build).
set -e
cd "$(dirname "$0")/.."
seconds="${1:-60}"
[ $# -gt 0 ] && shift
cargo build --profile test -p kasoku-fuzz --bin kasoku-fuzz
exec nice -n 19 target/debug/kasoku-fuzz "$seconds" "$@"
