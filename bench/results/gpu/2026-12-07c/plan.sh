#!/usr/bin/env bash
# Second call of 2026-12-07c (.gpu staged by tools/gpu_run.sh and carried): tensor cores for
# the large matrices only (KASOKU_CUDA_MMA_MIN_MB: 64 = the head, 6 = the head, gate, up and
# down) against dp4a everywhere, on the 1.5B Q4_K_M shape: quick benchmarks alternated, two
# rounds; speculative == plain and the sessions under both plans; then ncu: every kernel's
# time of a 16-row pass under the plan of 6, of a 1-row pass with every product on tensor
# cores (mma_1 per matrix, warm, beside diag/'s dp4a), and the detailed sections of four
# mma_1 launches at a decode pass (the 512-token prefill takes the GEMM and its head is
# mma_1's launch 0, so launches 1-4 should be layer 0's q|k|v, o, gate|up and down; the grid
# sizes say which): why one row on tensor cores is slow.
set -u
B=.gpu/kasoku-cuda-check; M=/tmp/m; L=${OUT:-/tmp/out}/plan; mkdir -p $M $L
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name --format=csv,noheader > $L/sysinfo.log 2>&1
$B synth 1.5b q4_k_m $M/q15.gguf > $L/synth.log 2>&1
for round in 1 2; do
  for mb in off 64 6; do
    if [ $mb = off ]; then E=KASOKU_CUDA_X=0; else E=KASOKU_CUDA_MMA_MIN_MB=$mb; fi
    env $E timeout $([ $round$mb = 1off ] && echo 150 || echo 40) $B bench $M/q15.gguf quick > $L/q15_${mb}_$round.log 2>&1
    echo "$mb $round: $(grep -h 'tg128' $L/q15_${mb}_$round.log | cut -c1-36) | $(grep -h 'verify depth 1:' $L/q15_${mb}_$round.log)"
  done
done
for mb in 6 64; do
  KASOKU_CUDA_MMA_MIN_MB=$mb timeout 40 $B spec $M/q15.gguf 96 > $L/spec_$mb.log 2>&1; echo "spec $mb: $(grep -h 'checks,' $L/spec_$mb.log | tail -n 1)"
  KASOKU_CUDA_MMA_MIN_MB=$mb timeout 60 $B session $M/q15.gguf 128 > $L/session_$mb.log 2>&1; echo "session $mb: $(tail -n 1 $L/session_$mb.log)"
done
KASOKU_CUDA_MMA_MIN_MB=6 timeout 45 ncu --cache-control none --clock-control none --graph-profiling node --metrics gpu__time_duration.sum --csv \
   $B pass $M/q15.gguf 512 16 2 > $L/ncu_pass_512_16_mb6.csv 2> $L/ncu.err; echo "ncu rc=$?"
KASOKU_CUDA_MMA=1 timeout 60 ncu --cache-control none --clock-control none --graph-profiling node --metrics gpu__time_duration.sum --csv \
   $B pass $M/q15.gguf 512 1 2 > $L/ncu_pass_512_1_mma.csv 2>> $L/ncu.err; echo "ncu mma 1 row rc=$?"
KASOKU_CUDA_MMA=1 timeout 60 ncu --cache-control none --clock-control none --graph-profiling node -k regex:mma_1 --launch-skip 1 --launch-count 4 \
   --section SpeedOfLight --section WarpStateStats --section Occupancy --section SchedulerStats --section LaunchStats \
   $B pass $M/q15.gguf 512 1 2 > $L/ncu_mma_1_gateup.txt 2>&1; echo "ncu mma_1 sections rc=$?"
gzip $L/*.csv
tar czf ${OUT:-/tmp/out}/plan.tgz -C $L . && rm -rf $L
