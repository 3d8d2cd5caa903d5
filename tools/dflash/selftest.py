#!/usr/bin/env python3
"""Self-checks of the training code on CPU, in seconds (run before spending GPU time):

1. HeadLoss (chunked LM-head cross-entropy with a recomputing backward) equals autograd's.
2. The batched training pass (many blocks per sequence, grouped, masked) gives each block the
   same hidden states as a lone block drafted after exactly its context, as kasoku drafts it.
3. An exported checkpoint reloads with the same outputs.

  python tools/dflash/selftest.py
"""
from __future__ import annotations

import os
import sys
import tempfile

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import model as dmodel  # noqa: E402
import train  # noqa: E402


def check_head_loss():
    torch.manual_seed(0)
    h = torch.randn(37, 16, dtype=torch.float64, requires_grad=True)
    w = torch.randn(50, 16, dtype=torch.float64)
    labels = torch.randint(0, 50, (37,))
    weights = torch.rand(37, dtype=torch.float64)
    loss, hits = train.HeadLoss.apply(h, w, labels, weights, 8)
    loss.backward()
    g1 = h.grad.clone()
    h.grad = None
    ref = (F.cross_entropy(h @ w.T, labels, reduction="none") * weights).sum()
    ref.backward()
    assert torch.allclose(loss.double(), ref, atol=1e-5), (loss, ref)
    assert torch.allclose(g1, h.grad, atol=1e-6)
    assert torch.equal(hits, (h @ w.T).argmax(-1) == labels)


class FakeTaps:
    """A stand-in target: fixed random features, embedding and head."""

    def __init__(self, t, width, hidden, vocab):
        g = torch.Generator().manual_seed(3)
        self.feats = torch.randn(1, t, width, generator=g, dtype=torch.float64)
        self.embed = torch.randn(vocab, hidden, generator=g, dtype=torch.float64)
        self.head = torch.randn(vocab, hidden, generator=g, dtype=torch.float64)

    def __call__(self, ids, attention_mask=None):
        n, t = ids.shape
        return self.feats[:, :t].expand(n, t, -1), torch.zeros_like(ids)


def check_batched_equals_single():
    config = dmodel.make_config(hidden=32, layers=2, heads=4, kv_heads=2, head_dim=8,
                                intermediate=48, vocab=100, target_layers=4, block_size=4,
                                mask_token_id=99, taps=[0, 2], rope_theta=1e4)
    torch.manual_seed(1)
    d = dmodel.DFlashDrafter(config).double()
    for p in d.parameters():
        torch.nn.init.normal_(p, std=0.3)
    t, b = 40, 4
    taps = FakeTaps(t, 64, 32, 100)
    ids = torch.randint(0, 99, (1, t))
    anchors = torch.tensor([[3, 9, 17, 30, 30, 36]])
    # The batched pass, as training runs it (2 groups of 3 blocks); capture its hidden states.
    seen = {}
    d.norm.register_forward_hook(lambda m, i, o: seen.__setitem__("h", o))
    train.block_loss(d, taps, ids, [t], anchors, torch.tensor([1.0]), 7.0, 3, 16, False)
    batched = seen["h"].view(1, 6, b, 32)
    ctx_all = d.context(taps.feats[0])
    for j, a in enumerate(anchors[0].tolist()):
        block = torch.full((b,), 99)
        block[0] = ids[0, a]
        alone = d(ctx_all[None, :a], torch.arange(a)[None], taps.embed[block][None],
                  torch.arange(a, a + b)[None])
        err = (alone[0] - batched[0, j]).abs().max().item()
        assert err < 1e-9, (j, a, err)


def check_export_roundtrip():
    config = dmodel.make_config(hidden=32, layers=1, heads=4, kv_heads=2, head_dim=8,
                                intermediate=48, vocab=100, target_layers=4, block_size=4,
                                mask_token_id=99, taps=[1], rope_theta=1e4)
    d = dmodel.DFlashDrafter(config)
    with tempfile.TemporaryDirectory() as tmp:
        dmodel.export(d, tmp, dtype=torch.float32)
        back = dmodel.load(tmp)
    x = torch.randn(1, 5, 32)
    ctx = d.context(torch.randn(1, 7, 32))
    args = (ctx, torch.arange(7)[None], x, torch.arange(7, 12)[None])
    assert torch.equal(d(*args), back(*args))


if __name__ == "__main__":
    check_head_loss()
    check_batched_equals_single()
    check_export_roundtrip()
    print("selftest: ok")
