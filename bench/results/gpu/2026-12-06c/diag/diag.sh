#!/usr/bin/env bash
# The diagnostic call of 2026-12-06c (run from the repository root with .gpu staged by
# tools/gpu_run.sh): where a decode step's and attention's time goes, with ncu.
set -u
B=.gpu/kasoku-cuda-check
mkdir -p $OUT/logs /tmp/m
L=$OUT/logs
( nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv; which ncu; ncu --version ) > $L/sysinfo.log 2>&1
$B synth 1.5b q4_k_m /tmp/m/q15.gguf > $L/synth.log 2>&1
timeout 120 $B attn /tmp/m/q15.gguf > $L/attn.log 2>&1
# Every kernel of a 1-row and a 16-row pass after 512, and a 1-row pass after 4,000 (ncu's
# duration; each kernel apart, caches flushed).
for spec in "512 1" "512 16" "4000 1"; do
  set -- $spec
  timeout 90 ncu --clock-control none --graph-profiling node --metrics gpu__time_duration.sum --csv \
     $B pass /tmp/m/q15.gguf $1 $2 2 > $L/ncu_pass_$1_$2.csv 2> $L/ncu_pass_$1_$2.err
done
# Attention's stall reasons after 512 and 4,000 tokens.
for d in 512 4000; do
  timeout 60 ncu --clock-control none --graph-profiling node -k regex:attn_partial --launch-skip 30 --launch-count 1 \
     --section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy --section SchedulerStats \
     $B pass /tmp/m/q15.gguf $d 1 2 > $L/ncu_attn_$d.txt 2>&1
done
timeout 200 $B bench /tmp/m/q15.gguf > $L/bench_full.log 2>&1
tar czf $OUT/logs.tgz -C $OUT logs && rm -rf $L
