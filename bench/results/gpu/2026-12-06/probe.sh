#!/bin/bash
# One probe call: the GPU DFlash drafter's checks (tiny fixture; the CLI with it; a random
# drafter of the real shape on the 1.5B shape), the checks the target's taps could break,
# then fuse_probe.sh with whatever time is left.
set -u
G=$(cd "$(dirname "$0")" && pwd); B=$G/kasoku-cuda-check; F=$G/fixtures; K=$G/kasoku
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
OUT=${OUT:-/tmp/out}; mkdir -p $OUT; M=/tmp/m; mkdir -p $M
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
( $B synth 1.5b q4_k_m $M/q15.gguf > $M/synth.log 2>&1; python3 $G/make_rand_dflash.py > /dev/null 2>&1; touch $M/DONE ) &
echo "== dflash tiny"; timeout 90 $B dflash $F/qwen2/tiny/model-f32.gguf $F/qwen2/tiny_dflash 48 > $OUT/dflash_tiny.log 2>&1; echo rc=$?; grep -vE "^ok" $OUT/dflash_tiny.log | tail -12; grep -E "^ok" $OUT/dflash_tiny.log | cut -c1-220 | head -16
m=$F/qwen2/tiny/model-f32.gguf; df=$F/qwen2/tiny_dflash; p="def add(a, b): return a + b. def add(a, b): return"
cpu=$($K run --model $m --raw -m "$p" -n 24 --ignore-eos --spec none --device cpu -q 2>&1)
for kind in dflash auto; do
  a=$(KASOKU_CUDA_DFLASH=1 timeout 30 $K run --model $m --raw -m "$p" -n 24 --ignore-eos --spec $kind --draft $df --device cuda -q 2>&1)
  [ "$a" = "$cpu" ] && echo "ok   cli $kind on the GPU == cpu" || echo "FAIL cli $kind: [$a] vs [$cpu]"
done
KASOKU_CUDA_DFLASH=1 timeout 30 $K run --model $m --raw -m "$p" -n 24 --ignore-eos --spec dflash --draft $df --device cuda 2>&1 >/dev/null | tail -3 | cut -c1-220
echo "== kernels"; timeout 60 $B kernels 2>&1 | grep -E "^FAIL|checks,"
for c in spec session; do echo "== $c tiny"; timeout 30 $B $c $F/llama/tiny/model-f32.gguf 48 2>&1 | grep -E "^FAIL|checks,"; done
echo "== spec qwen35 tiny"; timeout 30 $B spec $F/qwen3_5/tiny/model-f32.gguf 48 2>&1 | grep -E "^FAIL|checks,"
for i in $(seq 60); do [ -f $M/DONE ] && break; sleep 1; done
echo "== dflash q15 random drafter"; timeout 120 $B dflash $M/q15.gguf /tmp/rd/drafter 64 > $OUT/dflash_q15.log 2>&1; echo rc=$?; grep -vE "^ok" $OUT/dflash_q15.log | tail -10; grep -E "^ok" $OUT/dflash_q15.log | cut -c1-220 | head -12
echo "== spec q15"; timeout 40 $B spec $M/q15.gguf 96 2>&1 | grep -E "^FAIL|checks,"
bash $G/fuse_probe.sh
