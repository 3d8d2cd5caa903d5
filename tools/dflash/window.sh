#!/bin/bash
# One GPU window, run on the device in the background once every piece of the target is in
# /root/dfw (see the README's "A window, call by call"): joins the target, regenerates the
# held-out answers, then regenerates training answers in one process while training beside it.
#
#   setsid nohup bash /root/dfw/tools/dflash/window.sh TRAIN_SECONDS [REGEN_SECONDS] [INIT_DIR] &
# (REGEN_SECONDS: 900 by default; 0 trains on the answers kept in tools/dflash/data alone)
# Logs and outputs under /root/dfw: window.log, regen_*.log, train.log, out/drafter/.
set -u
W=${DFW:-/root/dfw}; D=$W/tools/dflash; T=$W/t.gguf
TRAIN_S=$1; REGEN_S=${2:-900}; INIT=${3:-}
cd $W
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
# Sizes for the GPU's memory, regeneration beside training: on the H200 (141 GB) training at
# 16384 tokens peaked at 69 GiB; an H100 (80 GB) gets half the tokens and half the batch.
# Small shards, so training starts on the first one within a minute or two.
GIB=$(( $(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1) / 1024 ))
if [ "$GIB" -ge 120 ]; then REGEN_BATCH=256 TRAIN_TOKENS=16384; else REGEN_BATCH=128 TRAIN_TOKENS=8192; fi
if ls $W/t.gguf.part* > /dev/null 2>&1; then cat $W/t.gguf.part* > $T && rm $W/t.gguf.part*; fi
# Answers regenerated in earlier windows: watch.sh's regen-NNN.tar carried into regen-in/, and
# those the repository keeps for this target (tools/dflash/data/*/ whose target.sha256 is its).
# Their shards go on watch.sh's list of returned ones, so it sends back only new shards.
for t in $W/regen-in/*.tar; do [ -f "$t" ] && tar xf "$t" -C $W && tar tf "$t" >> $W/returned.list; done
sum=$(sha256sum $T | cut -c1-64)
for d in $D/data/*/; do
  [ "$(cat "$d/target.sha256" 2>/dev/null)" = "$sum" ] &&
    for t in "$d"/regen-*.tar; do tar xf "$t" -C $W && tar tf "$t" >> $W/returned.list; done
done
echo "target $sum at $(date +%s); $GIB GiB: regen batch $REGEN_BATCH, train $TRAIN_TOKENS tokens" > window.log
python3 $D/regen.py --target $T --target-cache target.pt --prompts prompts.jsonl.xz \
  --out regen --split val --shard-size 96 --max-shards 1 --batch 96 --max-new 256 \
  --time 400 > regen_val.log 2>&1
# HumanEval-style prompts (prompts.py --kinds body), when the window brought them: their
# held-out answers too (val-body-*, reported by kind), and their training answers are
# regenerated first (1,608 prompts: a few minutes), then the default prompts'.
BODY=$W/body.jsonl.xz
[ -f $BODY ] && python3 $D/regen.py --target $T --target-cache target.pt --prompts $BODY --tag body \
  --out regen --split val --shard-size 48 --max-shards 1 --batch 48 --max-new 256 \
  --time 300 >> regen_val.log 2>&1
echo "held-out answers at $(date +%s)" >> window.log
# REGEN_SECONDS 0: train on the kept answers alone, with the whole GPU (the third window
# trained at 14.3K tokens/s alone against ~10K beside regeneration).
# The body prompts get at most half of REGEN_SECONDS, the default ones what is left of it.
[ "$REGEN_S" != 0 ] && (
  t0=$(date +%s)
  [ -f $BODY ] && python3 $D/regen.py --target $T --target-cache target.pt --prompts $BODY --tag body \
    --out regen --split train --shard-size $REGEN_BATCH --batch $REGEN_BATCH --max-new 256 \
    --time $(( REGEN_S / 2 )) > regen_body.log 2>&1
  python3 $D/regen.py --target $T --target-cache target.pt --prompts prompts.jsonl.xz \
    --out regen --split train --shard-size $REGEN_BATCH --batch $REGEN_BATCH --max-new 384 \
    --time $(( REGEN_S - ($(date +%s) - t0) )) > regen_train.log 2>&1 ) &
while ! ls regen/train-*.npz > /dev/null 2>&1; do sleep 3; done
echo "first train shard at $(date +%s)" >> window.log
# A continued drafter's learning-rate schedule spans its earlier training and this window's
# (train.py's default with --total-time 0); a new one's spans this window.
TOTAL_S=$TRAIN_S; [ -n "$INIT" ] && TOTAL_S=0
python3 $D/train.py --target $T --target-cache target.pt --data regen --out out \
  ${INIT:+--init "$INIT"} --time "$TRAIN_S" --total-time "$TOTAL_S" --text prompts.jsonl.xz \
  --batch-tokens $TRAIN_TOKENS --reload-every 40 --export-every 120 --export-split-mib 15 --val-every 200 > train.log 2>&1
echo "trained, rc $?, at $(date +%s)" >> window.log
