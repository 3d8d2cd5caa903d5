#!/usr/bin/env bash
# First call of 2026-12-07c (.gpu staged by tools/gpu_run.sh and carried): the unrun commits'
# checks (1b16a78's in-place commit: speculative == plain and the sessions on the 1.5B shape),
# where a 1-row and a 16-row pass's time goes kernel by kernel (ncu with caches and clocks left
# alone, so each kernel's duration is close to its time inside the graph), then blocks.sh.
set -u
B=.gpu/kasoku-cuda-check; M=/tmp/m; L=${OUT:-/tmp/out}/diag; mkdir -p $M $L
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $L/sysinfo.log 2>&1
$B synth 1.5b q4_k_m $M/q15.gguf > $L/synth.log 2>&1
timeout 60 $B spec $M/q15.gguf 96 > $L/spec_q15.log 2>&1; echo "spec: $(tail -n 1 $L/spec_q15.log)"
timeout 60 $B session $M/q15.gguf 128 > $L/session_q15.log 2>&1; echo "session: $(tail -n 1 $L/session_q15.log)"
timeout 40 $B bench $M/q15.gguf quick > $L/quick.log 2>&1; grep -h "tg128\|verify depth 1:" $L/quick.log
for rows in 1 16; do
  timeout 100 ncu --cache-control none --clock-control none --graph-profiling node --metrics gpu__time_duration.sum --csv \
     $B pass $M/q15.gguf 512 $rows 3 > $L/ncu_pass_512_$rows.csv 2> $L/ncu_pass_512_$rows.err
  echo "ncu $rows: rc=$? $(wc -l < $L/ncu_pass_512_$rows.csv) lines"
done
gzip $L/*.csv
tar czf ${OUT:-/tmp/out}/diag.tgz -C $L . && rm -rf $L
bash bench/results/gpu/2026-12-07c/../2026-12-07b/blocks.sh
