#!/usr/bin/env bash
# Builds kasoku-cuda-check (release) on this CPU machine and stages it, the fixtures and the
# GPU-side script into the main checkout's .gpu/ folder (ignored by git), which the device
# tool carries to the GPU machine. Then call the device tool with carry [".gpu"] and
#   bash .gpu/run.sh 420
# or, for kasoku beside llama.cpp's CUDA build on the same files, `bash .gpu/side_by_side.sh`.
# Results come back under $OUT (progress.log, one log per phase). Run tools/nvrtc_check.sh
# first: the GPU machine should never see a kernel that does not compile.
set -euo pipefail
cd "$(dirname "$0")/.."
STAGE=${STAGE:-/work/main/.gpu}
cargo build --release -p kasoku-cuda --bin kasoku-cuda-check
cargo build --release -p kasoku-cli
mkdir -p "$STAGE/fixtures"
cp target/release/kasoku-cuda-check target/release/kasoku "$STAGE/"
strip "$STAGE/kasoku-cuda-check" "$STAGE/kasoku" 2>/dev/null || true
# The kernels compiled here for sm_90 (the H100 and H200), where tools/nvrtc_check.sh fetched
# NVRTC: both binaries read cuda-cache/ beside them, so a GPU machine does not spend 50-75 s of
# its first command compiling them (switches that change the compile options still do).
NVRTC_LIB=.nvrtc/unpacked/nvidia/cu13/lib/libnvrtc.so.13
rm -rf "$STAGE/cuda-cache"
if [ -f "$NVRTC_LIB" ]; then
  KASOKU_NVRTC=$NVRTC_LIB KASOKU_CUDA_CACHE="$STAGE/cuda-cache" "$STAGE/kasoku-cuda-check" compile sm_90
fi
cp tools/gpu_device.sh "$STAGE/run.sh"
cp tools/gpu_cli_checks.sh "$STAGE/cli_checks.sh"
cp tools/gpu_switches.sh "$STAGE/switches.sh"
cp tools/gpu_session.sh "$STAGE/session.sh"
cp tools/gpu_phase.sh "$STAGE/phase.sh"
cp bench/results/gpu/2026-12-06/make_rand_dflash.py "$STAGE/"
cp bench/gpu_bench.sh "$STAGE/bench.sh"
cp bench/gpu_side_by_side.sh "$STAGE/side_by_side.sh"
# llama.cpp's source for its CUDA build beside kasoku (bench/gpu_side_by_side.sh): the parts
# a CUDA build of llama-bench needs, from the sdist tools/build_llama_cpp.sh fetched.
LLAMA_SRC=${KASOKU_CACHE:-$HOME/.cache/kasoku}/llama.cpp/src
if [ -d "$LLAMA_SRC" ] && [ ! -f "$STAGE/llama/llama-src.tar.xz" ]; then
  mkdir -p "$STAGE/llama"
  tar cJf "$STAGE/llama/llama-src.tar.xz" -C "$LLAMA_SRC" \
    --exclude='ggml/src/ggml-vulkan' --exclude='ggml/src/ggml-sycl' --exclude='ggml/src/ggml-opencl' \
    --exclude='ggml/src/ggml-metal' --exclude='ggml/src/ggml-hexagon' --exclude='ggml/src/ggml-et' \
    --exclude='tools/server/public*' --exclude='*.png' \
    CMakeLists.txt cmake common ggml include src tools vendor LICENSE
fi
for f in llama/tiny llama/tiny_rope_llama3 qwen2/tiny qwen3/tiny qwen3_5/tiny; do
  mkdir -p "$STAGE/fixtures/$f"
  cp tests/fixtures/$f/reference.json tests/fixtures/$f/*.gguf "$STAGE/fixtures/$f/"
done
# The DFlash drafter fixture (a checkpoint directory) for `kasoku-cuda-check dflash`.
mkdir -p "$STAGE/fixtures/qwen2/tiny_dflash"
cp tests/fixtures/qwen2/tiny_dflash/config.json tests/fixtures/qwen2/tiny_dflash/model.safetensors \
  "$STAGE/fixtures/qwen2/tiny_dflash/"
du -sh "$STAGE"
