#!/bin/bash
# One watching call of a GPU window (see the README's "A window, call by call"): waits up to
# SECONDS or until the window says "trained", prints its progress, and brings the latest
# export back in $OUT (the drafter's config, weight pieces and counters, and the training
# log: at most 7 files), so a machine given back mid-window loses only what came after it;
# the eighth file, regen-NNN.tar, holds regenerated shards no earlier call returned (at most
# 15 MiB of them; the rest come with later calls), for later windows to train on.
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
# Shards not returned yet, oldest first, up to 15 MiB (a returned file is at most 16 MiB).
touch "$W/returned.list"
batch=() total=0
for f in $(cd "$W" && ls regen/*.npz 2>/dev/null | grep -v "\.tmp\."); do
  grep -qx "$f" "$W/returned.list" && continue
  size=$(stat -c %s "$W/$f")
  [ $(( total + size )) -gt $(( 15 << 20 )) ] && break
  batch+=("$f"); total=$(( total + size ))
done
if [ ${#batch[@]} -gt 0 ]; then
  n=$(cat "$W/returned.n" 2>/dev/null || echo 0)
  name=$(printf "regen-%03d.tar" "$n")
  tar cf "$OUT/$name" -C "$W" "${batch[@]}" && printf "%s\n" "${batch[@]}" >> "$W/returned.list" &&
    echo $(( n + 1 )) > "$W/returned.n"
  echo "returned ${#batch[@]} shards ($total bytes) as $name"
fi
