#!/usr/bin/env bash
# 2026-12-07d, first call (.gpu staged by tools/gpu_run.sh and carried): the packed tensor-core
# products (kernels/mma_packed.cu) on an H100/H200. Their checks against mma.cu (bit for bit)
# and f64; then quick benchmarks of the 1.5B Q4_K_M shape, alternated over two rounds:
#   off  dp4a everywhere (the default)
#   P6   KASOKU_CUDA_MMA_MIN_MB=6 + KASOKU_CUDA_MMA_PACKED=1: gate, up, down and the head on
#        the packed kernels, the rest on dp4a
#   PA   KASOKU_CUDA_MMA=1 + KASOKU_CUDA_MMA_PACKED=1: every matrix on the packed kernels
# and once U6 (the plan of 6 MiB on mma.cu's GGUF reads), for comparison; speculative == plain
# and the sessions under P6 and PA; ncu's duration of every kernel of a 1-row and a 16-row
# pass under PA (sum them with ../2026-12-07c/kernels_by_time.py).
set -u
B=.gpu/kasoku-cuda-check; M=/tmp/m; L=${OUT:-/tmp/out}/packed; mkdir -p $M $L
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $L/sysinfo.log 2>&1
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s]"; }
timeout 90 $B packed > $L/checks.log 2>&1; echo "$(el) packed checks rc=$?: $(grep -h 'compiled\|checks,' $L/checks.log | tr '\n' ' ')"
$B synth 1.5b q4_k_m $M/q15.gguf > $L/synth.log 2>&1; echo "$(el) synth rc=$?"
env_of() { case $1 in
  off) echo KASOKU_CUDA_X=0 ;;
  P6) echo KASOKU_CUDA_MMA_MIN_MB=6 KASOKU_CUDA_MMA_PACKED=1 ;;
  PA) echo KASOKU_CUDA_MMA=1 KASOKU_CUDA_MMA_PACKED=1 ;;
  U6) echo KASOKU_CUDA_MMA_MIN_MB=6 ;;
esac; }
for run in off:1 P6:1 PA:1 off:2 P6:2 PA:2 U6:1; do
  v=${run%:*}; r=${run#*:}
  env $(env_of $v) timeout 60 $B bench $M/q15.gguf quick > $L/q15_${v}_$r.log 2>&1
  echo "$(el) $v $r: $(grep -h 'tg128' $L/q15_${v}_$r.log | cut -c1-36) | $(grep -h 'verify depth 1:' $L/q15_${v}_$r.log)"
done
for v in P6 PA; do
  env $(env_of $v) timeout 45 $B spec $M/q15.gguf 96 > $L/spec_$v.log 2>&1; echo "$(el) spec $v: $(grep -h 'checks,' $L/spec_$v.log | tail -n 1)"
  env $(env_of $v) timeout 60 $B session $M/q15.gguf 128 > $L/session_$v.log 2>&1; echo "$(el) session $v: $(tail -n 1 $L/session_$v.log)"
done
for rows in 1 16; do
  env $(env_of PA) timeout 60 ncu --cache-control none --clock-control none --graph-profiling node --metrics gpu__time_duration.sum --csv \
     $B pass $M/q15.gguf 512 $rows 2 > $L/ncu_pass_512_${rows}_PA.csv 2> $L/ncu_$rows.err
  echo "$(el) ncu $rows rc=$? $(wc -l < $L/ncu_pass_512_${rows}_PA.csv) lines"
done
gzip $L/*.csv
tar czf ${OUT:-/tmp/out}/packed.tgz -C $L . && rm -rf $L
