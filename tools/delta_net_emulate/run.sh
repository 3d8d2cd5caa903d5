#!/usr/bin/env bash
# kernels/delta_net.cu (Qwen3.5's Gated DeltaNet) emulated on the host (no GPU): the real kernel
# source, each emulated block one std::thread per CUDA thread with warp shuffles and barriers
# emulated (pre.h), runs chains and trees through the conv, the recurrence, the output norm and
# the commit, against a reference written from shared/research/qwen35.md §5 in f64, and checks
# the batch invariance that speculative decoding needs bit for bit: a chain split anywhere, a
# tree node against decoding its path, a committed path against decoding it. Catches indexing
# mistakes before a GPU is at hand; the GPU's own check is `kasoku-cuda-check kernels`.
# Needs python3 and g++ with C++20.
# Usage: bash tools/delta_net_emulate/run.sh   (seconds; ok/FAIL lines, exits 1 on a FAIL)
set -euo pipefail
D=$(cd "$(dirname "$0")" && pwd)
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
python3 "$D/gen.py" "$T/k.cpp"
g++ -O2 -std=c++20 -w -pthread -I"$D" "$T/k.cpp" -o "$T/k"
"$T/k"
