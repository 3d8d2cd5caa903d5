#!/usr/bin/env python3
"""DFlash drafter fixture: tests/fixtures/qwen2/tiny_dflash/.

A tiny random-weight DFlash drafter (published layout: config.json + model.safetensors, f32) for
the committed tiny Qwen2 target tests/fixtures/qwen2/tiny (2 layers, hidden 64, vocabulary 384 of
which 360 are tokenizer tokens), and reference.json: the drafter's marginals computed here in
float64 with tools/dflash/model.py, the target run by transformers.

It taps both target layers ([1, 0]: order matters, the features are concatenated in it), uses a
padded embedding row (370) as its mask token, a block of 8, and head_dim 8 with 4 query / 2 KV
heads. The same checkpoint fits every tiny fixture of hidden 64 and ≥ 2 layers (llama/tiny,
qwen3/tiny, qwen3_5/tiny), which the speculative-decoding tests use.

Scenario ("cycles" in reference.json): the target runs over `tokens`; its layer outputs at the
tapped layers are the features. Cycle j appends the features of positions `ctx[j-1]..ctx[j]` to
the drafter's context and drafts a block rooted at token `root[j]` at position `ctx[j]`; the
reference gives the logits (target head) of block rows 1..B-1.

  python tools/make_dflash_fixture.py        # a venv with torch, transformers, safetensors
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE / "dflash"))
import model as dmodel  # noqa: E402

TARGET = REPO / "tests" / "fixtures" / "qwen2" / "tiny"
OUT = REPO / "tests" / "fixtures" / "qwen2" / "tiny_dflash"
SEED = 15
TOKENS = [3, 17, 250, 9, 42, 42, 101, 7, 5, 300, 64, 2]
CYCLES = [(4, 42), (9, 11), (12, 359)]  # (context rows after the append, root token)


def sig8(x: float) -> float:
    return float(f"{x:.8g}")


def main() -> None:
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(TARGET, dtype=torch.float64).eval()
    tc = target.config
    config = dmodel.make_config(
        hidden=tc.hidden_size, layers=2, heads=4, kv_heads=2, head_dim=8, intermediate=96,
        vocab=tc.vocab_size, target_layers=tc.num_hidden_layers, block_size=8,
        mask_token_id=370, taps=[1, 0], rope_theta=10000.0, max_position_embeddings=256)
    torch.manual_seed(SEED)
    drafter = dmodel.DFlashDrafter(config).to(torch.float64)
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5)

    # The target's layer outputs (before the final norm), captured by hooks.
    taps = drafter.taps
    seen = {}
    hooks = [target.model.layers[l].register_forward_hook(
        lambda mod, inp, out, l=l: seen.__setitem__(l, out[0] if isinstance(out, tuple) else out))
        for l in taps]
    ids = torch.tensor([TOKENS])
    with torch.no_grad():
        target(input_ids=ids)
    for h in hooks:
        h.remove()
    features = torch.cat([seen[l] for l in taps], dim=-1)[0]  # [T, n_taps * H]

    embed = target.model.embed_tokens.weight
    head = target.lm_head.weight
    b = drafter.block_size
    cycles = []
    with torch.no_grad():
        for n_ctx, root in CYCLES:
            ctx = drafter.context(features[:n_ctx])[None]
            block = torch.full((b,), drafter.mask_token_id)
            block[0] = root
            out = drafter(ctx, torch.arange(n_ctx)[None], embed[block][None],
                          torch.arange(n_ctx, n_ctx + b)[None])
            logits = out[0, 1:] @ head.T
            cycles.append({
                "context": n_ctx,
                "root": root,
                "logits": [[sig8(v) for v in r] for r in logits.tolist()],
                "argmax": logits.argmax(-1).tolist(),
            })

    OUT.mkdir(parents=True, exist_ok=True)
    dmodel.export(drafter, str(OUT), dtype=torch.float32)
    ref = {
        "target": "qwen2/tiny",
        "tokens": TOKENS,
        "features": [[sig8(v) for v in r] for r in features.tolist()],
        "cycles": cycles,
    }
    with open(OUT / "reference.json", "w") as f:
        json.dump(ref, f)
        f.write("\n")
    print(f"wrote {OUT}: {sum(p.numel() for p in drafter.parameters())} parameters, "
          f"{len(cycles)} cycles")


if __name__ == "__main__":
    main()
