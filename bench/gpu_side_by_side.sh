#!/usr/bin/env bash
# kasoku and llama.cpp's CUDA build side by side on the GPU machine, in one run, on the same
# random-weight GGUFs of the real shapes (Qwen2.5-Coder 1.5B and 0.5B with llama.cpp's Q4_K_M
# per-tensor types, made there by `kasoku-cuda-check synth`): decode tg128, prefill pp512 and
# the verify curve k = 1..64 after a short context.
#
# llama.cpp is built there from the source kasoku benchmarks on the CPU (the llama-cpp-python
# 0.3.36 sdist that tools/build_llama_cpp.sh fetches; tools/gpu_run.sh packs the parts a CUDA
# build needs into .gpu/llama/llama-src.tar.xz, ~6 MB), in the background while kasoku's
# benchmark runs: ~330 s on the machine's 16 cores. Each step is bounded; the whole run stays
# under the device tool's 600 s.
# Usage (staged by tools/gpu_run.sh): bash .gpu/side_by_side.sh [OUTDIR]
#   CHECKS=1: also the GPU-against-CPU kernel checks, speculative == plain on the 1.5B shape,
#             the transformers fixtures, DeviceSession, DFlash with a random drafter and the
#             CLI checks, while llama.cpp builds;
#   MMA_AB=1: also kasoku on the 1.5B shape with every block-format matrix on the packed
#             tensor-core kernels (KASOKU_CUDA_MMA=1; by default only those of at least 6 MiB,
#             the rest on matvec.cu's dp4a). The checks run with KASOKU_CUDA_MMA=0 (dp4a
#             everywhere) and =1.
set -u
G=$(cd "$(dirname "$0")" && pwd)
B=$G/kasoku-cuda-check
OUT=${1:-${OUT:-/tmp/out}}; mkdir -p "$OUT"
M=/tmp/kasoku-models; mkdir -p $M
LL=/tmp/llama-src; BIN=$LL/build/bin
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
start=$(date +%s)
log() { echo "[$(( $(date +%s) - start )) s] $*" | tee -a "$OUT/side_by_side.log"; }

if [ -f "$G/llama/llama-src.tar.xz" ]; then
  ( mkdir -p $LL && tar xJf "$G/llama/llama-src.tar.xz" -C $LL && cd $LL &&
    cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DGGML_NATIVE=ON -DGGML_CCACHE=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
      -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
      -DLLAMA_CURL=OFF -DGGML_CUDA_NCCL=OFF > "$OUT/llama_configure.log" 2>&1 &&
    timeout 420 cmake --build build -j16 --target llama-bench > "$OUT/llama_build.log" 2>&1
    echo $? > /tmp/llama_built ) &
  log "llama.cpp build started"
else
  log "no .gpu/llama/llama-src.tar.xz: kasoku alone"
fi

MODELS="q15-q4_k_m q05-q4_k_m"
for m in $MODELS; do
  case $m in q15-*) shape=1.5b ;; *) shape=0.5b ;; esac
  [ -f $M/$m.gguf ] || $B synth $shape q4_k_m $M/$m.gguf >> "$OUT/synth.log" 2>&1
done
log "models written"
if [ "${CHECKS:-0}" = 1 ]; then
  for v in 0 1; do
    KASOKU_CUDA_MMA=$v timeout 150 $B kernels > "$OUT/kernels_mma$v.log" 2>&1
    log "kernels (KASOKU_CUDA_MMA=$v): rc=$? $(tail -1 "$OUT/kernels_mma$v.log")"
    grep FAIL "$OUT/kernels_mma$v.log" | cut -c1-200 | head -20
  done
  for v in 0 1; do
    KASOKU_CUDA_MMA=$v timeout 90 $B spec $M/q15-q4_k_m.gguf 96 > "$OUT/spec_mma$v.log" 2>&1
    log "spec == plain (KASOKU_CUDA_MMA=$v): rc=$? $(tail -1 "$OUT/spec_mma$v.log")"
  done
  timeout 60 $B fixtures "$G/fixtures" > "$OUT/fixtures.log" 2>&1; log "fixtures: rc=$? $(tail -1 "$OUT/fixtures.log")"
  timeout 60 $B session $M/q15-q4_k_m.gguf 128 > "$OUT/session.log" 2>&1; log "session: rc=$? $(tail -1 "$OUT/session.log")"
  if [ -f "$G/make_rand_dflash.py" ]; then
    python3 "$G/make_rand_dflash.py" > "$OUT/dflash.log" 2>&1
    timeout 120 $B dflash $M/q15-q4_k_m.gguf /tmp/rd/drafter 64 >> "$OUT/dflash.log" 2>&1
    log "dflash: rc=$? $(tail -1 "$OUT/dflash.log")"
  fi
  if [ -f "$G/cli_checks.sh" ]; then
    timeout 150 bash "$G/cli_checks.sh" "$G" > "$OUT/cli.log" 2>&1; log "cli: rc=$? $(tail -1 "$OUT/cli.log")"
  fi
fi
if [ "${MMA_AB:-0}" = 1 ]; then
  KASOKU_CUDA_MMA=1 timeout 100 $B bench $M/q15-q4_k_m.gguf > "$OUT/kasoku_q15-q4_k_m_mma.log" 2>&1
  log "kasoku q15-q4_k_m on tensor cores: rc=$?"
fi
for m in $MODELS; do
  timeout 100 $B bench $M/$m.gguf > "$OUT/kasoku_$m.log" 2>&1
  log "kasoku $m: rc=$?"
done

if [ -f "$G/llama/llama-src.tar.xz" ]; then
  while [ ! -f /tmp/llama_built ] && [ $(( $(date +%s) - start )) -lt 470 ]; do sleep 2; done
  log "llama.cpp build: rc=$(cat /tmp/llama_built 2>/dev/null || echo 'still running')"
  if [ -x $BIN/llama-bench ]; then
    $BIN/llama-bench --version > "$OUT/llama_version.log" 2>&1
    for m in $MODELS; do
      timeout 40 $BIN/llama-bench -m $M/$m.gguf -ngl 99 -fa 1 -p 512 -n 128 -r 5 -o md > "$OUT/llama_$m.md" 2>&1
      timeout 40 $BIN/llama-bench -m $M/$m.gguf -ngl 99 -fa 1 -p 1,2,4,8,16,32,64 -n 0 -r 10 -o md >> "$OUT/llama_$m.md" 2>&1
      log "llama.cpp $m: rc=$?"
    done
  else
    tail -20 "$OUT/llama_build.log" 2>/dev/null
  fi
fi

echo "=== side by side (same files, same run)"
for m in $MODELS; do
  echo "--- $m: kasoku"
  grep -E "bench |pp512|tg128 \(dependent launch on|verify depth|kernel matvec|in-graph|generate" "$OUT/kasoku_$m.log" | cut -c1-200
  if [ -f "$OUT/llama_$m.md" ]; then
    echo "--- $m: llama.cpp"
    grep -E "^\| .*(pp|tg)[0-9]+ " "$OUT/llama_$m.md" | awk -F'|' '{print $(NF-2), $(NF-1)}'
  fi
done
if [ -f "$OUT/kasoku_q15-q4_k_m_mma.log" ]; then
  echo "--- q15-q4_k_m: kasoku on tensor cores"
  grep -E "bench |pp512|tg128 \(dependent launch on|verify depth|kernel matvec" "$OUT/kasoku_q15-q4_k_m_mma.log" | cut -c1-200
fi
