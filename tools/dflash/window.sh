#!/bin/bash
# One GPU window, run on the device in the background once every piece of the target is in
# /root/dfw (see the README's "A window, call by call"): joins the target, regenerates the
# held-out answers, then regenerates training answers in one process while training beside it.
#
#   setsid nohup bash /root/dfw/tools/dflash/window.sh TRAIN_SECONDS [REGEN_SECONDS] [INIT_DIR] &
# Logs and outputs under /root/dfw: window.log, regen_*.log, train.log, out/drafter/.
set -u
W=${DFW:-/root/dfw}; D=$W/tools/dflash; T=$W/t.gguf
TRAIN_S=$1; REGEN_S=${2:-900}; INIT=${3:-}
cd $W
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
if ls $W/t.gguf.part* > /dev/null 2>&1; then cat $W/t.gguf.part* > $T && rm $W/t.gguf.part*; fi
echo "target $(sha256sum $T | cut -c1-64) at $(date +%s)" > window.log
python3 $D/regen.py --target $T --target-cache target.pt --prompts prompts.jsonl.xz \
  --out regen --split val --shard-size 160 --max-shards 1 --batch 160 --max-new 256 \
  --time 120 > regen_val.log 2>&1
echo "held-out answers at $(date +%s)" >> window.log
python3 $D/regen.py --target $T --target-cache target.pt --prompts prompts.jsonl.xz \
  --out regen --split train --shard-size 512 --batch 512 --max-new 384 \
  --time "$REGEN_S" > regen_train.log 2>&1 &
while ! ls regen/train-*.npz > /dev/null 2>&1; do sleep 3; done
echo "first train shard at $(date +%s)" >> window.log
python3 $D/train.py --target $T --target-cache target.pt --data regen --out out \
  ${INIT:+--init "$INIT"} --time "$TRAIN_S" --total-time "$TRAIN_S" --text prompts.jsonl.xz \
  --reload-every 40 --export-every 240 --export-split-mib 15 --val-every 200 > train.log 2>&1
echo "trained, rc $?, at $(date +%s)" >> window.log
