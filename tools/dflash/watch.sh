#!/bin/bash
# One watching call of a GPU window (see the README's "A window, call by call"): waits up to
# SECONDS or until the window says "trained", prints its progress, and brings the latest
# export back in $OUT (the drafter's config, weight pieces and counters, and the training
# log: at most 7 files), so a machine given back mid-window loses only what came after it.
#
#   bash tools/dflash/watch.sh SECONDS
set -u
W=${DFW:-/root/dfw}; OUT=${OUT:-/tmp/out}
end=$(( $(date +%s) + ${1:-240} ))
while [ "$(date +%s)" -lt "$end" ] && ! grep -q trained "$W/window.log" 2>/dev/null; do sleep 2; done
cat "$W/window.log"
grep -h val_tf "$W/out/train_log.jsonl" 2>/dev/null | tail -3 | cut -c1-200
tail -n 1 "$W/out/train_log.jsonl" 2>/dev/null | cut -c1-200
echo "train shards: $(ls "$W"/regen/train-*.npz 2>/dev/null | wc -l)"
if [ -f "$W/out/drafter/config.json" ]; then
  mkdir -p "$OUT"
  cp "$W"/out/drafter/* "$OUT"/ && cp "$W/out/train_log.jsonl" "$OUT"/
  ls -la "$OUT"
fi
