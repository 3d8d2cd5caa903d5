#!/usr/bin/env python3
"""Qwen3.5 multi-token-prediction (MTP) fixture: tests/fixtures/qwen3_5/tiny_mtp/.

The trunk is the committed tests/fixtures/qwen3_5/tiny checkpoint (copied unchanged); this adds
random `mtp.*` tensors (config `mtp_num_hidden_layers: 1`) and reference outputs of an MTP head
written here from the published description (research/qwen35.md §8.2; vLLM's
`Qwen3NextMultiTokenPredictor`, llama.cpp's `graph_mtp`):

    e  = RMSNorm_1p(embed_tokens[x_{p+1}], pre_fc_norm_embedding)
    hh = RMSNorm_1p(h_p, pre_fc_norm_hidden)          h_p: target's final-normed hidden at p
    u  = fc(concat(e, hh))                            embedding first
    u  = Qwen3_5DecoderLayer (gated full attention + dense MLP), causal over the MTP rows
    m  = RMSNorm_1p(u, mtp.norm)                      the hidden a chained step reads
    logits = lm_head(m)                               (tied: embed_tokens)

transformers ignores `mtp.*`, so the block is assembled here from transformers' own Qwen3.5 modules
(Qwen3_5DecoderLayer with a full-attention layer index, Qwen3_5RMSNorm, the trunk's rotary
embedding) and run without a cache: every step recomputes all MTP rows with a causal mask.

Positions: MTP row j pairs token x_{j+1} with h_j and is rotated at position j (vLLM's convention:
the hidden's position). RoPE is relative, so a constant shift (llama.cpp rotates at j+1) gives the
same outputs.

Scenario in reference.json ("mtp"): target forward over `tokens` (T) gives h_0..h_{T-1} and a greedy
next token x_T; ingest T rows (x_1..x_T paired with h_0..h_{T-1}); then `chain_steps` greedy chain
steps, each pairing the previous step's argmax draft token with the MTP's own previous output
hidden m (post mtp.norm).

Also converts the checkpoint with llama.cpp's converter (keeping the MTP block: blk.{n_layer}.nextn.*,
qwen35.nextn_predict_layers = 1) to model-f32.gguf.

  ~/.cache/kasoku/venv/bin/python tools/make_mtp_fixture.py [--no-gguf]
"""
from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
BASE = REPO / "tests" / "fixtures" / "qwen3_5" / "tiny"
OUT = REPO / "tests" / "fixtures" / "qwen3_5" / "tiny_mtp"
SEED = 8
CHAIN_STEPS = 3


def sig7(x: float) -> float:
    return float(f"{x:.7g}")


def rows(a: torch.Tensor) -> list[list[float]]:
    return [[sig7(v) for v in r] for r in a.detach().float().tolist()]


class MtpReference(torch.nn.Module):
    """The MTP block, from transformers' Qwen3.5 modules."""

    def __init__(self, cfg):
        super().__init__()
        from transformers.models.qwen3_5 import modeling_qwen3_5 as q

        h, eps = cfg.hidden_size, cfg.rms_norm_eps
        full = cfg.layer_types.index("full_attention")  # a layer index whose type is full attention
        self.fc = torch.nn.Linear(2 * h, h, bias=False)
        self.pre_fc_norm_embedding = q.Qwen3_5RMSNorm(h, eps=eps)
        self.pre_fc_norm_hidden = q.Qwen3_5RMSNorm(h, eps=eps)
        self.layers = torch.nn.ModuleList([q.Qwen3_5DecoderLayer(cfg, full)])
        self.norm = q.Qwen3_5RMSNorm(h, eps=eps)
        assert self.layers[0].block_type == "full_attention"

    def forward(self, trunk, tokens: list[int], hidden: torch.Tensor):
        """All MTP rows at once (positions 0..n-1, causal): (m, logits)."""
        n = len(tokens)
        ids = torch.tensor([tokens])
        e = self.pre_fc_norm_embedding(trunk.model.embed_tokens(ids))
        hh = self.pre_fc_norm_hidden(hidden[None])
        x = self.fc(torch.cat([e, hh], dim=-1))
        pos = torch.arange(n)[None]
        pe = trunk.model.rotary_emb(x, pos)
        mask = torch.full((n, n), float("-inf")).triu(1)[None, None]
        x = self.layers[0](x, position_embeddings=pe, attention_mask=mask, position_ids=pos)
        m = self.norm(x)[0]
        return m, trunk.lm_head(m)


def randomize(mod: torch.nn.Module, seed: int) -> None:
    """Same scheme as make_fixtures.randomize: matrices N(0, 1/fan_in), (1+w) norms N(0, 0.2^2)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in mod.named_parameters():
            r = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if "norm" in name:
                p.copy_(r * 0.2)
            else:
                p.copy_(r / math.sqrt(p.shape[1]))


def convert(log: list[str]) -> str | None:
    out = OUT / "model-f32.gguf"
    cmd = [sys.executable, str(HERE / "hf_to_gguf.py"), "--pre", "qwen35", "--",
           str(OUT), "--outtype", "f32", "--outfile", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0 or not out.exists():
        log.append("gguf: converter FAILED: " + " | ".join((r.stderr or r.stdout).strip().splitlines()[-6:]))
        out.unlink(missing_ok=True)
        return None
    sys.path.insert(0, str(HERE))
    import make_fixtures  # noqa: PLC0415

    sys.path.insert(0, str(make_fixtures.LLAMA_CPP / "src" / "gguf-py"))
    import gguf  # noqa: PLC0415

    rd = gguf.GGUFReader(str(out))
    names = sorted(t.name for t in rd.tensors if ".nextn." in t.name or t.name.startswith("blk.4."))
    log.append("gguf: converted (MTP kept): " + ", ".join(names))
    return out.name


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--no-gguf", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(1)
    import transformers
    from safetensors.torch import load_file, save_file

    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir(parents=True)
    for f in ["tokenizer.json", "tokenizer_config.json", "generation_config.json"]:
        shutil.copy(BASE / f, OUT / f)
    config = json.loads((BASE / "config.json").read_text())
    config["mtp_num_hidden_layers"] = 1
    (OUT / "config.json").write_text(json.dumps(config, indent=2) + "\n")

    cfg = transformers.Qwen3_5TextConfig(**{k: v for k, v in config.items() if k != "architectures"})
    cfg._attn_implementation = "eager"
    torch.manual_seed(SEED)
    mtp = MtpReference(cfg).eval()
    randomize(mtp, SEED)
    tensors = load_file(str(BASE / "model.safetensors"))
    assert not any(k.startswith("mtp.") for k in tensors)
    tensors.update({f"mtp.{k}": v.contiguous() for k, v in mtp.state_dict().items()})
    save_file(tensors, str(OUT / "model.safetensors"), metadata={"format": "pt"})

    # The trunk from disk, as transformers loads it (mtp.* ignored).
    trunk = transformers.Qwen3_5ForCausalLM.from_pretrained(
        OUT, dtype=torch.float32, attn_implementation="eager").eval()
    base_ref = json.loads((BASE / "reference.json").read_text())
    tokens: list[int] = base_ref["tokens"]
    t = len(tokens)
    with torch.no_grad():
        h = trunk.model(input_ids=torch.tensor([tokens]), use_cache=False).last_hidden_state[0]
        logits = trunk.lm_head(h)
        trunk_diff = float(np.abs(logits.numpy() - np.array(base_ref["logits"])).max())
        assert trunk_diff < 1e-4, f"trunk differs from qwen3_5/tiny's reference by {trunk_diff}"
        next_tok = int(logits[-1].argmax())

        mtp_tokens = tokens[1:] + [next_tok]
        mtp_in = h.clone()
        m, ml = mtp(trunk, mtp_tokens, mtp_in)
        for _ in range(CHAIN_STEPS):
            d = int(ml[-1].argmax())
            mtp_tokens.append(d)
            mtp_in = torch.cat([mtp_in, m[-1:]], 0)
            m2, ml2 = mtp(trunk, mtp_tokens, mtp_in)
            causal = float((m2[:-1] - m).abs().max())
            assert causal < 1e-5, f"earlier MTP rows changed by {causal}"
            m, ml = m2, ml2
        final_draft = int(ml[-1].argmax())

    ref = {
        "fixture": "qwen3_5/tiny_mtp",
        "notes": __doc__.split("\n\n")[0] + " Trunk = qwen3_5/tiny (same tensors, same logits).",
        "source": f"transformers {transformers.__version__} modules (Qwen3_5DecoderLayer etc.), torch "
                  f"{torch.__version__}, float32, eager attention, no cache (all rows recomputed per step)",
        "seed": SEED,
        "vocab_size": int(logits.shape[1]),
        "hidden_size": cfg.hidden_size,
        "tokens": tokens,
        "target_hidden": rows(h),
        "target_next_token": next_tok,
        "mtp": {
            "what": "row j: token mtp_tokens[j] with input hidden mtp_hidden_in[j] at rotary position j; rows "
                    "0..ingest_rows-1 are one ingest (hidden = target_hidden), later rows chain steps (token = "
                    "argmax of the previous row's logits, hidden = the previous row's hidden_out)",
            "ingest_rows": t,
            "chain_steps": CHAIN_STEPS,
            "tokens": mtp_tokens,
            "hidden_in": rows(mtp_in),
            "hidden_out": rows(m),
            "logits": rows(ml),
            "final_draft_token": final_draft,
        },
        "trunk_max_abs_diff_vs_tiny_reference": trunk_diff,
    }
    log: list[str] = []
    if not a.no_gguf:
        ref["gguf"] = {"file": convert(log)}
    ref["log"] = log
    with open(OUT / "reference.json", "w") as f:
        json.dump(ref, f, indent=None, separators=(",", ":"))
        f.write("\n")
    size = sum(p.stat().st_size for p in OUT.iterdir())
    print(f"qwen3_5/tiny_mtp: {t} tokens + {CHAIN_STEPS} chain steps, drafts {mtp_tokens[t:]} + "
          f"{final_draft}, {size / 1e6:.2f} MB; " + "; ".join(log))


if __name__ == "__main__":
    main()
