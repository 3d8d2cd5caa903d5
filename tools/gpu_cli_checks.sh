#!/usr/bin/env bash
# Runs on the GPU machine (staged by tools/gpu_run.sh as .gpu/cli_checks.sh): the kasoku binary
# on the transformers fixtures (Qwen3.5's hybrid included), `run --device cuda` against `run --device cpu` (the same greedy
# text; the same sampled text for the same seed, as far as the logits agree), with and without
# prompt lookup on the GPU, with a draft model on the GPU (`--draft`: the Q4_0 file drafting
# for the f32 one, or a model drafting for itself), the device named in the statistics, and
# `serve --device cuda`
# against `serve --device cpu` (streamed and plain chat completions, greedy and sampled),
# also with a draft model on the GPU; DFlash on the GPU against the CPU.
# Usage: bash cli_checks.sh STAGE_DIR
G=$1
K=$G/kasoku
checks=0 fails=0
short() { printf %s "$1" | tr '\n' ' ' | cut -c1-40; }  # a text on one line
check() {  # what, ok?
  checks=$((checks + 1))
  if [ "$2" = 1 ]; then echo "ok   $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi
}
prompt="def add(a, b): return a + b. def add(a, b): return"
for f in llama/tiny qwen2/tiny qwen3/tiny qwen3_5/tiny; do
  m=$G/fixtures/$f/model-f32.gguf
  gpu=$($K run --model "$m" --raw -m "$prompt" -n 24 --ignore-eos --spec none --device cuda -q 2>&1)
  cpu=$($K run --model "$m" --raw -m "$prompt" -n 24 --ignore-eos --spec none --device cpu -q 2>&1)
  spec=$($K run --model "$m" --raw -m "$prompt" -n 24 --ignore-eos --spec ngram --device cuda -q 2>&1)
  check "$f: run --device cuda == --device cpu (${gpu:0:60})" "$([ "$gpu" = "$cpu" ] && echo 1)"
  [ "$gpu" = "$cpu" ] || echo "     cuda: [$gpu]"$'\n'"     cpu:  [$cpu]"
  check "$f: prompt lookup on the GPU == plain on the GPU" "$([ "$spec" = "$gpu" ] && echo 1)"
  # A draft model beside the target on the GPU: --spec draft and auto, against the CPU's text
  # (greedy, and sampled with the seed), then once more with the statistics: the device and
  # the draft loaded there, not a fallback to the CPU.
  d=$G/fixtures/$f/model-q4_0.gguf; [ -f "$d" ] || d=$m
  for kind in draft auto; do
    dr=$($K run --model "$m" --raw -m "$prompt" -n 24 --ignore-eos --spec $kind --draft "$d" --device cuda -q 2>&1)
    check "$f: run --device cuda --spec $kind --draft $(basename "$d") == run --device cpu" "$([ "$dr" = "$cpu" ] && echo 1)"
    [ "$dr" = "$cpu" ] || echo "     cuda+draft: [$dr]"$'\n'"     cpu:  [$cpu]"
  done
  st=$($K run --model "$m" --raw -m "$prompt" -n 24 --ignore-eos --spec draft --draft "$d" --device cuda 2>&1 >/dev/null)
  check "$f: the draft model loaded and drafted on the GPU" \
    "$(echo "$st" | grep -q "loaded draft" && echo "$st" | grep -q "device cuda:0" && echo 1)"
  echo "$st" | grep -v "^loaded" | tail -2 | cut -c1-200
  # Sampled on the host from the GPU's logits with the CPU's sampler: the same seed, the same
  # text (a draw that lands within the logits' difference of a boundary could differ).
  hot=(--temp 0.8 --top-k 40 --top-p 0.95 --min-p 0.02 --repeat-penalty 1.1 --seed 11)
  sg=$($K run --model "$m" --raw -m "$prompt" -n 24 --ignore-eos "${hot[@]}" --spec none --device cuda -q 2>&1)
  sgs=$($K run --model "$m" --raw -m "$prompt" -n 24 --ignore-eos "${hot[@]}" --spec ngram --device cuda -q 2>&1)
  sc=$($K run --model "$m" --raw -m "$prompt" -n 24 --ignore-eos "${hot[@]}" --spec none --device cpu -q 2>&1)
  check "$f: sampled run --device cuda == --device cpu, seed 11 (${sg:0:40})" "$([ "$sg" = "$sc" ] && echo 1)"
  [ "$sg" = "$sc" ] || echo "     cuda: [$sg]"$'\n'"     cpu:  [$sc]"
  check "$f: sampled with prompt lookup on the GPU == sampled plain on the GPU" "$([ "$sgs" = "$sg" ] && echo 1)"
  sgd=$($K run --model "$m" --raw -m "$prompt" -n 24 --ignore-eos "${hot[@]}" --spec draft --draft "$d" --device cuda -q 2>&1)
  check "$f: sampled with a draft model on the GPU == sampled plain on the GPU" "$([ "$sgd" = "$sg" ] && echo 1)"
  # Top-k from the device's selection with penalties that raise logits, and top-k off (whole
  # rows, the host's nucleus without a full sort): the CPU's text.
  for set in "--top-k 5 --presence-penalty -0.8 --frequency-penalty 0.3 --temp 1.1 --seed 4" \
             "--top-k 0 --top-p 0.9 --min-p 0.05 --temp 0.9 --seed 5"; do
    a=$($K run --model "$m" --raw -m "$prompt" -n 24 --ignore-eos $set --spec none --device cuda -q 2>&1)
    b=$($K run --model "$m" --raw -m "$prompt" -n 24 --ignore-eos $set --spec none --device cpu -q 2>&1)
    check "$f: sampled ($set) --device cuda == --device cpu" "$([ "$a" = "$b" ] && echo 1)"
    [ "$a" = "$b" ] || echo "     cuda: [$a]"$'\n'"     cpu:  [$b]"
  done
done
m=$G/fixtures/qwen2/tiny/model-f32.gguf
stats=$($K run --model "$m" -m "hello" -n 8 2>&1)
check "the default device is the GPU and the statistics say so" \
  "$(echo "$stats" | grep -q "device cuda:0" && echo 1)"
echo "$stats" | tail -2
# Qwen3.5's hybrid takes the GPU by default too (verified there on 2026-12-05).
q35=$($K run --model "$G/fixtures/qwen3_5/tiny/model-f32.gguf" -m "hello" -n 8 --spec none 2>&1)
check "Qwen3.5 by default: the GPU" "$(echo "$q35" | grep -q "device cuda:0" && echo 1)"
hot1=$($K run --model "$m" --raw -m "$prompt" -n 24 --ignore-eos --temp 1.0 --seed 7 --device cuda -q 2>&1)
hot2=$($K run --model "$m" --raw -m "$prompt" -n 24 --ignore-eos --temp 1.0 --seed 7 --device cuda -q 2>&1)
greedy=$($K run --model "$m" --raw -m "$prompt" -n 24 --ignore-eos --device cuda -q 2>&1)
check "sampling on the GPU: the same seed gives the same text (${hot1:0:40})" "$([ "$hot1" = "$hot2" ] && echo 1)"
check "sampling on the GPU at temperature 1 differs from greedy" "$([ "$hot1" != "$greedy" ] && echo 1)"
# DFlash on the GPU: the qwen2 fixture's drafter, the CPU's text greedy and sampled, the
# drafter loaded on the GPU, and the GPU by default.
df=$G/fixtures/qwen2/tiny_dflash
for kind in dflash auto; do
  a=$($K run --model "$m" --raw -m "$prompt" -n 24 --ignore-eos --spec $kind --draft "$df" --device cuda -q 2>&1)
  b=$($K run --model "$m" --raw -m "$prompt" -n 24 --ignore-eos --spec none --device cpu -q 2>&1)
  check "qwen2/tiny: run --device cuda --spec $kind --draft tiny_dflash == run --device cpu" "$([ "$a" = "$b" ] && echo 1)"
  [ "$a" = "$b" ] || echo "     cuda+dflash: [$a]"$'\n'"     cpu:  [$b]"
done
a=$($K run --model "$m" --raw -m "$prompt" -n 24 --ignore-eos --temp 0.8 --seed 3 --spec dflash --draft "$df" --device cuda -q 2>&1)
b=$($K run --model "$m" --raw -m "$prompt" -n 24 --ignore-eos --temp 0.8 --seed 3 --spec none --device cuda -q 2>&1)
check "qwen2/tiny: sampled with DFlash on the GPU == sampled plain on the GPU" "$([ "$a" = "$b" ] && echo 1)"
st=$($K run --model "$m" --raw -m "$prompt" -n 24 --ignore-eos --spec dflash --draft "$df" --device cuda 2>&1 >/dev/null)
check "the DFlash drafter loaded and drafted on the GPU" \
  "$(echo "$st" | grep -q "loaded DFlash drafter" && echo "$st" | grep -q "device cuda:0" && echo 1)"
echo "$st" | grep -v "^loaded" | tail -2 | cut -c1-200
# The drafter in kasoku's own formats (as the shipped ones are): dequantized to F16 on load.
rm -rf /tmp/df-l && $K quantize "$df" /tmp/df-l --format l > /dev/null 2>&1
a=$($K run --model "$m" --raw -m "$prompt" -n 24 --ignore-eos --spec dflash --draft /tmp/df-l --device cuda 2> /tmp/df-l.err)
b=$($K run --model "$m" --raw -m "$prompt" -n 24 --ignore-eos --spec none --device cpu 2> /dev/null)
check "qwen2/tiny: a DFlash drafter in format L drafts on the GPU, text == run --device cpu" \
  "$(grep -q "speculation (dflash" /tmp/df-l.err && [ "$a" = "$b" ] && echo 1)"
[ "$a" = "$b" ] || tail -3 /tmp/df-l.err
d=$($K run --model "$m" -m "hello" -n 8 --spec dflash --draft "$df" 2>&1)
check "DFlash by default: the GPU" "$(echo "$d" | grep -q "device cuda:0" && echo 1)"
err=$($K run --model "$m" -m "hello" -n 8 --spec mtp --device cuda 2>&1)
check "MTP drafting on --device cuda is refused with the reason" \
  "$(echo "$err" | grep -q "prompt lookup only" && echo 1)"
# serve: the same fixture served on the GPU and on the CPU, the same requests to both.
m=$G/fixtures/qwen2/tiny/model-f32.gguf
serve() {  # device port [flags...] -> pid; waits (10 s at most) for the banner
  local dev=$1 port=$2; shift 2
  $K serve --model "$m" --device "$dev" --port "$port" "$@" > /tmp/serve-$port.log 2>&1 &
  local pid=$! i
  for i in $(seq 50); do grep -q " on http://" /tmp/serve-$port.log && break; sleep 0.2; done
  echo $pid
}
gpid=$(serve cuda 18431); cpid=$(serve cpu 18432)
# The model drafting for itself on the GPU (the qwen2 fixture has no smaller file).
dpid=$(serve cuda 18433 --spec draft --draft "$m")
grep -h "kasoku serve:" /tmp/serve-18431.log /tmp/serve-18432.log /tmp/serve-18433.log | cut -c1-160
check "serve --device cuda starts and names the device" \
  "$(grep -q "(device cuda:0," /tmp/serve-18431.log && echo 1)"
check "serve --device cuda --draft loads the draft on the GPU" \
  "$(grep -q "loaded draft" /tmp/serve-18433.log && grep -q "(device cuda:0," /tmp/serve-18433.log && echo 1)"
ask() {  # port stream(0|1) temperature -> the answer's text (or ERROR ...)
  timeout 60 python3 - "$@" <<'PY'
import json, sys, urllib.request
port, stream, temp = sys.argv[1], sys.argv[2] == "1", float(sys.argv[3])
body = {"model": "model-f32", "messages": [{"role": "user", "content": "def add(a, b): return a + b. Again:"}],
        "max_tokens": 24, "ignore_eos": True, "temperature": temp, "seed": 5, "stream": stream}
req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(),
                             {"Content-Type": "application/json"})
try:
    with urllib.request.urlopen(req, timeout=50) as r:
        if not stream:
            print(json.load(r)["choices"][0]["message"]["content"]); sys.exit()
        text = ""
        for line in r:
            line = line.decode().strip()
            if line.startswith("data: ") and line != "data: [DONE]":
                text += json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
        print(text)
except Exception as e:
    print("ERROR", e)
PY
}
for mode in "0 0" "1 0" "0 0.8" "1 0.8"; do
  set -- $mode
  a=$(ask 18431 $1 $2); b=$(ask 18432 $1 $2)
  check "serve cuda == cpu (stream $1, temperature $2): $(short "$a")" \
    "$([ "$a" = "$b" ] && [ "${a:0:5}" != ERROR ] && echo 1)"
  [ "$a" = "$b" ] || echo "     cuda: [$a]"$'\n'"     cpu:  [$b]"
  c=$(ask 18433 $1 $2)
  check "serve cuda with a draft model == cpu (stream $1, temperature $2): $(short "$c")" \
    "$([ "$c" = "$b" ] && [ "${c:0:5}" != ERROR ] && echo 1)"
  [ "$c" = "$b" ] || echo "     cuda+draft: [$c]"$'\n'"     cpu:  [$b]"
done
check "serve --device cuda: /metrics names the device" \
  "$(curl -s -m 5 http://127.0.0.1:18431/metrics | grep -q 'kasoku_device_info{device="cuda:0"} 1' && echo 1)"
kill $gpid $cpid $dpid 2>/dev/null; wait $gpid $cpid $dpid 2>/dev/null
grep -h -i "error\|panic" /tmp/serve-18431.log /tmp/serve-18433.log | head -3
echo "$checks checks, $fails failed"
