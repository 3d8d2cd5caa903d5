#!/usr/bin/env bash
# kernels/mma.cu (the tensor-core decode products) emulated on the host (no GPU): the real
# source, its threads as fibers (matvec_emulate's pre.h: barriers, warp collectives), its PTX
# (mma.sync m16n8k32 / m16n8k16 .s8 fragments, cp.async groups) replaced by emulations written
# from the PTX ISA (emu_mma.h). Checks every block format against f64 at n = 1, 2, 3, 8, 9, 16,
# 17 (and 32..65: the larger tiles and a second pass), batch invariance (every n, and a row
# alone), bias/residual, 1..3 segments, the fused argmax, and that the ring (1..4 stages,
# copies landing at once or late, fiber order) changes no bit. Needs python3 and g++ with
# C++20 and _Float16 (GCC 12), x86-64 (the fibers).
# Usage: bash tools/mma_emulate/run.sh [quick]   (prints ok/FAIL lines, exits 1 on a FAIL)
set -euo pipefail
D=$(cd "$(dirname "$0")" && pwd)
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
python3 "$D/gen.py" "$T/k.cpp"
FLAGS="-O2 -std=c++20 -w -ffp-contract=off -fno-strict-aliasing"
grep -qw fma /proc/cpuinfo && FLAGS="$FLAGS -mfma"  # fmaf inline (still no contraction)
g++ $FLAGS -I"$D" -I"$D/../matvec_emulate" "$T/k.cpp" -o "$T/mma"
if "$T/mma" "$@"; then echo "mma_emulate: all passed"; else echo "mma_emulate: FAILURES"; exit 1; fi
