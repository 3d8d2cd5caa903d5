#!/usr/bin/env bash
# kernels/gemm.cu emulated on the host (no GPU): the real kernel source, with its PTX wrappers
# (cp.async, ldmatrix, mma.sync) replaced by emulations written from the PTX ISA's fragment
# layouts (emu_ptx.h), runs the f16 expansion of every format and the tiled products (both
# tiles, K split or not, partial tiles, three segments with bias, residual and strides)
# against f64 products. Catches indexing mistakes before a GPU is at hand; the GPU's own check
# is `kasoku-cuda-check kernels`. Needs python3 and g++ with C++20 and _Float16 (GCC 12).
# Usage: bash tools/gemm_emulate/run.sh   (about 30 s; prints ok/FAIL lines, exits 1 on a FAIL)
set -euo pipefail
D=$(cd "$(dirname "$0")" && pwd)
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
python3 "$D/gen.py" "$T/k.cpp"
g++ -O2 -std=c++20 -w -pthread -I"$D" "$T/k.cpp" -o "$T/k"
"$T/k"
