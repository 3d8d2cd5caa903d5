#!/usr/bin/env bash
# kasoku's GPU benchmark, run on the GPU machine from the staged folder (tools/gpu_run.sh
# stages it as .gpu/bench.sh): random-weight GGUFs of the real shapes (Qwen2.5-Coder 1.5B
# Q4_K_M and Q8_0, 0.5B Q4_K_M: the per-tensor types of llama.cpp's quantizer, so a token
# reads the real files' bytes), then per model: pp512, tg128 (graphs, and without), the
# verify curve k = 1..64 at depth 1 and 512, and a per-kernel profile of one decode step;
# then the 1.5B with the 0.5B drafting on the same GPU (generate 256: plain, prompt lookup,
# draft model at budgets 4, 8, 16; one draft's cost; random weights, so acceptance means
# nothing and the cost per cycle is what is measured).
# llama.cpp's CUDA numbers on the same shapes are in shared/research/gpu_anchor.md (its
# ~325 s build does not fit this run). Usage: bash bench.sh OUTDIR [MODELDIR]
set -u
G=$(cd "$(dirname "$0")" && pwd)
B=$G/kasoku-cuda-check
OUT=${1:-/tmp/out}; M=${2:-/tmp/kasoku-models}; mkdir -p "$OUT" "$M"
for spec in "1.5b q4_k_m q15-q4_k_m" "0.5b q4_k_m q05-q4_k_m" "1.5b q8_0 q15-q8_0"; do
  set -- $spec
  [ -f "$M/$3.gguf" ] || $B synth $1 $2 "$M/$3.gguf" >> "$OUT/synth.log" 2>&1
done
for m in q15-q4_k_m q05-q4_k_m q15-q8_0; do
  timeout 100 $B bench "$M/$m.gguf" > "$OUT/bench_$m.log" 2>&1
  echo "bench $m: rc=$?"
done
timeout 150 $B bench-draft "$M/q15-q4_k_m.gguf" "$M/q05-q4_k_m.gguf" > "$OUT/bench_draft_q15_q05.log" 2>&1
echo "bench draft q15 with q05: rc=$?"
