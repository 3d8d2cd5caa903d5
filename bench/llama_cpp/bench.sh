#!/usr/bin/env bash
# llama.cpp side-by-side numbers for one GGUF on this machine (the peer kasoku is compared with).
# Needs tools/build_llama_cpp.sh to have run. Not used by CI.
#
#   bench/llama_cpp/bench.sh MODEL.gguf [THREADS...]       (default threads: 1 2)
#
# Prints llama-bench markdown for:
#   decode   tg64 (64 generated tokens after an empty context), per thread count
#   prefill  pp64
#   verify   batches of k = 1 2 4 8 16 tokens (pp k), the cost curve for speculative verification
# and writes the raw llama-bench JSON to ${BENCH_OUT:-$KASOKU_CACHE/bench}/<model>-<date>.json
# (outside the repo; copy numbers worth keeping into a committed note by hand).
set -euo pipefail
model=${1:?usage: bench.sh MODEL.gguf [THREADS...]}
shift
threads=${*:-1 2}
cache=${KASOKU_CACHE:-$HOME/.cache/kasoku}
bin=$cache/llama.cpp/sdist/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin
[ -x "$bin/llama-bench" ] || { echo "no llama-bench; run tools/build_llama_cpp.sh" >&2; exit 1; }
outdir=${BENCH_OUT:-$cache/bench}
mkdir -p "$outdir"
out=$outdir/$(basename "$model" .gguf)-$(date -u +%Y%m%dT%H%M%SZ).json
t=$(echo "$threads" | tr ' ' ',')

echo "# llama.cpp $(sed -n 's/^llama.cpp commit=//p' "$cache/llama.cpp/VERSION" 2>/dev/null) on $(basename "$model")"
echo "## decode + prefill"
"$bin/llama-bench" -m "$model" -t "$t" -p 64 -n 64 -r 3 -o md
echo "## verify batch cost (pp k)"
"$bin/llama-bench" -m "$model" -t "$t" -p 1,2,4,8,16 -n 0 -r 3 -o md
"$bin/llama-bench" -m "$model" -t "$t" -p 1,2,4,8,16,64 -n 64 -r 3 -o json >"$out"
echo "raw: $out"
