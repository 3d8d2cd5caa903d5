#!/usr/bin/env python3
"""Regenerates a DFlash drafter's training data with the target itself: the target's own answers
to the prompts of prompts.py (chat requests through its chat template, raw code continued as
is), greedy for most, sampled (temperature 0.7, top-p 0.95) for a share, so the drafter learns
the distribution it will draft for.

Work is cut into shards of `--shard-size` prompts (in the prompts file's order, per split);
a shard is written when complete (`<split>-NNNNN.npz`, compressed: the sequences' token ids
end to end, their offsets, prompt lengths, kinds and whether sampled; a few MiB, under the
16 MiB a GPU machine returns per file) and skipped when it exists, so runs in separate time
windows continue one another. `--time` stops starting
new batches after that many seconds. Several processes can share one GPU (`--worker i --workers
n`: each takes every n-th shard), which pays because batched generation is bound by kernel
launches more than by the GPU.

  python tools/dflash/regen.py --target MODEL.gguf --prompts prompts.jsonl.xz --out regen/ \\
      --split train --time 1500 [--target-cache target.pt] [--batch 256]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import target as targets  # noqa: E402


def read_prompts(path: str, split: str) -> list[dict]:
    with lzma.open(path, "rt") as f:
        return [p for p in map(json.loads, f) if p["split"] == split]


def encode(tok, p: dict) -> list[int]:
    if p["kind"] == "complete":
        return tok(p["text"], add_special_tokens=False).input_ids
    ids = tok.apply_chat_template(p["messages"], add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


def is_sampled(p: dict, share: float) -> bool:
    key = f"{p.get('source')}|{p.get('function')}|{p['kind']}|{p.get('messages', p.get('text'))}"
    h = int(hashlib.sha256(key.encode()).hexdigest()[:8], 16)
    return h % 10000 < share * 10000


@torch.no_grad()
def generate(model, tok, batch: list[list[int]], max_new: int, sampled: bool, stop: list[int]):
    """Left-padded batched generation; returns each row's new tokens, cut after a stop token."""
    dev = next(model.parameters()).device
    width = max(len(x) for x in batch)
    pad = tok.pad_token_id if tok.pad_token_id is not None else stop[0]
    ids = torch.full((len(batch), width), pad, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for i, x in enumerate(batch):
        ids[i, width - len(x):] = torch.tensor(x)
        mask[i, width - len(x):] = 1
    kw = dict(do_sample=True, temperature=0.7, top_p=0.95, top_k=0) if sampled else \
        dict(do_sample=False, temperature=None, top_p=None, top_k=None)
    out = model.generate(input_ids=ids.to(dev), attention_mask=mask.to(dev),
                         max_new_tokens=max_new, eos_token_id=stop, pad_token_id=pad, **kw)
    rows = []
    for r in out[:, width:].tolist():
        cut = next((i + 1 for i, t in enumerate(r) if t in stop), len(r))
        rows.append(r[:cut])
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True, help="GGUF file, HF directory, or 'tiny'")
    ap.add_argument("--tokenizer", default="", help="default: the target's own")
    ap.add_argument("--target-cache", default="", help="dequantized target cache (torch file)")
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--split", default="train", choices=["train", "val"])
    ap.add_argument("--shard-size", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=512,
                    help="sequences per generate call; on the H200 a step took 0.23-0.31 s at "
                         "160 and at 256 alike, so wider batches buy throughput")
    ap.add_argument("--max-prompt", type=int, default=1536)
    ap.add_argument("--max-new", type=int, default=512)
    ap.add_argument("--sampled", type=float, default=0.25, help="share of sampled answers")
    ap.add_argument("--time", type=float, default=1500.0, help="seconds before stopping")
    ap.add_argument("--max-shards", type=int, default=0)
    ap.add_argument("--worker", type=int, default=0,
                    help="this process's index among --workers sharing the shards")
    ap.add_argument("--workers", type=int, default=1,
                    help="processes regenerating at once: each takes every n-th shard")
    ap.add_argument("--cpu", action="store_true")
    args = ap.parse_args(argv)
    t0 = time.time()
    dev = "cuda" if torch.cuda.is_available() and not args.cpu else "cpu"
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    model = targets.load_target(args.target, dev, dtype, args.target_cache or None)
    tok = targets.load_tokenizer(args.tokenizer or args.target)
    stop = [t for t in {tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>"),
                        tok.convert_tokens_to_ids("<|endoftext|>")}
            if isinstance(t, int) and t >= 0 and t != tok.unk_token_id]
    prompts = read_prompts(args.prompts, args.split)
    os.makedirs(args.out, exist_ok=True)
    shards = (len(prompts) + args.shard_size - 1) // args.shard_size
    done_tokens = 0
    for k in range(shards):
        if args.max_shards and k >= args.max_shards:
            break
        if k % args.workers != args.worker:
            continue
        path = os.path.join(args.out, f"{args.split}-{k:05d}.npz")
        if os.path.exists(path):
            continue
        if time.time() - t0 > args.time:
            break
        part = prompts[k * args.shard_size:(k + 1) * args.shard_size]
        enc = [(encode(tok, p), is_sampled(p, args.sampled), p["kind"]) for p in part]
        enc = [e for e in enc if 0 < len(e[0]) <= args.max_prompt]
        seqs, plens, kinds, samp = [], [], [], []
        for sampled in (False, True):
            group = sorted((e for e in enc if e[1] == sampled), key=lambda e: len(e[0]))
            for i in range(0, len(group), args.batch):
                chunk = group[i:i + args.batch]
                new = generate(model, tok, [e[0] for e in chunk], args.max_new, sampled, stop)
                for (ids, _, kind), ans in zip(chunk, new):
                    seqs.append(np.asarray(ids + ans, dtype=np.uint32))
                    plens.append(len(ids))
                    kinds.append(kind)
                    samp.append(sampled)
                    done_tokens += len(ans)
        offsets = np.cumsum([0] + [len(x) for x in seqs]).astype(np.int64)
        tokens = np.concatenate(seqs) if seqs else np.zeros(0, dtype=np.uint32)
        np.savez_compressed(path + ".tmp.npz", tokens=tokens, offsets=offsets,
                            prompt_len=np.asarray(plens, dtype=np.int64),
                            kind=np.asarray(kinds), sampled=np.asarray(samp, dtype=bool))
        os.replace(path + ".tmp.npz", path)
        el = time.time() - t0
        print(json.dumps({"shard": k, "of": shards, "sequences": len(seqs),
                          "new_tokens": done_tokens, "elapsed_s": round(el, 1),
                          "new_tokens_per_s": round(done_tokens / max(el, 1e-9), 1)}), flush=True)


if __name__ == "__main__":
    main()
