#!/bin/bash
# One probe call: the fused kernels' correctness after the FUSE_GLU fix, each fusion's decode
# speed against the defaults (alternated), and the full bench's breakdown on the 1.5B shape.
set -u
G=$(cd "$(dirname "$0")" && pwd); B=$G/kasoku-cuda-check
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; M=/tmp/m; mkdir -p $M
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
[ -f $M/q15.gguf ] || $B synth 1.5b q4_k_m $M/q15.gguf | tail -1
$B synth qwen3.5-2b q4_k_m $M/q35.gguf | tail -1
F3="KASOKU_CUDA_FUSE_POST=1 KASOKU_CUDA_FUSE_GLU=1 KASOKU_CUDA_FUSE_NORM=1"
for sw in FUSE_GLU FUSE_POST FUSE_NORM; do
  echo "== spec q15 $sw"; env KASOKU_CUDA_$sw=1 timeout 60 $B spec $M/q15.gguf 96 > $OUT/spec_q15_$sw.log 2>&1; grep -E "^FAIL|checks," $OUT/spec_q15_$sw.log
done
echo "== spec q35 FUSE_GLU"; KASOKU_CUDA_FUSE_GLU=1 timeout 60 $B spec $M/q35.gguf 96 2>&1 | grep -E "^FAIL|checks,"
echo "== spec q15 all three"; env $F3 timeout 60 $B spec $M/q15.gguf 96 2>&1 | grep -E "^FAIL|checks,"
echo "== session q15 all three"; env $F3 timeout 60 $B session $M/q15.gguf 128 2>&1 | grep -E "^FAIL|checks,"
for r in 1; do
  for s in "KASOKU_NONE=1" "KASOKU_CUDA_FUSE_GLU=1" "KASOKU_CUDA_FUSE_POST=1" "KASOKU_CUDA_FUSE_NORM=1" "$F3"; do
    echo "== bench $r $s"; env $s timeout 60 $B bench $M/q15.gguf quick 2>&1 | grep -E "pp512|tg128|verify"
  done
done
echo "== full bench"; timeout 100 $B bench $M/q15.gguf > $OUT/bench_full.log 2>&1; grep -E "gemm|in-graph|tg|pp512|verify" $OUT/bench_full.log
