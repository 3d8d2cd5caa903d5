#!/usr/bin/env bash
# Runs on the GPU machine (tools/gpu_run.sh stages it as .gpu/run.sh beside the binary and
# the fixtures): every GPU check, then the benchmark on random-weight GGUFs of the real
# shapes made there. Each phase is bounded and logged to $OUT; a failing phase does not stop
# the others. Usage: bash .gpu/run.sh [SECONDS]   (stops starting phases after SECONDS;
# with KASOKU_GPU_CHECKS_ONLY=1, the checks without the benchmark)
set -u
G=$(cd "$(dirname "$0")" && pwd)
B=$G/kasoku-cuda-check
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
# Logs gather in L and come back as one archive (the device tool returns at most 8 files).
L=/tmp/kasoku-logs; mkdir -p "$L"
M=/tmp/kasoku-models; mkdir -p $M
end=$(( $(date +%s) + ${1:-420} ))
. "$G/phase.sh"
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$L/sysinfo.log" 2>&1
# The random-weight models for the benchmark, made beside the kernel checks (other cores).
M=/tmp/kasoku-models
( for spec in "1.5b q4_k_m q15-q4_k_m" "0.5b q4_k_m q05-q4_k_m" "1.5b q8_0 q15-q8_0" "qwen3.5-2b q4_k_m q35-2b-q4_k_m"; do
    set -- $spec; $B synth $1 $2 $M/$3.gguf >> "$L/synth.log" 2>&1; done; touch $M/DONE ) &
phase kernels 90 $B kernels
# A failure with dependent launch on: the same checks without it, to tell which.
grep -q " 0 failed" "$L/kernels.log" || KASOKU_CUDA_PDL=0 phase kernels_nopdl 90 $B kernels
phase fixtures 60 $B fixtures "$G/fixtures"
phase spec_tiny 60 $B spec "$G/fixtures/llama/tiny/model-f32.gguf" 48
# A draft model on the GPU (the Q4_0 file drafting for the f32 one): speculative == plain
# through generate_speculative and DeviceSession, tokens per pass.
phase spec_draft_tiny 60 $B spec-draft "$G/fixtures/llama/tiny/model-f32.gguf" "$G/fixtures/llama/tiny/model-q4_0.gguf" 48
# The engine's DeviceSession (what run and serve use): ids-only greedy == generate_plain,
# prompt lookup == plain greedy and sampled, and tokens/s per kind of request.
phase session_tiny 60 $B session "$G/fixtures/llama/tiny/model-f32.gguf" 48
# Qwen3.5's hybrid (Gated DeltaNet + gated attention): the same on its tiny fixture.
phase spec_qwen35_tiny 60 $B spec "$G/fixtures/qwen3_5/tiny/model-f32.gguf" 48
phase session_qwen35_tiny 60 $B session "$G/fixtures/qwen3_5/tiny/model-f32.gguf" 48
phase spec_draft_qwen35_tiny 60 $B spec-draft "$G/fixtures/qwen3_5/tiny/model-f32.gguf" "$G/fixtures/qwen3_5/tiny/model-f32.gguf" 48
# A DFlash drafter on the GPU: its marginals against the CPU network's on
# one context, then speculative == plain through generate_speculative and DeviceSession.
phase dflash_tiny 60 $B dflash "$G/fixtures/qwen2/tiny/model-f32.gguf" "$G/fixtures/qwen2/tiny_dflash" 48
# The kasoku binary itself: `run --device cuda` against `--device cpu` (greedy and sampled),
# with prompt lookup, and `serve --device cuda` against `serve --device cpu`.
phase cli 240 bash "$G/cli_checks.sh" "$G"
for i in $(seq 90); do [ -f $M/DONE ] && break; sleep 1; done
phase spec_q15 90 $B spec $M/q15-q4_k_m.gguf 96
phase spec_draft_q15 120 $B spec-draft $M/q15-q4_k_m.gguf $M/q05-q4_k_m.gguf 96
phase session_q15 90 $B session $M/q15-q4_k_m.gguf 128
phase spec_q35 90 $B spec $M/q35-2b-q4_k_m.gguf 96
if [ "${KASOKU_GPU_CHECKS_ONLY:-0}" != 1 ]; then
phase bench_q35 200 $B bench $M/q35-2b-q4_k_m.gguf
phase bench 470 bash "$G/bench.sh" "$L" $M
phase bench_cli 60 "$G/kasoku" bench --model $M/q15-q4_k_m.gguf --device cuda --prompt-tokens 512 --gen-tokens 128 --context 16 --verify 1,2,4,8,16,32,64
fi
tar czf "$OUT/logs.tgz" -C "$L" .
echo "=== summary"; grep -h -E "FAIL|checks,|tokens/s|session|verify depth|pp512|device:|compiled|kernel |rel err|==|generate|top_k_select of|row_top2 of|one draft" "$L"/*.log | cut -c1-220
