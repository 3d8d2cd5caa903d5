"""The frozen target a DFlash drafter is trained for: loading it (from a GGUF file, dequantized
with the `gguf` package into a transformers Qwen2 model; from a Hugging Face directory; or a
tiny random Qwen2 for smoke tests), its tokenizer, and reading its tapped layer outputs.

The GPU machine has torch + transformers and no hub access, so a GGUF file is the only form the
real target (Qwen2.5-Coder-1.5B-Instruct Q4_K_M) reaches it in; `load_gguf` needs nothing but
the file and the `gguf` wheel. A dequantized copy can be cached as a torch file to skip the
dequantization in later windows.
"""
from __future__ import annotations

import os
import time

import numpy as np
import torch

# GGUF tensor names of a qwen2 file -> transformers Qwen2ForCausalLM names.
_TOP = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_BLOCK = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}


def _qwen2_config(**kw):
    from transformers import Qwen2Config
    theta = kw.pop("rope_theta")
    cfg = Qwen2Config(**kw)
    # transformers 5 keeps RoPE settings in rope_parameters, 4.x in rope_theta: set both.
    cfg.rope_parameters = {"rope_type": "default", "rope_theta": theta}
    cfg.rope_theta = theta
    return cfg


def _build(cfg, state_dict, device, dtype):
    from transformers import Qwen2ForCausalLM
    with torch.device(device):
        model = Qwen2ForCausalLM(cfg)
    model = model.to(dtype)
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    missing = [m for m in missing if not (cfg.tie_word_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"target weights: missing {missing}, unexpected {unexpected}")
    if cfg.tie_word_embeddings:
        model.tie_weights()
    return model.eval().requires_grad_(False)


def assemble(path: str) -> str:
    """`path`, joined first from pieces `path.partNN` when only those exist (a file too large
    for one transfer to a GPU machine travels in pieces)."""
    if os.path.exists(path):
        return path
    folder, name = os.path.split(os.path.abspath(path))
    parts = sorted(n for n in os.listdir(folder) if n.startswith(name + ".part"))
    if not parts:
        raise FileNotFoundError(path)
    with open(path + ".tmp", "wb") as out:
        for n in parts:
            with open(os.path.join(folder, n), "rb") as f:
                while chunk := f.read(1 << 24):
                    out.write(chunk)
    os.replace(path + ".tmp", path)
    return path


def load_gguf(path: str, device="cpu", dtype=torch.bfloat16, cache: str | None = None):
    """A Qwen2ForCausalLM with the weights of a qwen2 GGUF file, dequantized. With `cache`, a
    torch file of the dequantized weights is read if present, written otherwise."""
    if cache and os.path.exists(cache):
        blob = torch.load(cache, map_location="cpu", weights_only=False)
        return _build(_qwen2_config(**blob["config"]), blob["weights"], device, dtype)
    from gguf import GGUFReader, dequantize
    t0 = time.time()
    reader = GGUFReader(assemble(path))

    def meta(key):
        f = reader.fields[key]
        v = f.parts[f.data[0]]
        return bytes(v).decode() if f.types and f.types[0].name == "STRING" else v[0].item()

    arch = meta("general.architecture")
    if arch != "qwen2":
        raise ValueError(f"{path}: architecture {arch!r}, expected qwen2")
    tensors = {t.name: t for t in reader.tensors}
    config = dict(
        vocab_size=int(tensors["token_embd.weight"].shape[1]),
        hidden_size=int(meta("qwen2.embedding_length")),
        intermediate_size=int(meta("qwen2.feed_forward_length")),
        num_hidden_layers=int(meta("qwen2.block_count")),
        num_attention_heads=int(meta("qwen2.attention.head_count")),
        num_key_value_heads=int(meta("qwen2.attention.head_count_kv")),
        rms_norm_eps=float(meta("qwen2.attention.layer_norm_rms_epsilon")),
        rope_theta=float(meta("qwen2.rope.freq_base")),
        max_position_embeddings=int(meta("qwen2.context_length")),
        tie_word_embeddings="output.weight" not in tensors,
        use_sliding_window=False,
    )
    weights = {}
    for name, t in tensors.items():
        if name.startswith("blk."):
            _, i, part = name.split(".", 2)
            hf = f"model.layers.{i}.{_BLOCK[part]}"
        else:
            hf = _TOP[name]
        values = np.array(dequantize(t.data, t.tensor_type), dtype=np.float32, copy=True)
        shape = tuple(int(x) for x in reversed(list(t.shape)))
        weights[hf] = torch.from_numpy(np.ascontiguousarray(values).reshape(shape)).to(dtype)
    print(f"[target] {path}: dequantized {len(weights)} tensors in {time.time() - t0:.1f} s",
          flush=True)
    if cache:
        torch.save({"config": config, "weights": weights}, cache)
    return _build(_qwen2_config(**config), weights, device, dtype)


def load_tokenizer(source: str):
    """The tokenizer of a GGUF file (transformers builds it from the file's metadata) or of a
    Hugging Face directory."""
    from transformers import AutoTokenizer
    if source.endswith(".gguf"):
        assemble(source)
        return AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(source)),
                                             gguf_file=os.path.basename(source))
    return AutoTokenizer.from_pretrained(source)


def load_target(source: str, device="cpu", dtype=torch.bfloat16, cache: str | None = None):
    """A GGUF file, a Hugging Face directory, or 'tiny' (a random 4-layer Qwen2 of the real
    vocabulary's size, for smoke tests)."""
    if source == "tiny":
        cfg = _qwen2_config(vocab_size=151936, hidden_size=64, intermediate_size=128,
                            num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                            rms_norm_eps=1e-6, rope_theta=1e6, max_position_embeddings=4096,
                            tie_word_embeddings=False, use_sliding_window=False)
        from transformers import Qwen2ForCausalLM
        torch.manual_seed(1234)
        return Qwen2ForCausalLM(cfg).to(device=device, dtype=dtype).eval().requires_grad_(False)
    if source.endswith(".gguf"):
        return load_gguf(source, device, dtype, cache)
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
    return model.to(device).eval().requires_grad_(False)


class Taps:
    """Runs the target and returns its tapped layers' outputs (before the final norm; tap l =
    the output of decoder layer l), concatenated in tap order, and its greedy next tokens."""

    def __init__(self, model, taps: list[int]):
        self.model = model
        self.taps = list(taps)
        n = model.config.num_hidden_layers
        if any(not 0 <= l < n for l in self.taps):
            raise ValueError(f"taps {self.taps} outside the target's {n} layers")
        self._seen = {}
        for l in set(self.taps):
            model.model.layers[l].register_forward_hook(self._hook(l))

    def _hook(self, l):
        def keep(module, args, out):
            self._seen[l] = out[0] if isinstance(out, (tuple, list)) else out
        return keep

    @property
    def embed(self):
        return self.model.model.embed_tokens.weight

    @property
    def head(self):
        return self.model.lm_head.weight

    @torch.no_grad()
    def __call__(self, ids, attention_mask=None, chunk: int = 8192):
        """ids [N, T] -> (features [N, T, n_taps * H], greedy next token [N, T])."""
        self._seen.clear()
        out = self.model.model(input_ids=ids, attention_mask=attention_mask, use_cache=False)
        feats = torch.cat([self._seen[l] for l in self.taps], dim=-1)
        self._seen.clear()
        h = out.last_hidden_state.reshape(-1, out.last_hidden_state.shape[-1])
        nxt = torch.empty(h.shape[0], dtype=torch.long, device=h.device)
        for i in range(0, h.shape[0], chunk):
            nxt[i:i + chunk] = (h[i:i + chunk] @ self.head.T).argmax(-1)
        return feats, nxt.view(ids.shape)
