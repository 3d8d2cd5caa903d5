#!/usr/bin/env bash
# kernels/attention.cu emulated on the host (no GPU): the real source (gen.py), its threads as
# fibers (barriers, warp shuffles; tools/matvec_emulate's shims with grids of three
# dimensions run in a chosen block order), shared memory and partial buffers poisoned. Checks
# attn_group and attn_partial against f64 on chains and trees (contexts across chunk edges and
# past 32 * 64 keys, GQA 1/4/6/7/14, head_dim 64/128/256, int8 blocks on/off); attn_group's
# bits the same in any block order, thread schedule, grid and batch, and a tree node's bits
# equal to its path's chain row; the fused q/k/v epilogue equal to qkv_post + attention bit
# for bit; attn_rows (several rows a block) equal to attn_partial bit for bit. Needs python3
# and g++ with C++20 and _Float16 (GCC 12), x86-64.
# Usage: bash tools/attention_emulate/run.sh [quick]   (ok/FAIL lines, exits 1 on a FAIL)
set -euo pipefail
D=$(cd "$(dirname "$0")" && pwd)
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
python3 "$D/gen.py" "$T/k.cpp"
FLAGS="-O2 -std=c++20 -w -ffp-contract=off -fno-strict-aliasing"
grep -qw fma /proc/cpuinfo && FLAGS="$FLAGS -mfma"
g++ $FLAGS -I"$D" -I"$D/../matvec_emulate" "$T/k.cpp" -o "$T/k"
"$T/k" "$@"
