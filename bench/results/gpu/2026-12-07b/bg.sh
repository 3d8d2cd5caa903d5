#!/usr/bin/env bash
# The background half of the 2026-12-07b device session, started from the repository root
# (.gpu staged by tools/gpu_run.sh) while the real target's pieces were being carried: every
# default check and the full benchmark (session.sh 1), the CLI checks (among them a DFlash
# drafter stored in kasoku's L format, dequantized as the GPU loads it), and where the
# tensor-core products' time goes at 1 and 16 rows (ncu), beside the dp4a products at 16.
set -u
R=${R:-/root/bg}; L=$R/logs; mkdir -p $L
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
B=.gpu/kasoku-cuda-check
OUT=$R bash .gpu/session.sh 1 300 > $L/session1.out 2>&1
timeout 150 bash .gpu/cli_checks.sh "$PWD/.gpu" > $L/cli.log 2>&1
for n in 1 16; do
  timeout 90 env KASOKU_CUDA_MMA=1 ncu --clock-control none --graph-profiling node \
    --metrics gpu__time_duration.sum --csv $B pass /tmp/m/q15.gguf 64 $n 2 \
    > $L/ncu_mma_pass_$n.csv 2> $L/ncu_mma_pass_$n.err
  timeout 90 env KASOKU_CUDA_MMA=1 ncu --clock-control none --graph-profiling node -k regex:mma_ \
    --launch-skip 60 --launch-count 3 --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section WarpStateStats --section LaunchStats --section Occupancy --section SchedulerStats \
    $B pass /tmp/m/q15.gguf 64 $n 2 > $L/ncu_mma_$n.txt 2>&1
done
timeout 90 ncu --clock-control none --graph-profiling node -k regex:matvec --launch-skip 60 \
  --launch-count 3 --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
  --section SchedulerStats $B pass /tmp/m/q15.gguf 64 16 2 > $L/ncu_dp4a_16.txt 2>&1
gzip -f $L/*.csv
tar czf $R/bg.tgz -C $L .
echo done > $R/DONE
