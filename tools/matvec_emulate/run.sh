#!/usr/bin/env bash
# kernels/matvec.cu emulated on the host (no GPU): the real source, its threads as fibers
# (barriers, warp shuffles through per-warp tables), its PTX (griddepcontrol, prefetch,
# mbarrier, cp.async.bulk) replaced by emulations written from the PTX ISA (emu_ptx.h), built
# twice: without KASOKU_MATVEC_STREAM (the plain kernel) and with it (the streamed kernel,
# persistent grids of 2..6 blocks, 2..8 stages, bulk copies landing at once or late). Checks
# every format at widths giving split 1/2/4, 1..3 segments, n = 1, 2, 3, 8, 9, 10, 12 (in 4-row
# tiles, the default, and again in the 8-row kernel), bias and
# residual, against f64; streamed == plain bit for bit; the fused SwiGLU, RMSNorm and argmax
# tails against the separate computations. Needs python3 and g++ with C++20 and _Float16
# (GCC 12), x86-64 (the fiber switch is a few lines of x86-64 assembly).
# Usage: bash tools/matvec_emulate/run.sh [quick]   (prints ok/FAIL lines, exits 1 on a FAIL)
# EMU_DEFINES="-DKASOKU_MATVEC_V2" adds defines to both builds (e.g. the v2 Q4_K/Q5_K loads;
# -DKASOKU_MATVEC_TAIL_TILES: a last partial tile of rows as the smallest tile that holds it).
set -euo pipefail
D=$(cd "$(dirname "$0")" && pwd)
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
python3 "$D/gen.py" "$T/k.cpp"
FLAGS="-O2 -std=c++20 -w -ffp-contract=off -fno-strict-aliasing ${EMU_DEFINES:-}"
grep -qw fma /proc/cpuinfo && FLAGS="$FLAGS -mfma"  # fmaf inline (still no contraction)
g++ $FLAGS -I"$D" "$T/k.cpp" -o "$T/plain" &
g++ $FLAGS -DKASOKU_MATVEC_STREAM -I"$D" "$T/k.cpp" -o "$T/stream" &
wait %1 && wait %2
rc=0
"$T/plain" "$@" || rc=1
EMU_MAX_TILE=8 "$T/plain" "$@" || rc=1
"$T/stream" "$@" || rc=1
[ $rc = 0 ] && echo "matvec_emulate: all passed" || echo "matvec_emulate: FAILURES"
exit $rc
