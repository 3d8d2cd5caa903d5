#!/usr/bin/env python3
"""Trains a DFlash drafter for a frozen target on the target's own regenerated answers
(regen.py), resumable across time windows, and exports it in the published layout kasoku loads
(`kasoku run --model TARGET --draft OUT/drafter`).

Objective (research/speculative.md §1.3): per sequence, `--anchors` block starts a are drawn in
the answer (from the last prompt token on). A block is [token at a, MASK × (B−1)] at positions
a..a+B−1; it sees the context rows of positions < a and its own rows. Block row k predicts the
target's greedy next token at a+k−1 (computed in the same target pass as the tapped features),
through the target's frozen LM head, with weight exp(−(k−1)/γ). All blocks of a batch are one
masked pass, `--group` blocks per attention call.

Each call trains for `--time` seconds; the learning-rate schedule (warm-up, then cosine to a
tenth) spans `--total-time` seconds over all calls. Two ways to continue in a later call:
`--state` (the drafter in f32, the optimizer and the counters: ~12 bytes per parameter, for a
machine that keeps its disk), or `--init OUT/drafter` (the exported drafter and its
train_state.json: 2 bytes per parameter, small enough to come back from a GPU machine; the
optimizer restarts with a short warm-up of `--rewarmup` steps).

Every call ends with a validation (teacher-forced acceptance on held-out sequences: 1 + the
number of leading correct drafts per block, and the hit rate per position) and an export to
OUT/drafter; train_log.jsonl records each step's elapsed time, so acceptance per hour of
training can be read off it.

  python tools/dflash/train.py --target MODEL.gguf --target-cache target.pt \\
      --data regen/ --out out/ --state out/state.pt --time 1500 --total-time 9000
"""
from __future__ import annotations

import argparse
import glob
import json
import math
import os
import random
import re
import shutil
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model as dmodel  # noqa: E402
import target as targets  # noqa: E402


class HeadLoss(torch.autograd.Function):
    """Weighted cross-entropy of rows h [R, H] through a frozen head W [V, H], in chunks of rows,
    never holding more than one chunk's logits: the backward pass recomputes them. Also returns
    whether each row's argmax is its label."""

    @staticmethod
    def forward(ctx, h, w, labels, weights, chunk):
        loss = torch.zeros((), dtype=torch.float32, device=h.device)
        hits = torch.empty(h.shape[0], dtype=torch.bool, device=h.device)
        for i in range(0, h.shape[0], chunk):
            logits = (h[i:i + chunk] @ w.T).float()
            lab = labels[i:i + chunk]
            lse = torch.logsumexp(logits, dim=-1)
            picked = logits.gather(1, lab[:, None])[:, 0]
            loss += ((lse - picked) * weights[i:i + chunk]).sum()
            hits[i:i + chunk] = logits.argmax(-1) == lab
        ctx.save_for_backward(h, w, labels, weights)
        ctx.chunk = chunk
        ctx.mark_non_differentiable(hits)
        return loss, hits

    @staticmethod
    def backward(ctx, grad_loss, _grad_hits):
        h, w, labels, weights = ctx.saved_tensors
        grad = torch.empty_like(h)
        for i in range(0, h.shape[0], ctx.chunk):
            logits = (h[i:i + ctx.chunk] @ w.T).float()
            p = torch.softmax(logits, dim=-1)
            p[torch.arange(p.shape[0], device=p.device), labels[i:i + ctx.chunk]] -= 1.0
            p *= (weights[i:i + ctx.chunk] * grad_loss)[:, None]
            grad[i:i + ctx.chunk] = (p.to(w.dtype) @ w).to(h.dtype)
        return grad, None, None, None, None


class Sequences:
    """Regenerated sequences (prompt + the target's answer) from shards, or `extra` token
    sequences anchored anywhere (prompt length 0), bucketed by length."""

    def __init__(self, paths: list[str], seqlen: int, block: int, extra=()):
        items = [(t[:seqlen], 0, "text") for t in extra if len(t[:seqlen]) > block + 1]
        for p in paths:
            with np.load(p) as shard:
                tokens, offsets = shard["tokens"].astype(np.int64), shard["offsets"]
                plens = shard["prompt_len"].tolist()
                kinds = shard["kind"].tolist() if "kind" in shard.files else ["?"] * len(plens)
            for j, plen in enumerate(plens):
                toks = torch.from_numpy(tokens[offsets[j]:offsets[j + 1]][:seqlen].copy())
                if len(toks) - block >= max(1, plen - 1):
                    items.append((toks, plen, str(kinds[j])))
        items.sort(key=lambda x: len(x[0]))
        self.items = [(t, plen) for t, plen, _ in items]
        # The prompt kind of each item (prompts.py's instruct / edit / complete; "text" for
        # the prompts' own text), for validation by kind.
        self.kinds = [k for _, _, k in items]
        self.tokens = sum(len(t) for t, _ in self.items)

    def __len__(self):
        return len(self.items)

    def batch(self, rng: random.Random, token_budget: int):
        """Sequences of similar length, right-padded: (ids [N, T], lengths, prompt lengths)."""
        i = rng.randrange(len(self.items))
        longest = len(self.items[i][0])
        n = max(1, token_budget // longest)
        lo = max(0, min(i - n + 1, len(self.items) - n))
        return self.pack(self.items[lo:lo + n])

    @staticmethod
    def pack(items):
        width = max(len(t) for t, _ in items)
        ids = torch.zeros((len(items), width), dtype=torch.long)
        for j, (t, _) in enumerate(items):
            ids[j, :len(t)] = t
        return ids, [len(t) for t, _ in items], [p for _, p in items]


def pick_pool(rng: random.Random, texts: Sequences, answers: Sequences, share: float):
    """The pool a batch comes from: the prompts' text with probability `share` (when there is
    any), else the regenerated answers. Each pool is bucketed by length on its own."""
    return texts if len(texts) and rng.random() < share else answers


def prompt_texts(path: str, target: str) -> list[torch.Tensor]:
    """The train-split prompts of prompts.py as token sequences (chat requests through the
    target's chat template, raw code as is): real text whose labels the target gives."""
    import regen
    tok = targets.load_tokenizer(target)
    return [torch.tensor(regen.encode(tok, p), dtype=torch.long)
            for p in regen.read_prompts(path, "train")]


def draw_anchors(lengths, plens, count, block, gen: torch.Generator):
    """[N, count] block starts in [max(1, prompt_len − 1), length − block], and their weights
    (0 where a sequence has no room)."""
    rows, ok = [], []
    for length, plen in zip(lengths, plens):
        lo, hi = max(1, plen - 1), length - block
        if hi < lo:
            rows.append(torch.ones(count, dtype=torch.long))
            ok.append(0.0)
            continue
        rows.append(torch.randint(lo, hi + 1, (count,), generator=gen))
        ok.append(1.0)
    return torch.stack(rows), torch.tensor(ok)


def block_loss(drafter, taps, ids, lengths, anchors, seq_ok, gamma, group, chunk, amp):
    """Loss of one batch (normalised weighted CE) and hits [N, A, B−1]."""
    dev = ids.device
    n, t = ids.shape
    b = drafter.block_size
    a = anchors.shape[1]
    mask_pad = (torch.arange(t, device=dev)[None] < torch.tensor(lengths, device=dev)[:, None])
    feats, nxt = taps(ids, attention_mask=mask_pad.long())
    k = torch.arange(1, b, device=dev)
    labels = nxt.gather(1, (anchors[:, :, None] + k - 1).reshape(n, -1)).view(n, a, b - 1)
    blocks = torch.full((n, a, b), drafter.mask_token_id, dtype=torch.long, device=dev)
    blocks[:, :, 0] = ids.gather(1, anchors)
    emb = F.embedding(blocks.view(n, a * b), taps.embed)
    g = min(group, a)
    while a % g:
        g -= 1
    groups = a // g
    with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=amp):
        ctx = drafter.context(feats.to(drafter.fc.weight.dtype) if not amp else feats)
        hd = ctx.shape[-1]
        pos_c = torch.arange(t, device=dev)[None].expand(n, t)
        anc = anchors.view(n * groups, g)
        pos_q = (anc[:, :, None] + torch.arange(b, device=dev)).view(n * groups, g * b)
        q_anchor = anc.repeat_interleave(b, dim=1)
        see_ctx = torch.arange(t, device=dev)[None, None] < q_anchor[:, :, None]
        same = torch.arange(g * b, device=dev) // b
        see_blk = (same[:, None] == same[None, :])[None].expand(n * groups, g * b, g * b)
        mask = torch.cat([see_ctx, see_blk], dim=-1)
        emb_g = emb.view(n * groups, g * b, hd).to(ctx.dtype)
        out = drafter(ctx, pos_c, emb_g, pos_q, mask, groups)
    out = out.view(n, a, b, hd)[:, :, 1:].reshape(-1, hd)
    w_pos = torch.exp(-(k.float() - 1) / gamma)
    weights = (seq_ok.to(dev)[:, None, None] * w_pos[None, None]).expand(n, a, b - 1)
    weights = (weights / weights.sum().clamp_min(1e-9)).reshape(-1)
    head = taps.head
    loss, hits = HeadLoss.apply(out.to(head.dtype), head, labels.reshape(-1), weights, chunk)
    return loss, hits.view(n, a, b - 1)


def accept_stats(hits, seq_ok):
    """Per-position hit rate and teacher-forced acceptance (1 + leading hits) of valid blocks."""
    h = hits[seq_ok.bool()].reshape(-1, hits.shape[-1]).float()
    if h.numel() == 0:
        return [], 0.0
    return h.mean(0).tolist(), float((1 + h.cumprod(1).sum(1)).mean())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True, help="GGUF file, HF directory, or 'tiny'")
    ap.add_argument("--target-cache", default="")
    ap.add_argument("--data", required=True, help="directory of regen.py shards")
    ap.add_argument("--out", required=True)
    ap.add_argument("--state", default="", help="training state: resumed from, saved to")
    ap.add_argument("--init", default="", help="continue from an exported drafter directory "
                    "(its train_state.json holds the counters); fresh optimizer")
    ap.add_argument("--rewarmup", type=int, default=100,
                    help="steps of learning-rate warm-up after --init")
    ap.add_argument("--export-split-mib", type=int, default=0,
                    help="write the exported weights in pieces of at most this many MiB")
    ap.add_argument("--time", type=float, default=1500.0, help="seconds of training this call")
    ap.add_argument("--total-time", type=float, default=0.0,
                    help="seconds the schedule spans over all calls (default: this call)")
    ap.add_argument("--max-steps", type=int, default=0)
    ap.add_argument("--text", default="",
                    help="also train on the text of the train-split prompts (prompts.py's file), "
                         "anchored anywhere: ground-truth code with the target's own labels")
    ap.add_argument("--text-share", type=float, default=0.3,
                    help="share of batches drawn from the --text sequences (the rest from the "
                         "regenerated answers); pooled, the text (most of the data, and easier) "
                         "dominated: teacher-forced tau 4-5 on training batches, 1.15 held out")
    ap.add_argument("--reload-every", type=int, default=0,
                    help="every N steps, take in train shards written since (regen.py running "
                         "alongside)")
    ap.add_argument("--export-every", type=float, default=0.0,
                    help="also export the drafter every that many seconds (a window that may "
                         "be cut short still leaves one)")
    ap.add_argument("--seqlen", type=int, default=2048)
    ap.add_argument("--batch-tokens", type=int, default=16384,
                    help="tokens per step (1.5B target on an H200: 16384 peaks at 69 GiB; "
                         "49152 runs out of memory)")
    ap.add_argument("--anchors", type=int, default=64, help="blocks per sequence")
    ap.add_argument("--group", type=int, default=16, help="blocks per attention call")
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--gamma", type=float, default=7.0)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--intermediate", type=int, default=1024)
    ap.add_argument("--taps", default="", help="target layers, comma-separated (default: 3 "
                    "evenly spaced from 1 to L-3)")
    ap.add_argument("--mask-id", type=int, default=-1,
                    help="mask token (default: 151665 for a 151936-row Qwen2.5 vocabulary, "
                    "else the last row)")
    ap.add_argument("--lr", type=float, default=6e-4)
    ap.add_argument("--warmup", type=float, default=0.04)
    ap.add_argument("--chunk", type=int, default=8192, help="rows per LM-head chunk")
    ap.add_argument("--log-every", type=int, default=20)
    ap.add_argument("--val-every", type=int, default=500)
    ap.add_argument("--val-sequences", type=int, default=64)
    ap.add_argument("--max-mb", type=float, default=50.0, help="warn above this export size")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cpu", action="store_true")
    args = ap.parse_args(argv)

    dev = torch.device("cuda" if torch.cuda.is_available() and not args.cpu else "cpu")
    amp = dev.type == "cuda"
    tdtype = torch.bfloat16 if amp else torch.float32
    os.makedirs(args.out, exist_ok=True)
    logf = open(os.path.join(args.out, "train_log.jsonl"), "a")

    def log(d):
        line = json.dumps(d)
        print(line, flush=True)
        logf.write(line + "\n")
        logf.flush()

    t_load = time.time()
    target = targets.load_target(args.target, dev, tdtype, args.target_cache or None)
    tc = target.config
    state = torch.load(args.state, map_location="cpu", weights_only=False) \
        if args.state and os.path.exists(args.state) else None
    init_counters = None
    if args.init and not state:
        init_drafter = dmodel.load(args.init)
        config = init_drafter.config
        with open(os.path.join(args.init, "train_state.json")) as f:
            init_counters = json.load(f)
    if state:
        config = state["config"]
    elif args.init:
        pass
    else:
        taps = [int(x) for x in args.taps.split(",")] if args.taps else \
            dmodel.default_taps(tc.num_hidden_layers, 3)
        mask_id = args.mask_id if args.mask_id >= 0 else \
            (151665 if tc.vocab_size == 151936 else tc.vocab_size - 1)
        config = dmodel.make_config(
            hidden=tc.hidden_size, layers=args.layers, heads=args.heads, kv_heads=args.kv_heads,
            head_dim=args.head_dim, intermediate=args.intermediate, vocab=tc.vocab_size,
            target_layers=tc.num_hidden_layers, block_size=args.block, mask_token_id=mask_id,
            taps=taps, rope_theta=float(getattr(tc, "rope_theta", None) or 1e6),
            rms_norm_eps=tc.rms_norm_eps,
            max_position_embeddings=int(getattr(tc, "max_position_embeddings", 32768)))
    taps_runner = targets.Taps(target, config["dflash_config"]["target_layer_ids"])
    torch.manual_seed(args.seed)
    drafter = dmodel.DFlashDrafter(config).to(dev)
    if args.init and not state:
        drafter.load_state_dict(init_drafter.state_dict())
    elif not state:
        for name, p in drafter.named_parameters():
            if not name.endswith("norm.weight"):
                torch.nn.init.normal_(p, std=0.02)
    params = sum(p.numel() for p in drafter.parameters())
    opt = torch.optim.AdamW(drafter.parameters(), lr=args.lr, betas=(0.9, 0.95),
                            weight_decay=0.01)
    counters = {"step": 0, "elapsed_s": 0.0, "tokens": 0, "blocks": 0, "calls": 0}
    rng = random.Random(args.seed)
    if state:
        drafter.load_state_dict(state["drafter"])
        opt.load_state_dict(state["optimizer"])
        counters = state["counters"]
        rng.setstate(state["rng"])
    elif init_counters:
        counters = init_counters["counters"]
        rng.seed(args.seed + counters["step"])
    rewarm = args.rewarmup if (init_counters and not state) else 0
    counters["calls"] += 1
    b = config["dflash_config"]["block_size"]
    text = prompt_texts(args.text, args.target) if args.text else []
    texts = Sequences([], args.seqlen, b, text)
    train_paths = sorted(glob.glob(os.path.join(args.data, "train-*.npz")))
    train = Sequences(train_paths, args.seqlen, b)
    # Held-out answers: the default prompts' (val-NNNNN.npz, sampled as in every window, so
    # val_tf_tau stays comparable) and a tagged prompts file's (val-<tag>-NNNNN.npz, all of
    # them, reported by kind only).
    val_paths = sorted(glob.glob(os.path.join(args.data, "val-*.npz")))
    untagged = [p for p in val_paths if re.fullmatch(r"val-\d+\.npz", os.path.basename(p))]
    val = Sequences(untagged, args.seqlen, b)
    val_tagged = Sequences([p for p in val_paths if p not in untagged], args.seqlen, b)
    if len(train) == 0:
        raise SystemExit(f"no usable train-*.npz sequences in {args.data}")

    log({"event": "start", "call": counters["calls"],
         "resumed_from": "state" if state else ("init" if init_counters else None),
         "device": str(dev), "gpu": torch.cuda.get_device_name() if dev.type == "cuda" else None,
         "load_s": round(time.time() - t_load, 1), "draft_params": params,
         "export_mb_bf16": round(2 * params / 2**20, 2), "train_sequences": len(train),
         "train_tokens": train.tokens, "text_sequences": len(texts), "text_tokens": texts.tokens,
         "text_share": args.text_share if len(texts) else 0.0, "val_sequences": len(val),
         "val_tagged_sequences": len(val_tagged),
         "config": config})
    if 2 * params / 2**20 > args.max_mb:
        log({"event": "warning", "reason": f"the bf16 export ({2 * params / 2**20:.1f} MiB) "
             f"exceeds --max-mb {args.max_mb}"})
    total = args.total_time or (counters["elapsed_s"] + args.time)

    def lr_at(t):
        f = min(1.0, t / max(total, 1e-9))
        if f < args.warmup:
            return args.lr * f / args.warmup
        p = (f - args.warmup) / (1 - args.warmup)
        return args.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * p)))

    vgen = torch.Generator().manual_seed(1234)
    val_index = list(range(0, len(val), max(1, len(val) // max(1, args.val_sequences))))
    val_index = val_index[:args.val_sequences]
    val_items = [val.items[i] for i in val_index]
    val_kinds = [val.kinds[i] for i in val_index]
    val_base = len(val_items)  # val_tf_tau and the hit rates are over these
    val_items += val_tagged.items[:args.val_sequences]
    val_kinds += val_tagged.kinds[:args.val_sequences]

    def validate():
        if not val_items:
            return {}
        drafter.eval()
        hits_all, ok_all, losses = [], [], []
        g = torch.Generator().manual_seed(99)
        with torch.no_grad():
            for i in range(0, len(val_items), 8):
                ids, lengths, plens = Sequences.pack(val_items[i:i + 8])
                anchors, ok = draw_anchors(lengths, plens, args.anchors, b, g)
                loss, hits = block_loss(drafter, taps_runner, ids.to(dev), lengths,
                                        anchors.to(dev), ok, args.gamma, args.group,
                                        args.chunk, amp)
                losses.append(loss.item())
                hits_all.append(hits.cpu())
                ok_all.append(ok)
        drafter.train()
        hits, ok = torch.cat(hits_all), torch.cat(ok_all)
        per_pos, tau = accept_stats(hits[:val_base], ok[:val_base])
        # τ by prompt kind: which kinds of answer the drafter has learned (the held-out set
        # mixes chat answers and raw continuations, and kasoku's benchmarks weigh them apart).
        by_kind = {}
        for kind in sorted(set(val_kinds)):
            rows = torch.tensor([k == kind for k in val_kinds])
            by_kind[kind] = round(accept_stats(hits[rows], ok[rows])[1], 3)
        return {"val_loss": round(sum(losses) / len(losses), 4), "val_tf_tau": round(tau, 3),
                "val_hit_rate": [round(x, 3) for x in per_pos], "val_tf_tau_by_kind": by_kind}

    del vgen
    drafter.train()
    start, base = time.time(), counters["elapsed_s"]
    window = []
    agen = torch.Generator().manual_seed(args.seed * 7919 + counters["step"])
    first_step = counters["step"]
    out_dir = os.path.join(args.out, "drafter")

    def export(last_validation):
        """The drafter in the published layout, and train_state.json beside it; its bytes.
        Written beside `out_dir` and renamed into place, so a copy taken while training runs
        (tools/dflash/watch.sh) never holds half of one export and half of another."""
        tmp, old = out_dir + ".tmp", out_dir + ".old"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        nbytes = dmodel.export(drafter, tmp, split_mib=args.export_split_mib)
        with open(os.path.join(tmp, "train_state.json"), "w") as f:
            json.dump({"counters": counters, "last_validation": last_validation}, f, indent=2)
            f.write("\n")
        shutil.rmtree(old, ignore_errors=True)
        if os.path.isdir(out_dir):
            os.replace(out_dir, old)
        os.replace(tmp, out_dir)
        shutil.rmtree(old, ignore_errors=True)
        return nbytes

    last_export = time.time()
    while time.time() - start < args.time and not (args.max_steps and
                                                    counters["step"] >= args.max_steps):
        el = base + time.time() - start
        in_call = counters["step"] - first_step
        warm = min(1.0, (in_call + 1) / rewarm) if rewarm else 1.0
        for group in opt.param_groups:
            group["lr"] = lr_at(el) * warm
        pool = pick_pool(rng, texts, train, args.text_share)
        ids, lengths, plens = pool.batch(rng, args.batch_tokens)
        anchors, ok = draw_anchors(lengths, plens, args.anchors, b, agen)
        loss, hits = block_loss(drafter, taps_runner, ids.to(dev), lengths, anchors.to(dev), ok,
                                args.gamma, args.group, args.chunk, amp)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        counters["step"] += 1
        counters["tokens"] += int(sum(lengths))
        counters["blocks"] += int(ok.sum().item() * args.anchors)
        window.append((loss.item(), gnorm.item(), accept_stats(hits.cpu(), ok)[1]))
        if counters["step"] % args.log_every == 0:
            el = base + time.time() - start
            log({"step": counters["step"], "elapsed_s": round(el, 1),
                 "loss": round(sum(w[0] for w in window) / len(window), 4),
                 "gnorm": round(sum(w[1] for w in window) / len(window), 3),
                 "train_tf_tau": round(sum(w[2] for w in window) / len(window), 3),
                 "lr": lr_at(el), "tokens": counters["tokens"],
                 "tokens_per_s": round(counters["tokens"] / max(el, 1e-9), 1)})
            window = []
        if counters["step"] % args.val_every == 0:
            log({"step": counters["step"], "elapsed_s": round(base + time.time() - start, 1),
                 **validate()})
        if args.reload_every and counters["step"] % args.reload_every == 0:
            paths = sorted(glob.glob(os.path.join(args.data, "train-*.npz")))
            if paths != train_paths:
                # A shard is renamed into place only once complete, so every listed one is whole.
                train_paths, train = paths, Sequences(paths, args.seqlen, b)
                log({"event": "data", "step": counters["step"], "train_shards": len(paths),
                     "train_sequences": len(train), "train_tokens": train.tokens})
        if args.export_every and time.time() - last_export > args.export_every:
            last_export = time.time()
            counters["elapsed_s"] = base + time.time() - start
            export(None)
            log({"event": "export", "step": counters["step"],
                 "elapsed_s": round(counters["elapsed_s"], 1)})
    counters["elapsed_s"] = base + time.time() - start
    if args.state:
        torch.save({"config": config, "drafter": drafter.state_dict(),
                    "optimizer": opt.state_dict(), "counters": counters,
                    "rng": rng.getstate()}, args.state + ".tmp")
        os.replace(args.state + ".tmp", args.state)
    final = validate()
    nbytes = export(final)
    log({"event": "end", **counters, "hours": round(counters["elapsed_s"] / 3600, 3),
         **final, "export_bytes": nbytes,
         "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1)
         if dev.type == "cuda" else None})


if __name__ == "__main__":
    main()
