"""The DFlash block drafter in PyTorch, in the published checkpoint layout kasoku loads
(research/speculative.md §1.1, §1.4; kasoku's runtime: crates/kasoku/src/model/dflash.rs).

A context row for a committed token t is c_t = hidden_norm(fc([tap_1(t) | ... | tap_n(t)])),
tap_l(t) being the output of the target's decoder layer l (before the final norm). Each draft
layer is a Qwen3 decoder layer whose keys and values are computed from the context rows and from
the block's own rows with the same projections (k_norm on both, V not normed); queries come from
the block only; there is no causal mask: a block row sees every context row it is allowed and
every row of its own block. The embedding table and LM head are the target's.

Used by tools/make_dflash_fixture.py (reference marginals, float64) and
tools/dflash/train.py (training with many blocks per sequence in one masked pass).
"""
from __future__ import annotations

import json
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

import kasoku_format  # noqa: E402 (beside this file, as the tools import this one)

ARCHITECTURE = "DFlashDraftModel"


def default_taps(target_layers: int, n: int = 5) -> list[int]:
    """Evenly spaced layers from 1 to L-3 (the rule of the published checkpoints)."""
    if n == 1:
        return [target_layers // 2]
    return [int(round(1 + i * (target_layers - 4) / (n - 1))) for i in range(n)]


def make_config(*, hidden, layers, heads, kv_heads, head_dim, intermediate, vocab, target_layers,
                block_size, mask_token_id, taps, rope_theta=1e6, rms_norm_eps=1e-6,
                max_position_embeddings=32768) -> dict:
    """A config.json in the published DFlash layout."""
    return {
        "architectures": [ARCHITECTURE],
        "model_type": "qwen3",
        "attention_bias": False,
        "block_size": block_size,
        "dflash_config": {"block_size": block_size, "mask_token_id": mask_token_id,
                          "target_layer_ids": list(taps)},
        "head_dim": head_dim,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "layer_types": ["full_attention"] * layers,
        "max_position_embeddings": max_position_embeddings,
        "num_attention_heads": heads,
        "num_hidden_layers": layers,
        "num_key_value_heads": kv_heads,
        "num_target_layers": target_layers,
        "rms_norm_eps": rms_norm_eps,
        "rope_scaling": None,
        "rope_theta": rope_theta,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "vocab_size": vocab,
    }


class Norm(nn.Module):
    """RMSNorm with a learned scale, computed in float32 or wider."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        dt = x.dtype
        y = x.to(torch.promote_types(dt, torch.float32))
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * y.to(dt)


def rotary(positions, head_dim: int, theta: float, dtype):
    """cos, sin of shape [..., len, head_dim] (rotate-half pairing)."""
    exps = torch.arange(0, head_dim, 2, dtype=torch.float64, device=positions.device) / head_dim
    inv = theta ** -exps
    ang = positions.to(torch.float64)[..., None] * inv
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos().to(dtype), ang.sin().to(dtype)


def rotate(x, cos, sin):
    """x [..., len, heads, d]; cos/sin [..., len, d]."""
    half = x.shape[-1] // 2
    turned = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos.unsqueeze(-2) + turned * sin.unsqueeze(-2)


class Attention(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        h, hd = c["hidden_size"], c["head_dim"]
        self.heads, self.kv_heads, self.hd = c["num_attention_heads"], c["num_key_value_heads"], hd
        self.q_proj = nn.Linear(h, self.heads * hd, bias=False)
        self.k_proj = nn.Linear(h, self.kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(h, self.kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(self.heads * hd, h, bias=False)
        self.q_norm = Norm(hd, c["rms_norm_eps"])
        self.k_norm = Norm(hd, c["rms_norm_eps"])

    def keys_values(self, x, rope):
        k = self.k_norm(self.k_proj(x).unflatten(-1, (self.kv_heads, self.hd)))
        v = self.v_proj(x).unflatten(-1, (self.kv_heads, self.hd))
        return rotate(k, *rope), v

    def forward(self, x, ctx, rope_q, rope_c, mask, groups=1):
        """x [N·G, L, H] block rows (normed); ctx [N, T, H] context rows, shared by the G
        groups of blocks of a sequence; mask [N·G, L, T + L] bool (True: may attend) or None
        (everything)."""
        n, length, _ = x.shape
        q = rotate(self.q_norm(self.q_proj(x).unflatten(-1, (self.heads, self.hd))), *rope_q)
        kb, vb = self.keys_values(x, rope_q)
        kc, vc = self.keys_values(ctx, rope_c)
        if groups > 1:
            kc = kc[:, None].expand(-1, groups, -1, -1, -1).flatten(0, 1)
            vc = vc[:, None].expand(-1, groups, -1, -1, -1).flatten(0, 1)
        k = torch.cat([kc, kb], dim=1).transpose(1, 2)
        v = torch.cat([vc, vb], dim=1).transpose(1, 2)
        if self.heads != self.kv_heads:
            k = k.repeat_interleave(self.heads // self.kv_heads, dim=1)
            v = v.repeat_interleave(self.heads // self.kv_heads, dim=1)
        m = None if mask is None else mask[:, None]
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=m,
                                           scale=self.hd ** -0.5)
        return self.o_proj(a.transpose(1, 2).reshape(n, length, self.heads * self.hd))


class Mlp(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        h, f = c["hidden_size"], c["intermediate_size"]
        self.gate_proj = nn.Linear(h, f, bias=False)
        self.up_proj = nn.Linear(h, f, bias=False)
        self.down_proj = nn.Linear(f, h, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        self.input_layernorm = Norm(c["hidden_size"], c["rms_norm_eps"])
        self.self_attn = Attention(c)
        self.post_attention_layernorm = Norm(c["hidden_size"], c["rms_norm_eps"])
        self.mlp = Mlp(c)

    def forward(self, h, ctx, rope_q, rope_c, mask, groups=1):
        h = h + self.self_attn(self.input_layernorm(h), ctx, rope_q, rope_c, mask, groups)
        return h + self.mlp(self.post_attention_layernorm(h))


class DFlashDrafter(nn.Module):
    def __init__(self, config: dict):
        super().__init__()
        self.config = config
        h = config["hidden_size"]
        n_taps = len(config["dflash_config"]["target_layer_ids"])
        self.fc = nn.Linear(n_taps * h, h, bias=False)
        self.hidden_norm = Norm(h, config["rms_norm_eps"])
        self.layers = nn.ModuleList(Layer(config) for _ in range(config["num_hidden_layers"]))
        self.norm = Norm(h, config["rms_norm_eps"])

    @property
    def block_size(self) -> int:
        return self.config["dflash_config"]["block_size"]

    @property
    def mask_token_id(self) -> int:
        return self.config["dflash_config"]["mask_token_id"]

    @property
    def taps(self) -> list[int]:
        return self.config["dflash_config"]["target_layer_ids"]

    def context(self, features):
        """Concatenated tap outputs [..., n_taps * H] -> context rows [..., H]."""
        return self.hidden_norm(self.fc(features))

    def forward(self, ctx, ctx_pos, block, block_pos, mask=None, groups=1):
        """ctx [N, T, H] context rows at positions ctx_pos [N, T]; block [N·G, L, H] embeddings
        at positions block_pos [N·G, L] (G groups of blocks per sequence); mask [N·G, L, T + L]
        or None. Returns norm(h) [N·G, L, H]."""
        hd, theta = self.config["head_dim"], self.config["rope_theta"]
        rope_q = rotary(block_pos, hd, theta, block.dtype)
        rope_c = rotary(ctx_pos, hd, theta, block.dtype)
        h = block
        for layer in self.layers:
            h = layer(h, ctx, rope_q, rope_c, mask, groups)
        return self.norm(h)


def export(drafter: DFlashDrafter, outdir: str, dtype=torch.bfloat16, split_mib: int = 0) -> int:
    """Writes config.json and model.safetensors (published names, no prefix); returns bytes.
    With `split_mib`, the weights file is written as pieces model.safetensors.partNN of at most
    that size instead (a GPU machine returns files of 16 MiB at most); `cat` joins them."""
    from safetensors.torch import save_file
    os.makedirs(outdir, exist_ok=True)
    with open(os.path.join(outdir, "config.json"), "w") as f:
        json.dump(drafter.config, f, indent=2)
        f.write("\n")
    sd = {k: v.detach().to(dtype).contiguous().cpu() for k, v in drafter.state_dict().items()}
    path = os.path.join(outdir, "model.safetensors")
    for old in [path] + [os.path.join(outdir, n) for n in os.listdir(outdir) if ".part" in n]:
        if os.path.exists(old):
            os.remove(old)
    save_file(sd, path, metadata={"format": "pt"})
    size = os.path.getsize(path)
    if split_mib:
        data = open(path, "rb").read()
        os.remove(path)
        step = split_mib << 20
        for j, i in enumerate(range(0, len(data), step)):
            with open(f"{path}.part{j:02d}", "wb") as f:
                f.write(data[i:i + step])
    return size


def read_weights(indir: str) -> bytes:
    """model.safetensors of a checkpoint directory, joined from its pieces if it was split."""
    path = os.path.join(indir, "model.safetensors")
    if os.path.exists(path):
        return open(path, "rb").read()
    parts = sorted(n for n in os.listdir(indir) if n.startswith("model.safetensors.part"))
    if not parts:
        raise FileNotFoundError(f"{indir}: no model.safetensors (or .partNN pieces)")
    return b"".join(open(os.path.join(indir, n), "rb").read() for n in parts)


def load(indir: str, dtype=torch.float32) -> DFlashDrafter:
    """Reads a checkpoint in the published layout (whole or in pieces), or one `kasoku quantize`
    wrote (its matrices dequantized: a shipped drafter can seed training)."""
    with open(os.path.join(indir, "config.json")) as f:
        config = json.load(f)
    drafter = DFlashDrafter(config)
    sd = kasoku_format.read(read_weights(indir))
    drafter.load_state_dict({k: v.to(dtype) for k, v in sd.items()}, strict=True)
    return drafter.to(dtype)
