#!/usr/bin/env bash
# Compiles kasoku's CUDA kernels with NVRTC on a machine without a GPU (no driver needed):
# fetches the NVRTC wheel that matches the GPU machines' CUDA 13.0 into .nvrtc/ (ignored by
# git) once, then runs kasoku-cuda's compile test against it, for sm_90 and sm_80.
# Run it before every GPU run, so the GPU machine never sees a kernel that does not compile.
set -euo pipefail
cd "$(dirname "$0")/.."
lib=.nvrtc/unpacked/nvidia/cu13/lib/libnvrtc.so.13
if [ ! -f "$lib" ]; then
  mkdir -p .nvrtc
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .nvrtc nvidia-cuda-nvrtc==13.0.88
  unzip -o -q .nvrtc/nvidia_cuda_nvrtc-13.0.88-*.whl -d .nvrtc/unpacked
fi
KASOKU_NVRTC="$PWD/$lib" cargo test -p kasoku-cuda --lib kernels::tests::kernels_compile_with_nvrtc -- --nocapture
