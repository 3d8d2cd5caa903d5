#!/usr/bin/env bash
# The second device call set of 2026-12-07b, on a fresh machine, from the repository root once
# the target's pieces are in /root/dfw: the device's speculation budget now adapts (the first
# pass of each tree size, when its graph is captured, left out of the costs) and
# `kasoku bench --prompts --device cuda` runs on the GPU. Prompt lookup and the shipped DFlash
# drafter, adaptive and at the old fixed budget of 8, against plain decoding on the code-editing
# requests (bench/prompt_lookup.py), then on bench/spec.py's HumanEval and merge prompts
# (`kasoku bench --compare`, two rounds).
set -u
W=/root/dfw; OUT=${OUT:-/tmp/out}; L=$OUT/real2; mkdir -p $L
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
if ls $W/t.gguf.part* > /dev/null 2>&1; then cat $W/t.gguf.part* > $W/t.gguf && rm $W/t.gguf.part*; fi
echo "target $(sha256sum $W/t.gguf | cut -c1-64) (expected $(cat tools/dflash/data/*/target.sha256))" | tee $L/target.txt
rm -rf $W/drafters && cp -r drafters $W/
export KASOKU_DRAFTERS=$W/drafters
K=$PWD/.gpu/kasoku; D=$W/drafters/qwen2.5-coder-1.5b-dflash
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/sysinfo.log 2>&1
timeout 300 python3 bench/prompt_lookup.py --kasoku $K --model $W/t.gguf --device cuda \
  --strategies none,ngram,ngram:8:fixed,dflash,dflash:8:fixed --draft qwen2.5-coder-1.5b-dflash \
  --out $L/prompt_lookup > $L/prompt_lookup.log 2>&1
tail -n 16 $L/prompt_lookup/prompt_lookup.md
for round in 1 2; do
  for s in humaneval merge; do
    timeout 150 $K bench --device cuda --model $W/t.gguf --prompts $W/prompts-$s.jsonl --gen-tokens 128 \
      --compare none,ngram,dflash --draft $D --json $L/bench_${s}_$round.json > $L/bench_${s}_$round.log 2>&1
  done
done
python3 - $L <<'PY'
import json, sys, glob
for f in sorted(glob.glob(sys.argv[1] + "/bench_*.json")):
    d = json.load(open(f))
    for s in d["strategies"]:
        ps = s["prompts"]
        tok = sum(max(p["generated"] - 1, 0) for p in ps); dec = sum(p["decode_s"] for p in ps)
        passes = sum(p["passes"] for p in ps)
        print(f"{f.split('/')[-1]:<22} {d.get('device')} {s['label']:<7} {tok / dec:8.1f} t/s {tok / passes:5.2f} tokens/pass")
PY
tar czf $OUT/real2.tgz -C $OUT real2 && rm -rf $L
