#!/usr/bin/env bash
# 2026-12-07d, the call after the real target's pieces reached /root/dfw (one call a piece,
# carrying .dflash/p/t.gguf.partNN; this one carries .gpu): prompt lookup and the shipped DFlash
# drafter against plain decoding on the code-editing requests (bench/prompt_lookup.py, the real
# Qwen2.5-Coder-1.5B-Instruct Q4_K_M), with the packed tensor-core plan (the default since this
# call's binary) and with dp4a everywhere (KASOKU_CUDA_MMA=0: the previous default), alternated
# (packed, dp4a, packed); then the sessions and speculative == plain on the real target.
set -u
W=/root/dfw; OUT=${OUT:-/tmp/out}; L=$OUT/real; mkdir -p $L
export LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
if ls $W/t.gguf.part* > /dev/null 2>&1; then cat $W/t.gguf.part* > $W/t.gguf && rm $W/t.gguf.part*; fi
echo "target $(sha256sum $W/t.gguf | cut -c1-64) (expected $(cat tools/dflash/data/*/target.sha256))" | tee $L/target.txt
rm -rf $W/drafters && cp -r drafters $W/
export KASOKU_DRAFTERS=$W/drafters
K=$PWD/.gpu/kasoku
nvidia-smi --query-gpu=name,driver_version --format=csv > $L/sysinfo.log 2>&1
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s]"; }
for run in packed:1 dp4a:1 packed:2; do
  v=${run%:*}; r=${run#*:}
  E=KASOKU_NONE=1; [ $v = dp4a ] && E=KASOKU_CUDA_MMA=0
  env $E timeout 200 python3 bench/prompt_lookup.py --kasoku $K --model $W/t.gguf --device cuda \
    --strategies none,ngram,dflash --draft qwen2.5-coder-1.5b-dflash --out $L/pl_${v}_$r > $L/pl_${v}_$r.log 2>&1
  echo "$(el) $v $r:"; grep -h "^| \(none\|ngram\|dflash\)" $L/pl_${v}_$r/prompt_lookup.md
done
timeout 60 .gpu/kasoku-cuda-check spec $W/t.gguf 128 > $L/spec_real.log 2>&1; echo "$(el) spec real: $(grep -h 'checks,' $L/spec_real.log)"
timeout 60 .gpu/kasoku-cuda-check session $W/t.gguf 128 > $L/session_real.log 2>&1; echo "$(el) session real: $(tail -n 1 $L/session_real.log)"
tar czf $OUT/real.tgz -C $OUT real && rm -rf $L
