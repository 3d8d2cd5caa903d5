"""Batched generation over a transformers Qwen2 model with a static KV cache, the one-token decode
step captured once per shape in a CUDA graph (regen.py's fast path; `model.generate` remains the
reference and the fallback).

Why: on the H200 one step of `generate` took 0.23-0.31 s at batch 160 and at 256 alike, so the
step was bound by per-step Python and kernel launches, not arithmetic. Here a step is one graph
replay plus a few sampling kernels.

How: the cache is one preallocated buffer viewed as [layers, 2 (k, v), B, kv_heads, L, head_dim]
for a bucket (B = rows rounded up to a power of two, at most `batch`; L = prompt width + new
tokens rounded up to `len_step`), so a handful of shapes repeat and each is captured once.
Prompts are left-padded as `generate` pads them: cache slot = column, row b's tokens start at
slot start[b], its positions count from 0 there. The prefill runs eagerly, a few rows at a time;
the decode step reads its inputs from fixed tensors (token, start, current slot) and writes the
logits into a fixed tensor, which is what lets it be replayed. torch.cuda.CUDAGraph is used
directly rather than torch.compile(mode="reduce-overhead"): no compiler to run (or to fail)
inside a 30-minute window, one capture per bucket that either works or raises, and then an
easy fallback. On CPU the same step runs eagerly.

The layers are the model's own modules (norms, projections, MLP, rotary table); only the
attention over the cache is written here. Greedy picks the argmax; sampling divides the logits
by the temperature and keeps the smallest set of most probable tokens whose mass reaches top-p,
as `generate` does. A model's generation_config (repetition penalty etc.) is not applied: the
targets built by target.py have none.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Logits with -inf outside the smallest most-probable set whose probability reaches top_p
    (at least one token kept)."""
    srt, idx = logits.sort(dim=-1, descending=True)
    p = srt.softmax(-1)
    before = p.cumsum(-1) - p  # the mass of the tokens ranked above each
    drop = before >= top_p  # top_p is reached without this token
    drop[..., 0] = False
    return logits.masked_fill(drop.scatter(-1, idx, drop), float("-inf"))


def _rotate(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class StaticDecoder:
    """Generation for one model: up to `batch` rows of prompt + new tokens within `max_len`
    slots; the KV buffer is allocated at that size on first use, a bucket's graph on its first
    batch."""

    def __init__(self, model, batch: int, max_len: int, graphs: bool, len_step: int = 256,
                 prefill_tokens: int = 32768):
        cfg = model.config
        self.model, self.inner = model, model.model
        self.dev = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.heads, self.kv = cfg.num_attention_heads, cfg.num_key_value_heads
        self.hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.layers = len(self.inner.layers)
        self.batch, self.len_step, self.prefill_tokens = batch, len_step, prefill_tokens
        self.max_len = self._round(max_len)
        self.graphs = graphs and self.dev.type == "cuda"
        pos = torch.arange(self.max_len, device=self.dev)[None]
        probe = torch.zeros(1, device=self.dev, dtype=self.dtype)
        cos, sin = self.inner.rotary_emb(probe, pos)  # the model's own rotary table, per position
        self.cos, self.sin = cos[0], sin[0]
        self.buffer = None
        self.buckets = {}
        self.pool = torch.cuda.graph_pool_handle() if self.graphs else None

    def _round(self, n):
        return -(-n // self.len_step) * self.len_step

    def _cache(self, b, length):
        n = self.layers * 2 * b * self.kv * length * self.hd
        if self.buffer is None:
            self.buffer = torch.zeros(self.layers * 2 * self.batch * self.kv * self.max_len
                                      * self.hd, device=self.dev, dtype=self.dtype)
        return self.buffer[:n].view(self.layers, 2, b, self.kv, length, self.hd)

    def _attend(self, x, layer, cache, pos, slots, mask):
        """One layer's attention for x [B, T, H] at positions pos [B, T], writing k/v to the cache
        at slots (a 1-element index: decode; a range: prefill); mask [B, 1, T, L] over slots."""
        at = layer.self_attn
        b, t, _ = x.shape
        h = layer.input_layernorm(x)
        q = at.q_proj(h).view(b, t, self.heads, self.hd).transpose(1, 2)
        k = at.k_proj(h).view(b, t, self.kv, self.hd).transpose(1, 2)
        v = at.v_proj(h).view(b, t, self.kv, self.hd).transpose(1, 2)
        cos, sin = self.cos[pos][:, None], self.sin[pos][:, None]
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        cache[0].index_copy_(2, slots, k)
        cache[1].index_copy_(2, slots, v)
        rep = self.heads // self.kv
        if t == 1:  # decode: a kv head's query heads side by side, so the cache is read once
            o = F.scaled_dot_product_attention(q.reshape(b, self.kv, rep, self.hd), cache[0],
                                               cache[1], attn_mask=mask, scale=at.scaling)
        else:
            kk = cache[0][:, :, :mask.shape[-1]].repeat_interleave(rep, dim=1)
            vv = cache[1][:, :, :mask.shape[-1]].repeat_interleave(rep, dim=1)
            o = F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask, scale=at.scaling)
        o = o.reshape(b, self.heads, t, self.hd).transpose(1, 2).reshape(b, t, -1)
        x = x + at.o_proj(o)
        return x + layer.mlp(layer.post_attention_layernorm(x))

    def _logits(self, x):
        return self.model.lm_head(self.inner.norm(x[:, -1]))

    def _prefill(self, cache, ids, start):
        """ids [B, W] left-padded into cache slots [0, W); returns the last column's logits."""
        b, w = ids.shape
        slots = torch.arange(w, device=self.dev)
        pos = (slots[None] - start[:, None]).clamp_min(0)
        causal = slots[None, :] <= slots[:, None]
        out = []
        step = max(1, self.prefill_tokens // w)
        for r in range(0, b, step):
            st = start[r:r + step]
            # A pad query sees itself, so its row stays finite (no NaN reaches the cache).
            mask = (causal[None] & (slots[None, None] >= st[:, None, None])) | \
                torch.eye(w, dtype=torch.bool, device=self.dev)[None]
            x = self.inner.embed_tokens(ids[r:r + step])
            for i, layer in enumerate(self.inner.layers):
                x = self._attend(x, layer, cache[i][:, r:r + step], pos[r:r + step], slots,
                                 mask[:, None])
            out.append(self._logits(x))
        return torch.cat(out)

    def _step(self, s):
        """The decode step over a bucket's fixed tensors: s["tok"] at slot s["cur"]."""
        cache, length = s["cache"], s["cache"].shape[-2]
        slots = torch.arange(length, device=self.dev)
        mask = (slots[None] >= s["start"][:, None]) & (slots[None] <= s["cur"])
        x = self.inner.embed_tokens(s["tok"])[:, None]
        pos = (s["cur"] - s["start"])[:, None]
        for i, layer in enumerate(self.inner.layers):
            x = self._attend(x, layer, cache[i], pos, s["cur"], mask[:, None, None])
        return self._logits(x)

    def _bucket(self, b, length):
        key = (b, length)
        if key in self.buckets:
            return self.buckets[key]
        s = {"cache": self._cache(b, length), "tok": torch.zeros(b, dtype=torch.long,
             device=self.dev), "start": torch.zeros(b, dtype=torch.long, device=self.dev),
             "cur": torch.zeros(1, dtype=torch.long, device=self.dev)}
        if self.graphs:
            # Warm up on a side stream, then capture; the garbage written at slot 0 is
            # overwritten by the prefill of the batch that follows.
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    self._step(s)
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=self.pool):
                s["logits"] = self._step(s)
            s["graph"] = g
        self.buckets[key] = s
        return s

    @torch.no_grad()
    def generate(self, batch: list[list[int]], max_new: int, sampled: bool, stop: list[int],
                 pad: int, temperature=0.7, top_p=0.95, force: torch.Tensor | None = None):
        """Each row's new tokens, cut after its first stop token. With `force` [n, max_new],
        feeds those tokens instead and returns the greedy choices [n, max_new] (a
        teacher-forced comparison)."""
        n = len(batch)
        if n > self.batch:
            raise ValueError(f"{n} rows > batch {self.batch}")
        b = min(self.batch, 1 << (n - 1).bit_length())
        w = max(len(x) for x in batch)
        length = self._round(w + max_new)
        if length > self.max_len:
            raise ValueError(f"{w} + {max_new} tokens > max_len {self.max_len}")
        s = self._bucket(b, length)
        ids = torch.full((b, w), pad, dtype=torch.long)
        start = torch.full((b,), w - 1, dtype=torch.long)
        for i, x in enumerate(batch):
            ids[i, w - len(x):] = torch.tensor(x)
            start[i] = w - len(x)
        s["start"].copy_(start)
        logits = self._prefill(s["cache"], ids.to(self.dev), s["start"])
        stops = torch.tensor(stop, device=self.dev)
        out = torch.full((b, max_new), pad, dtype=torch.long, device=self.dev)
        done = torch.arange(b, device=self.dev) >= n  # the padding rows are done from the start
        for t in range(max_new):
            if t:
                s["cur"].fill_(w + t - 1)
                if self.graphs:
                    s["graph"].replay()
                    logits = s["logits"]
                else:
                    logits = self._step(s)
            logits = logits.float()
            if sampled:
                probs = top_p_filter(logits / temperature, top_p).softmax(-1)
                nxt = torch.multinomial(probs, 1)[:, 0]
            else:
                nxt = logits.argmax(-1)
            out[:, t] = nxt
            if force is not None:
                nxt = torch.cat([force[:, t].to(self.dev), nxt[n:]])
            done |= torch.isin(nxt, stops)
            s["tok"].copy_(nxt)
            if force is None and t % 16 == 15 and bool(done.all()):
                break
        if force is not None:
            return out[:n].cpu()
        rows = []
        for r in out[:n].tolist():
            cut = next((i + 1 for i, x in enumerate(r) if x in stop), max_new)
            rows.append(r[:cut])
        return rows
