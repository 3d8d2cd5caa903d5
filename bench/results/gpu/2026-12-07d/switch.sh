#!/usr/bin/env bash
# 2026-12-07d, a call carrying .gpu (binary of the default packed plan): two opt-in switches on
# the 1.5B shape.
set -u
OUT=${OUT:-/tmp/out}
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s]"; }
mkdir -p $OUT/switch
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/switch/sysinfo.log 2>&1
# Two opt-in switches on the 1.5B shape, now that attention and the 16-row gate|up lead a
# 16-row pass: the grouped decode attention (KASOKU_CUDA_ATTN=1) and the packed two-tile
# kernels without their register bound (KASOKU_CUDA_PACKED_WIDE=1; their checks first), quick
# benchmarks against the defaults, two rounds alternated.
B=.gpu/kasoku-cuda-check; M=/tmp/m; mkdir -p $M
$B synth 1.5b q4_k_m $M/q15.gguf > $OUT/switch/synth.log 2>&1
KASOKU_CUDA_PACKED_WIDE=1 timeout 30 $B packed > $OUT/switch/packed_wide.log 2>&1; echo "$(el) packed checks, wide: $(tail -n 1 $OUT/switch/packed_wide.log)"
KASOKU_CUDA_PACKED_WIDE=1 timeout 40 $B spec $M/q15.gguf 96 > $OUT/switch/spec_wide.log 2>&1; echo "$(el) spec, wide: $(tail -n 1 $OUT/switch/spec_wide.log)"
for run in base:1 attn1:1 wide:1 base:2 wide:2 attn1:2; do
  v=${run%:*}; r=${run#*:}
  case $v in base) E=KASOKU_NONE=1;; attn1) E=KASOKU_CUDA_ATTN=1;; wide) E=KASOKU_CUDA_PACKED_WIDE=1;; esac
  env $E timeout 60 $B bench $M/q15.gguf quick > $OUT/switch/q15_${v}_$r.log 2>&1
  echo "$(el) $v $r: $(grep -h 'tg128' $OUT/switch/q15_${v}_$r.log | cut -c1-36) | $(grep -h 'verify depth 1:' $OUT/switch/q15_${v}_$r.log)"
done
tar czf $OUT/switch.tgz -C $OUT switch && rm -rf $OUT/switch
