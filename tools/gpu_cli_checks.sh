#!/usr/bin/env bash
# Runs on the GPU machine (staged by tools/gpu_run.sh as .gpu/cli_checks.sh): the kasoku binary
# on the transformers fixtures, `run --device cuda` against `run --device cpu` (the same greedy
# text), with and without prompt lookup on the GPU, and the device named in the statistics.
# Usage: bash cli_checks.sh STAGE_DIR
G=$1
K=$G/kasoku
checks=0 fails=0
check() {  # what, ok?
  checks=$((checks + 1))
  if [ "$2" = 1 ]; then echo "ok   $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi
}
prompt="def add(a, b): return a + b. def add(a, b): return"
for f in llama/tiny qwen2/tiny qwen3/tiny; do
  m=$G/fixtures/$f/model-f32.gguf
  gpu=$($K run --model "$m" --raw -m "$prompt" -n 24 --ignore-eos --spec none --device cuda -q 2>&1)
  cpu=$($K run --model "$m" --raw -m "$prompt" -n 24 --ignore-eos --spec none --device cpu -q 2>&1)
  spec=$($K run --model "$m" --raw -m "$prompt" -n 24 --ignore-eos --spec ngram --device cuda -q 2>&1)
  check "$f: run --device cuda == --device cpu (${gpu:0:60})" "$([ "$gpu" = "$cpu" ] && echo 1)"
  [ "$gpu" = "$cpu" ] || echo "     cuda: [$gpu]"$'\n'"     cpu:  [$cpu]"
  check "$f: prompt lookup on the GPU == plain on the GPU" "$([ "$spec" = "$gpu" ] && echo 1)"
done
m=$G/fixtures/qwen2/tiny/model-f32.gguf
stats=$($K run --model "$m" -m "hello" -n 8 2>&1)
check "the default device is the GPU and the statistics say so" \
  "$(echo "$stats" | grep -q "device cuda:0" && echo 1)"
echo "$stats" | tail -2
err=$($K run --model "$m" -m "hello" -n 8 --temp 0.7 --device cuda 2>&1)
check "sampling at a temperature on --device cuda is refused with the reason" \
  "$(echo "$err" | grep -q "greedily" && echo 1)"
echo "$checks checks, $fails failed"
