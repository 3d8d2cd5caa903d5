#!/usr/bin/env bash
# Runs on the GPU machine after .gpu/run.sh (tools/gpu_run.sh stages it as .gpu/switches.sh):
# each opt-in switch of the CUDA backend through the checks that could catch it, then a quick
# benchmark (pp512, tg128, the verify curve) with the switch against the defaults, alternated,
# on the random-weight models run.sh made. A switch is made default only after it passes here
# and gains. Usage: bash .gpu/switches.sh [SECONDS] [checks|bench|all]
set -u
G=$(cd "$(dirname "$0")" && pwd)
B=$G/kasoku-cuda-check
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
L=/tmp/kasoku-switches; mkdir -p "$L"
M=/tmp/kasoku-models; mkdir -p $M
F=$G/fixtures
end=$(( $(date +%s) + ${1:-300} )); WHAT=${2:-all}
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
. "$G/phase.sh"
for spec in "1.5b q4_k_m q15-q4_k_m" "0.5b q4_k_m q05-q4_k_m" "qwen3.5-2b q4_k_m q35-2b-q4_k_m"; do
  set -- $spec; [ -f $M/$3.gguf ] || $B synth $1 $2 $M/$3.gguf >> "$L/synth.log" 2>&1
done
FUSE="KASOKU_CUDA_FUSE_POST=1 KASOKU_CUDA_FUSE_GLU=1 KASOKU_CUDA_FUSE_NORM=1"
ALL="$FUSE KASOKU_CUDA_STREAM=1"   # (the GEMM and top-k selection are on by default)
if [ "$WHAT" != bench ]; then
# Correctness with every switch on at once (the kernels' checks cover the stream layouts,
# the top-k selection and the GEMM; the rest runs whole passes through them).
phase kernels_all 90 $ALL -- $B kernels
phase topk 60 $ALL -- $B topk
phase fixtures_all 60 $ALL -- $B fixtures "$F"
phase spec_tiny_all 60 $ALL -- $B spec "$F/llama/tiny/model-f32.gguf" 48
phase session_tiny_all 60 $ALL -- $B session "$F/llama/tiny/model-f32.gguf" 48
phase spec_qwen35_all 60 $ALL -- $B spec "$F/qwen3_5/tiny/model-f32.gguf" 48
phase session_qwen35_all 60 $ALL -- $B session "$F/qwen3_5/tiny/model-f32.gguf" 48
phase spec_draft_tiny_all 60 $ALL -- $B spec-draft "$F/llama/tiny/model-f32.gguf" "$F/llama/tiny/model-q4_0.gguf" 48
phase spec_q15_all 90 $ALL -- $B spec $M/q15-q4_k_m.gguf 96
phase session_q15_all 90 $ALL -- $B session $M/q15-q4_k_m.gguf 128
phase spec_q35_all 90 $ALL -- $B spec $M/q35-2b-q4_k_m.gguf 96
# Each switch alone on the real shapes, so a failure above names its switch.
for sw in FUSE_POST FUSE_GLU FUSE_NORM STREAM; do
  phase spec_q15_$sw 60 KASOKU_CUDA_$sw=1 -- $B spec $M/q15-q4_k_m.gguf 96
  phase spec_q35_$sw 60 KASOKU_CUDA_$sw=1 -- $B spec $M/q35-2b-q4_k_m.gguf 96
done
fi
if [ "$WHAT" != checks ]; then
# Each switch alone against the defaults, twice, alternated.
for round in 1 2; do
  phase q15_default_$round 60 KASOKU_NONE=1 -- $B bench $M/q15-q4_k_m.gguf quick
  phase q15_fuse_$round 60 $FUSE -- $B bench $M/q15-q4_k_m.gguf quick
  phase q15_stream_$round 60 KASOKU_CUDA_STREAM=1 -- $B bench $M/q15-q4_k_m.gguf quick
  phase q15_matvec_prefill_$round 60 KASOKU_CUDA_GEMM=0 -- $B bench $M/q15-q4_k_m.gguf quick
  phase q15_all_$round 60 $ALL -- $B bench $M/q15-q4_k_m.gguf quick
done
phase q15_mma 60 KASOKU_CUDA_MMA=1 -- $B bench $M/q15-q4_k_m.gguf quick
phase q15_v2 60 KASOKU_CUDA_MATVEC_V2=1 -- $B bench $M/q15-q4_k_m.gguf quick
phase q15_stream_b2_kb96 60 KASOKU_CUDA_STREAM=1 KASOKU_CUDA_STREAM_BLOCKS=2 KASOKU_CUDA_STREAM_KB=96 -- $B bench $M/q15-q4_k_m.gguf quick
phase q15_stream_b8_kb24 60 KASOKU_CUDA_STREAM=1 KASOKU_CUDA_STREAM_BLOCKS=8 KASOKU_CUDA_STREAM_KB=24 -- $B bench $M/q15-q4_k_m.gguf quick
phase q15_trigger_first 60 KASOKU_CUDA_TRIGGER_FIRST=1 -- $B bench $M/q15-q4_k_m.gguf quick
phase q15_own_prefetch 60 KASOKU_CUDA_OWN_PREFETCH=1 -- $B bench $M/q15-q4_k_m.gguf quick
phase q05_default 60 KASOKU_NONE=1 -- $B bench $M/q05-q4_k_m.gguf quick
phase q05_all 60 $ALL -- $B bench $M/q05-q4_k_m.gguf quick
phase q35_default 90 KASOKU_NONE=1 -- $B bench $M/q35-2b-q4_k_m.gguf quick
phase q35_all 90 $ALL -- $B bench $M/q35-2b-q4_k_m.gguf quick
phase draft_q15_all 150 $ALL -- $B bench-draft $M/q15-q4_k_m.gguf $M/q05-q4_k_m.gguf
fi
tar czf "$OUT/switches.tgz" -C "$L" .
echo "=== switches"
for f in "$L"/*.log; do
  n=$(basename "$f" .log)
  case $n in progress|synth) continue;; esac
  grep -h -E "checks,|^FAIL|pp512|tg128|verify depth|generate 256" "$f" | sed "s/^/$n: /" | cut -c1-200
done
