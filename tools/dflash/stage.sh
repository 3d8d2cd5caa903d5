#!/bin/bash
# Stages one GPU window of DFlash training here, in .dflash/ (ignored by git): the target GGUF in
# pieces that fit a device call beside the repository's tracked files, the `gguf` wheel the GPU
# machine lacks, and the prompts. Then each device call carries one piece; see the README's
# "A window, call by call".
#
#   bash tools/dflash/stage.sh [TARGET.gguf]     (default: the cached Qwen2.5-Coder-1.5B Q4_K_M)
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
T=${1:-$HOME/.cache/kasoku/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf}
rm -rf .dflash/p && mkdir -p .dflash/p
tracked=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
piece=$(( (62 << 20) - tracked ))        # what a 64 MiB call leaves, less 2 MiB of slack
piece=$(( piece >> 20 ))M
split -b "$piece" -d -a 2 "$T" .dflash/p/t.gguf.part
sha256sum "$T" | cut -c1-64 > .dflash/target.sha256
[ -f .dflash/prompts.jsonl.xz ] || python3 tools/dflash/prompts.py --out .dflash/prompts.jsonl.xz
[ -f .dflash/body.jsonl.xz ] || python3 tools/dflash/prompts.py --kinds body --out .dflash/body.jsonl.xz
ls .dflash/gguf-*.whl > /dev/null 2>&1 ||
  python3 -m pip download -q --no-deps --only-binary=:all: -d .dflash gguf
echo "pieces of $piece: $(ls .dflash/p | wc -l); target sha256 $(cat .dflash/target.sha256)"
