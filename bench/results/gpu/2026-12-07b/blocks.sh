#!/usr/bin/env bash
# The last call of 2026-12-07b (.gpu staged by tools/gpu_run.sh): the 2- and 4-row products
# compiled to fit 5 blocks a multiprocessor (KASOKU_CUDA_MATVEC_BLOCKS=5; 6 in the benchmarks
# too) against the default, on the 1.5B Q4_K_M shape: the kernel checks and speculative ==
# plain under 5, then quick benchmarks alternated, two rounds; and the opt-in tensor-core
# products with their sub-block loops unrolled (the default) and rolled
# (KASOKU_CUDA_MMA_ROLLED=1: fewer spills, serialized activation loads).
set -u
B=.gpu/kasoku-cuda-check; M=/tmp/m; L=${OUT:-/tmp/out}/blocks; mkdir -p $M $L
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name --format=csv,noheader > $L/sysinfo.log 2>&1
$B synth 1.5b q4_k_m $M/q15.gguf > $L/synth.log 2>&1
KASOKU_CUDA_MATVEC_BLOCKS=5 timeout 100 $B kernels > $L/kernels_b5.log 2>&1; tail -n 1 $L/kernels_b5.log
KASOKU_CUDA_MATVEC_BLOCKS=5 timeout 40 $B spec $M/q15.gguf 96 > $L/spec_b5.log 2>&1; tail -n 1 $L/spec_b5.log
for round in 1 2; do
  for b in default 5 6; do
    KASOKU_CUDA_MATVEC_BLOCKS=$b timeout 40 $B bench $M/q15.gguf quick > $L/q15_${b}_$round.log 2>&1
    echo "$b $round: $(grep -h 'tg128' $L/q15_${b}_$round.log | cut -c1-40) | $(grep -h 'verify depth 1:' $L/q15_${b}_$round.log)"
  done
done
KASOKU_CUDA_MMA=1 KASOKU_CUDA_MMA_ROLLED=1 timeout 100 $B kernels > $L/kernels_mma_rolled.log 2>&1
tail -n 1 $L/kernels_mma_rolled.log
for round in 1 2; do
  for r in 0 1; do
    KASOKU_CUDA_MMA=1 KASOKU_CUDA_MMA_ROLLED=$r timeout 40 $B bench $M/q15.gguf quick > $L/q15_mma_rolled${r}_$round.log 2>&1
    echo "mma rolled=$r $round: $(grep -h 'tg128' $L/q15_mma_rolled${r}_$round.log | cut -c1-40) | $(grep -h 'verify depth 1:' $L/q15_mma_rolled${r}_$round.log)"
  done
done
tar czf ${OUT:-/tmp/out}/blocks.tgz -C $L .
