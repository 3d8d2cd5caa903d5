#!/usr/bin/env bash
# Runs on the GPU machine (tools/gpu_run.sh stages it as .gpu/session.sh): one session's checks
# and A/B timings of the CUDA backend's switches in two bounded calls, so that a machine lent
# for a few minutes answers the questions that matter first. Logs come back as one archive.
#   bash .gpu/session.sh 1 [SECONDS]   correctness with the defaults (kernels, speculative ==
#                                      plain, sessions), attention alone by context length,
#                                      the full benchmark, the grouped attention's quick one,
#                                      attn_rows' checks and timings (KASOKU_CUDA_ATTN_ROWS),
#                                      DFlash on the 1.5B shape
#   bash .gpu/session.sh 3 [SECONDS]   each opt-in switch of the decode step against the
#                                      defaults (quick benchmarks, three rounds alternated)
#   bash .gpu/session.sh 2 [SECONDS]   the checks with dp4a everywhere (KASOKU_CUDA_MMA=0: the
#                                      opt-in fused products too), the CLI checks, the full
#                                      benchmark with and without the tensor-core plan
#   bash .gpu/session.sh 4 [SECONDS]   checks and quick benchmarks of a switch under test
#                                      (SWITCH=NAME=VALUE) against the defaults, three rounds
#                                      alternated
set -u
G=$(cd "$(dirname "$0")" && pwd); B=$G/kasoku-cuda-check; F=$G/fixtures
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
OUT=${OUT:-/tmp/out}; L=/tmp/kasoku-session; M=/tmp/m; mkdir -p "$OUT" "$L" "$M"
PART=${1:-1}; end=$(( $(date +%s) + ${2:-420} ))
. "$G/phase.sh"
wait_models() { for _ in $(seq 120); do [ -f $M/DONE ] && return; sleep 1; done; }
sysinfo() { nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$L/sysinfo.log" 2>&1; }
synth_q15() { $B synth 1.5b q4_k_m $M/q15.gguf > $M/synth.log 2>&1; }
if [ "$PART" = 1 ]; then
  sysinfo
  ( synth_q15
    python3 "$G/make_rand_dflash.py" >> $M/synth.log 2>&1; touch $M/DONE ) &
  phase kernels 150 -- $B kernels
  phase spec_tiny 40 -- $B spec "$F/llama/tiny/model-f32.gguf" 48
  phase session_tiny 40 -- $B session "$F/llama/tiny/model-f32.gguf" 48
  phase spec_qwen35_tiny 40 -- $B spec "$F/qwen3_5/tiny/model-f32.gguf" 48
  phase dflash_tiny 60 -- $B dflash "$F/qwen2/tiny/model-f32.gguf" "$F/qwen2/tiny_dflash" 48
  wait_models
  phase spec_q15 60 -- $B spec $M/q15.gguf 96
  phase session_q15 60 -- $B session $M/q15.gguf 128
  phase attn 90 -- $B attn $M/q15.gguf
  phase bench_full 200 -- $B bench $M/q15.gguf
  phase q15_attn1 60 KASOKU_CUDA_ATTN=1 -- $B bench $M/q15.gguf quick
  # attn_rows (several rows a block in passes of several rows; opt-in until measured):
  # its bits against attn_partial's through the checks, then its cost.
  phase kernels_rows4 150 KASOKU_CUDA_ATTN_ROWS=4 -- $B kernels
  phase spec_q15_rows4 60 KASOKU_CUDA_ATTN_ROWS=4 -- $B spec $M/q15.gguf 96
  phase session_q15_rows4 60 KASOKU_CUDA_ATTN_ROWS=4 -- $B session $M/q15.gguf 128
  phase attn_rows4 90 KASOKU_CUDA_ATTN_ROWS=4 -- $B attn $M/q15.gguf
  phase attn_rows16 90 KASOKU_CUDA_ATTN_ROWS=16 -- $B attn $M/q15.gguf
  phase q15_default 60 KASOKU_NONE=1 -- $B bench $M/q15.gguf quick
  phase q15_rows4 60 KASOKU_CUDA_ATTN_ROWS=4 -- $B bench $M/q15.gguf quick
  phase q15_rows16 60 KASOKU_CUDA_ATTN_ROWS=16 -- $B bench $M/q15.gguf quick
  phase dflash_q15 120 -- $B dflash $M/q15.gguf /tmp/rd/drafter 64
elif [ "$PART" = 3 ]; then
  # Each opt-in switch of the decode step against the defaults: quick benchmarks in rounds,
  # alternated, then the checks under the switches that change the kernels' source.
  sysinfo
  synth_q15
  phase kernels 150 -- $B kernels
  phase spec_q15 60 -- $B spec $M/q15.gguf 96
  phase session_q15 60 -- $B session $M/q15.gguf 128
  for round in 1 2 3; do
    phase q15_default_$round 60 KASOKU_NONE=1 -- $B bench $M/q15.gguf quick
    phase q15_v2_$round 90 KASOKU_CUDA_MATVEC_V2=1 -- $B bench $M/q15.gguf quick
    phase q15_own_prefetch_$round 90 KASOKU_CUDA_OWN_PREFETCH=1 -- $B bench $M/q15.gguf quick
    phase q15_trigger_first_$round 90 KASOKU_CUDA_TRIGGER_FIRST=1 -- $B bench $M/q15.gguf quick
    phase q15_fuse_post_$round 60 KASOKU_CUDA_FUSE_POST=1 -- $B bench $M/q15.gguf quick
    phase q15_fuse_norm_$round 60 KASOKU_CUDA_FUSE_NORM=1 -- $B bench $M/q15.gguf quick
    phase q15_fuse_glu_$round 60 KASOKU_CUDA_FUSE_GLU=1 -- $B bench $M/q15.gguf quick
  done
  phase kernels_v2 150 KASOKU_CUDA_MATVEC_V2=1 -- $B kernels
  phase spec_q15_v2 60 KASOKU_CUDA_MATVEC_V2=1 -- $B spec $M/q15.gguf 96
  phase spec_q15_fuse_post 60 KASOKU_CUDA_FUSE_POST=1 -- $B spec $M/q15.gguf 96
  phase bench_full 200 -- $B bench $M/q15.gguf
elif [ "$PART" = 4 ]; then
  sysinfo
  synth_q15
  S=${SWITCH:-KASOKU_NONE=1}
  phase kernels_switch 150 $S -- $B kernels
  phase spec_q15_switch 60 $S -- $B spec $M/q15.gguf 96
  phase session_q15_switch 60 $S -- $B session $M/q15.gguf 128
  for round in 1 2 3; do
    phase q15_default_$round 60 KASOKU_NONE=1 -- $B bench $M/q15.gguf quick
    phase q15_switch_$round 60 $S -- $B bench $M/q15.gguf quick
  done
else
  wait_models
  phase kernels_dp4a 150 KASOKU_CUDA_MMA=0 -- $B kernels
  phase spec_q15_dp4a 60 KASOKU_CUDA_MMA=0 -- $B spec $M/q15.gguf 96
  phase session_q15_dp4a 60 KASOKU_CUDA_MMA=0 -- $B session $M/q15.gguf 128
  phase cli 150 -- bash "$G/cli_checks.sh" "$G"
  phase bench_full 150 -- $B bench $M/q15.gguf
  phase bench_full_dp4a 150 KASOKU_CUDA_MMA=0 -- $B bench $M/q15.gguf
fi
tar czf "$OUT/session$PART.tgz" -C "$L" .
echo "=== summary"
for f in "$L"/*.log; do
  n=$(basename "$f" .log)
  case $n in progress|sysinfo) continue;; esac
  grep -h -E "checks,|^FAIL|pp512|tg128|verify depth|a cycle|us a draft|in-graph cost|kernel (attention|matvec)|^depth" "$f" | sed "s/^/$n: /" | cut -c1-230
done
