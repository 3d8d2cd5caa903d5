#!/usr/bin/env bash
# The real Qwen2.5-Coder-1.5B Q4_K_M on the GPU (2026-12-07b), run from the repository root
# once its pieces are in /root/dfw: prompt lookup and the shipped DFlash drafter against plain
# decoding on the copy-heavy code-editing requests (bench/prompt_lookup.py, an answer a
# process), and on the HumanEval and merge prompts of bench/spec.py (`kasoku bench --compare`,
# the strategies taking turns prompt by prompt in one process); then the DFlash training
# window (TRAIN_SECONDS, continuing the shipped drafter, on the kept answers alone).
#   bash real.sh TRAIN_SECONDS
set -u
W=/root/dfw; OUT=${OUT:-/tmp/out}; L=$OUT/real; mkdir -p $L
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
if ls $W/t.gguf.part* > /dev/null 2>&1; then cat $W/t.gguf.part* > $W/t.gguf && rm $W/t.gguf.part*; fi
sum=$(sha256sum $W/t.gguf | cut -c1-64)
echo "target $sum (expected $(cat tools/dflash/data/*/target.sha256))" | tee $L/target.txt
cp -r tools drafters $W/
for _ in $(seq 60); do [ -f /root/bg/DONE ] && break; sleep 2; done
echo "background checks done: $(cat /root/bg/DONE 2>/dev/null || echo no)" | tee -a $L/target.txt
export KASOKU_DRAFTERS=$W/drafters
K=$PWD/.gpu/kasoku; D=$W/drafters/qwen2.5-coder-1.5b-dflash
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/sysinfo.log 2>&1
timeout 200 python3 bench/prompt_lookup.py --kasoku $K --model $W/t.gguf --device cuda \
  --strategies none,ngram,dflash --draft qwen2.5-coder-1.5b-dflash --out $L/prompt_lookup \
  > $L/prompt_lookup.log 2>&1
for s in humaneval merge; do
  for round in 1 2; do
    timeout 150 $K bench --device cuda --model $W/t.gguf --prompts $W/prompts-$s.jsonl --gen-tokens 128 \
      --compare none,ngram,dflash --draft $D --json $L/bench_${s}_$round.json > $L/bench_${s}_$round.log 2>&1
  done
done
tail -n 14 $L/prompt_lookup/prompt_lookup.md
python3 - $L <<'PY'
import json, sys, glob
for f in sorted(glob.glob(sys.argv[1] + "/bench_*.json")):
    for s in json.load(open(f))["strategies"]:
        ps = s["prompts"]
        tok = sum(max(p["generated"] - 1, 0) for p in ps); dec = sum(p["decode_s"] for p in ps)
        passes = sum(p["passes"] for p in ps)
        print(f"{f.split('/')[-1]:<22} {s['label']:<7} {tok / dec:8.1f} t/s {tok / passes:5.2f} tokens/pass")
PY
tar czf $OUT/real.tgz -C $OUT real && rm -rf $L
if [ "${1:-0}" != 0 ]; then
  (setsid nohup bash $W/tools/dflash/window.sh "$1" 0 $W/drafters/qwen2.5-coder-1.5b-dflash \
     > $W/nohup.log 2>&1 < /dev/null &)
fi
