#!/usr/bin/env python3
"""Self-checks of the training code on CPU, in seconds (run before spending GPU time):

1. HeadLoss (chunked LM-head cross-entropy with a recomputing backward) equals autograd's.
2. The batched training pass (many blocks per sequence, grouped, masked) gives each block the
   same hidden states as a lone block drafted after exactly its context, as kasoku drafts it.
3. An exported checkpoint reloads with the same outputs.
4. A batch comes from the prompts' text with probability --text-share, else from the answers.
5. regen.py's static-cache decoder (decode.py, eager on CPU) gives `model.generate`'s greedy
   tokens, token for token, on the tiny target (left-padded rows of different lengths, stop
   tokens met mid-row); its top-p filter keeps the tokens transformers' keeps.
7. A checkpoint `kasoku quantize` wrote (m and l) reads back (kasoku_format.py) within the
   formats' rounding of the original, so a shipped drafter can seed training (needs a built
   kasoku: target/release/kasoku or $KASOKU; skipped without one).

  python tools/dflash/selftest.py
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import decode  # noqa: E402
import model as dmodel  # noqa: E402
import regen  # noqa: E402
import target as targets  # noqa: E402
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


def check_kasoku_format():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    kasoku = os.environ.get("KASOKU", os.path.join(root, "target", "release", "kasoku"))
    if not os.path.exists(kasoku):
        print(f"selftest: no {kasoku}; kasoku_format check skipped")
        return
    config = dmodel.make_config(hidden=256, layers=1, heads=4, kv_heads=2, head_dim=64,
                                intermediate=128, vocab=100, target_layers=4, block_size=4,
                                mask_token_id=99, taps=[1, 2], rope_theta=1e4)
    d = dmodel.DFlashDrafter(config)
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "bf16")
        dmodel.export(d, src, dtype=torch.float32)
        want = dmodel.load(src).state_dict()
        for fmt, bound in (("m", 0.15), ("l", 0.01)):
            out = os.path.join(tmp, fmt)
            subprocess.run([kasoku, "quantize", src, out, "--format", fmt], check=True,
                           capture_output=True)
            got = dmodel.load(out).state_dict()
            errs = {k: ((got[k] - want[k]).norm() / want[k].norm()).item() for k in want}
            quantized = [k for k in want if errs[k] > 0]
            assert "fc.weight" in quantized and len(quantized) >= 5, (fmt, errs)
            assert max(errs.values()) < bound, (fmt, errs)


def check_text_share():
    import random
    texts = train.Sequences([], 64, 4, [torch.arange(10)] * 3)
    answers = train.Sequences([], 64, 4, [torch.arange(20)] * 3)
    rng = random.Random(0)
    picks = [train.pick_pool(rng, texts, answers, 0.3) is texts for _ in range(4000)]
    assert abs(sum(picks) / len(picks) - 0.3) < 0.03, sum(picks)
    none = train.Sequences([], 64, 4)
    assert all(train.pick_pool(rng, none, answers, 0.9) is answers for _ in range(50))
    assert all(train.pick_pool(rng, texts, answers, 1.0) is texts for _ in range(50))


def check_decode_equals_generate():
    m = targets.load_target("tiny", "cpu", torch.float32)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 151000, (n,), generator=g).tolist() for n in (5, 17, 9, 30, 1)]
    free = regen.hf_generate(m, prompts, 24, False, [151643], 0)
    stop = [free[0][5], free[2][10]]  # tokens the rows reach, so rows end at different steps
    ref = regen.hf_generate(m, prompts, 24, False, stop, 0)
    assert len({len(r) for r in ref}) > 1, ref
    dec = decode.StaticDecoder(m, 8, 64, graphs=False, len_step=16)
    assert dec.generate(prompts, 24, False, stop, 0) == ref
    res = regen.compare(m, dec, prompts, 24, stop, 0)
    assert res["same_rows"] == len(prompts) and res["tf_agree"] == 1.0, res
    sampled = dec.generate(prompts, 24, True, stop, 0)  # runs, and stops like the greedy rows
    assert all(0 < len(r) <= 24 and (len(r) == 24 or r[-1] in stop) for r in sampled)


def check_top_p():
    from transformers.generation.logits_process import TopPLogitsWarper
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(6, 1000, generator=g) * torch.tensor([0.3, 1, 2, 4, 8, 30])[:, None]
    for p in (0.5, 0.95):
        ref = TopPLogitsWarper(p)(torch.zeros(6, 1, dtype=torch.long), logits / 0.7)
        mine = decode.top_p_filter(logits / 0.7, p)
        assert torch.equal(torch.isinf(ref), torch.isinf(mine)), p


if __name__ == "__main__":
    check_head_loss()
    check_batched_equals_single()
    check_export_roundtrip()
    check_text_share()
    check_decode_equals_generate()
    check_top_p()
    check_kasoku_format()
    print("selftest: ok")
