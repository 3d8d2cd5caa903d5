#!/usr/bin/env python3
"""Regenerates a DFlash drafter's training data with the target itself: the target's own answers
to the prompts of prompts.py (chat requests through its chat template, raw code continued as
is), greedy for most, sampled (temperature 0.7, top-p 0.95) for a share, so the drafter learns
the distribution it will draft for.

Work is cut into shards of `--shard-size` prompts (in the prompts file's order, per split);
a shard is written when complete (`<split>-NNNNN.npz`, or `<split>-<tag>-NNNNN.npz` with
`--tag`; compressed: the sequences' token ids
end to end, their offsets, prompt lengths, kinds and whether sampled; a few MiB, under the
16 MiB a GPU machine returns per file) and skipped when it exists, so runs in separate time
windows continue one another. `--time` stops starting
new batches after that many seconds. Several processes can share one GPU (`--worker i --workers
n`: each takes every n-th shard), which paid with `generate`, bound by kernel launches more
than by the GPU.

Engines (`--engine`): on a GPU, decode.py's loop with a static KV cache and the decode step in
a CUDA graph (untested on a GPU so far); it first runs a few prompts through both it and
`model.generate` and falls back to `generate`, with a warning, if they disagree or if it
raises (also later, mid-run). `--engine hf` is `generate` alone. Both write the same shards.

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
    if "text" in p:  # raw code (complete, body): continued as it is
        return tok(p["text"], add_special_tokens=False).input_ids
    ids = tok.apply_chat_template(p["messages"], add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


def is_sampled(p: dict, share: float) -> bool:
    key = f"{p.get('source')}|{p.get('function')}|{p['kind']}|{p.get('messages', p.get('text'))}"
    h = int(hashlib.sha256(key.encode()).hexdigest()[:8], 16)
    return h % 10000 < share * 10000


@torch.no_grad()
def hf_generate(model, batch: list[list[int]], max_new: int, sampled: bool, stop: list[int],
                pad: int):
    """`model.generate` on a left-padded batch; each row's new tokens, cut after a stop token."""
    dev = next(model.parameters()).device
    width = max(len(x) for x in batch)
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


def compare(model, dec, batch: list[list[int]], max_new: int, stop: list[int], pad: int):
    """Greedy `generate` against the static-cache decoder `dec` on the same prompts: how many
    rows came out identical, and the share of `generate`'s tokens the decoder predicts when fed
    `generate`'s own tokens (teacher-forced: one near-tie in bf16 then costs one token, not the
    rest of the row)."""
    ref = hf_generate(model, batch, max_new, False, stop, pad)
    mine = dec.generate(batch, max_new, False, stop, pad)
    force = torch.full((len(batch), max_new), pad, dtype=torch.long)
    for i, r in enumerate(ref):
        force[i, :len(r)] = torch.tensor(r, dtype=torch.long)
    pred = dec.generate(batch, max_new, False, stop, pad, force=force)
    hits = sum(int((pred[i, :len(r)] == force[i, :len(r)]).sum()) for i, r in enumerate(ref))
    return {"rows": len(ref), "same_rows": sum(a == b for a, b in zip(ref, mine)),
            "tf_agree": round(hits / max(1, sum(len(r) for r in ref)), 4)}


def start_engine(model, tok, prompts, args, stop, pad):
    """The static-cache decoder, if a few of the prompts come out of it as out of `generate`
    (see `compare`); None, with a warning, if they do not or if building it raises."""
    import decode
    enc = [x for x in (encode(tok, p) for p in prompts[:64]) if 0 < len(x) <= args.max_prompt]
    sample = sorted(enc, key=len)[::max(1, len(enc) // 4)][:4]
    try:
        dec = decode.StaticDecoder(model, args.batch, args.max_prompt + args.max_new,
                                   graphs=True)
        res = compare(model, dec, sample, 24, stop, pad)
    except Exception as e:  # noqa: BLE001 - any failure means: use generate
        print(f"[regen] WARNING: the graph engine failed its startup check ({e!r}); using "
              "model.generate", flush=True)
        return None
    ok = res["tf_agree"] >= args.check_min
    print(json.dumps({"engine_check": res, "graphs": dec.graphs, "ok": ok,
                      "kv_cache_gib": round(dec.buffer.numel() * dec.buffer.element_size()
                                            / 2**30, 2)}), flush=True)
    if not ok:
        print("[regen] WARNING: the graph engine disagrees with model.generate; using "
              "model.generate", flush=True)
        dec = None
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return dec


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True, help="GGUF file, HF directory, or 'tiny'")
    ap.add_argument("--tokenizer", default="", help="default: the target's own")
    ap.add_argument("--target-cache", default="", help="dequantized target cache (torch file)")
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--split", default="train", choices=["train", "val"])
    ap.add_argument("--tag", default="",
                    help="shards named <split>-<tag>-NNNNN.npz: a second prompts file's "
                         "(e.g. prompts.py --kinds body) beside the default one's")
    ap.add_argument("--shard-size", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=512,
                    help="sequences per batch; with generate on the H200 a step took 0.23-0.31 s "
                         "at 160 and at 256 alike, so wider batches buy throughput. The graph "
                         "engine's KV cache holds batch x (max-prompt + max-new) slots: 30 GB "
                         "at 512 for the 1.5B")
    ap.add_argument("--max-prompt", type=int, default=1536)
    ap.add_argument("--max-new", type=int, default=512)
    ap.add_argument("--sampled", type=float, default=0.25, help="share of sampled answers")
    ap.add_argument("--time", type=float, default=1500.0, help="seconds before stopping")
    ap.add_argument("--max-shards", type=int, default=0)
    ap.add_argument("--worker", type=int, default=0,
                    help="this process's index among --workers sharing the shards")
    ap.add_argument("--workers", type=int, default=1,
                    help="processes regenerating at once: each takes every n-th shard")
    ap.add_argument("--engine", default="auto", choices=["auto", "graph", "hf"],
                    help="graph: decode.py's static-cache loop (CUDA graphs on a GPU, eager on "
                         "CPU), checked against generate at startup, falling back to hf if they "
                         "disagree; hf: model.generate; auto: graph on a GPU, hf on CPU")
    ap.add_argument("--check-min", type=float, default=0.9,
                    help="the startup check's least teacher-forced agreement with generate")
    ap.add_argument("--cpu", action="store_true")
    args = ap.parse_args(argv)
    t0 = time.time()
    # The target first, even when no shard is left to do: window.sh's first call writes the
    # dequantized cache (--target-cache) that the processes after it read.
    dev = "cuda" if torch.cuda.is_available() and not args.cpu else "cpu"
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    model = targets.load_target(args.target, dev, dtype, args.target_cache or None)
    tok = targets.load_tokenizer(args.tokenizer or args.target)
    stop = [t for t in {tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>"),
                        tok.convert_tokens_to_ids("<|endoftext|>")}
            if isinstance(t, int) and t >= 0 and t != tok.unk_token_id]
    pad = tok.pad_token_id if tok.pad_token_id is not None else stop[0]
    prompts = read_prompts(args.prompts, args.split)
    os.makedirs(args.out, exist_ok=True)
    shards = (len(prompts) + args.shard_size - 1) // args.shard_size

    def shard_path(k):
        name = f"{args.split}-{args.tag}-{k:05d}" if args.tag else f"{args.split}-{k:05d}"
        return os.path.join(args.out, name + ".npz")

    todo = [k for k in range(shards) if not (args.max_shards and k >= args.max_shards)
            and k % args.workers == args.worker and not os.path.exists(shard_path(k))]
    if not todo:
        # Every shard exists (kept from earlier windows): no engine to start and check (its
        # graph captures cost a minute or more on a GPU).
        print(json.dumps({"shards": shards, "todo": 0}), flush=True)
        return
    engine = args.engine if args.engine != "auto" else ("graph" if dev == "cuda" else "hf")
    dec = None
    if engine == "graph":
        dec = start_engine(model, tok, prompts, args, stop, pad)
    done_tokens = 0
    for k in todo:
        path = shard_path(k)
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
                batch = [e[0] for e in chunk]
                new = None
                if dec is not None:
                    try:
                        new = dec.generate(batch, args.max_new, sampled, stop, pad)
                    except Exception as e:  # noqa: BLE001 - any failure: generate takes over
                        print(f"[regen] WARNING: the graph engine failed ({e!r}); falling back "
                              "to model.generate", flush=True)
                        dec = None
                        torch.cuda.empty_cache() if dev == "cuda" else None
                if new is None:
                    new = hf_generate(model, batch, args.max_new, sampled, stop, pad)
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
