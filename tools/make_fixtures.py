#!/usr/bin/env python3
"""Tiny random-weight model fixtures with reference logits from Hugging Face transformers.

For each fixture this writes tests/fixtures/<family>/<name>/:
  config.json, generation_config.json, model.safetensors (float32)  -- an HF checkpoint
  tokenizer.json, tokenizer_config.json (with chat_template)         -- a tiny byte-level BPE
  model-f32.gguf                                                     -- llama.cpp's converter, where it works
  reference.json                                                     -- see tools/README.md for the schema

Run inside the fixture venv (tools/requirements-fixtures.txt); the GGUF step needs the llama.cpp
tree from tools/build_llama_cpp.sh (converter only; the llama.cpp cross-check also needs the build).

  python tools/make_fixtures.py                 # all fixtures
  python tools/make_fixtures.py qwen3_5/tiny    # one
  python tools/make_fixtures.py --no-gguf ...   # skip conversion
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
FIXTURES = REPO / "tests" / "fixtures"
CACHE = Path(os.environ.get("KASOKU_CACHE", Path.home() / ".cache" / "kasoku"))
LLAMA_CPP = CACHE / "llama.cpp"

sys.path.insert(0, str(HERE))
import tiny_tokenizer  # noqa: E402  (tools/tiny_tokenizer.py)


def sig7(x: float) -> float:
    """Round to 7 significant digits (float32 carries ~7.2)."""
    return float(f"{x:.7g}")


@dataclass
class Spec:
    name: str  # "<family>/<variant>"
    family: str  # tiny_tokenizer family: llama | qwen2 | qwen3 | qwen3_5
    build: str  # which builder below
    seed: int
    cfg: dict = field(default_factory=dict)
    gguf_pre: str | None = None  # tokenizer.ggml.pre to claim when converting (see hf_to_gguf.py)
    quantize: list[str] = field(default_factory=list)  # extra llama-quantize variants
    convert_args: list[str] = field(default_factory=list)  # extra convert_hf_to_gguf.py arguments
    notes: str = ""


COMMON = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=256)

SPECS = [
    Spec("llama/tiny", "llama", "llama", seed=1,
         cfg=dict(COMMON, num_hidden_layers=2, head_dim=16, rms_norm_eps=1e-5, rope_theta=10000.0,
                  tie_word_embeddings=False),
         gguf_pre="llama-bpe", quantize=["Q8_0", "Q4_0"],
         notes="Llama, untied lm_head, plain RoPE theta 1e4"),
    Spec("llama/tiny_rope_llama3", "llama", "llama", seed=2,
         cfg=dict(COMMON, num_hidden_layers=2, head_dim=16, rms_norm_eps=1e-5, tie_word_embeddings=True,
                  rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                   "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                   "original_max_position_embeddings": 64}),
         gguf_pre="llama-bpe",
         notes="Llama 3.2 style: tied embeddings, rope_type llama3 with original_max_position_embeddings 64 so "
               "that with head_dim 16 the frequencies fall in all three bands (kept, smoothed, divided)"),
    Spec("qwen2/tiny", "qwen2", "qwen2", seed=3,
         cfg=dict(COMMON, num_hidden_layers=2, rms_norm_eps=1e-6, rope_theta=1000000.0,
                  tie_word_embeddings=True),
         gguf_pre="qwen2", notes="Qwen2.5 style: q/k/v bias, tied embeddings, NEOX rope theta 1e6"),
    Spec("qwen3/tiny", "qwen3", "qwen3", seed=4,
         cfg=dict(COMMON, num_hidden_layers=3, head_dim=32, rms_norm_eps=1e-6, rope_theta=1000000.0,
                  tie_word_embeddings=True),
         gguf_pre="qwen2",
         notes="Qwen3 style: q_norm/k_norm, explicit head_dim 32 (4 heads x 32 = 128 != hidden 64), tied"),
    Spec("qwen3_5/tiny", "qwen3_5", "qwen3_5", seed=5,
         cfg=dict(COMMON, num_hidden_layers=4, head_dim=32, rms_norm_eps=1e-6, tie_word_embeddings=True,
                  layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"],
                  linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                  linear_value_head_dim=16, linear_conv_kernel_dim=4,
                  rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                                   "mrope_section": [2, 1, 1], "mrope_interleaved": True}),
         gguf_pre="qwen35", convert_args=["--no-mtp"],
         notes="Qwen3.5 text (Qwen3_5ForCausalLM, names model.*): 3 GDN + 1 gated full-attention layer, "
               "GDN nk=2 nv=4 (head mapping), dk=dv=16 (as in real checkpoints; llama.cpp's qwen35 requires it), "
               "partial rotary 0.25 of head_dim 32, tied"),
    Spec("qwen3_5/tiny_vl", "qwen3_5", "qwen3_5_vl", seed=6,
         cfg=dict(COMMON, num_hidden_layers=3, head_dim=32, rms_norm_eps=1e-6, tie_word_embeddings=False,
                  layer_types=["linear_attention", "full_attention", "linear_attention"],
                  linear_num_key_heads=2, linear_num_value_heads=6, linear_key_head_dim=16,
                  linear_value_head_dim=8, linear_conv_kernel_dim=4,
                  rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.5,
                                   "mrope_section": [4, 2, 2], "mrope_interleaved": True}),
         gguf_pre=None,  # dk != dv: the converter writes it, but llama.cpp's qwen35 loader assumes dv == dk
         notes="Qwen3.5 VL-wrapped (Qwen3_5ForConditionalGeneration, names model.language_model.* + a tiny "
               "model.visual.*): layer_types [lin, full, lin], GDN nk=2 nv=6, dk=16 != dv=8, partial rotary 0.5, untied. No GGUF: llama.cpp's qwen35 "
               "derives the V head dim from ssm.state_size (= dk), so dk != dv cannot be loaded there"),
]

# ---------------------------------------------------------------------------------------------
# model construction


def build_model(spec: Spec, tok_info: dict):
    import transformers as tf

    ids = dict(bos_token_id=tok_info["bos_id"], eos_token_id=tok_info["eos_id"],
               pad_token_id=tok_info.get("pad_id"))
    c = dict(spec.cfg, vocab_size=tok_info["vocab_size"], **ids)
    if spec.build == "llama":
        cfg = tf.LlamaConfig(**c, attention_bias=False, mlp_bias=False)
        model = tf.LlamaForCausalLM(cfg)
    elif spec.build == "qwen2":
        cfg = tf.Qwen2Config(**c, use_sliding_window=False)
        model = tf.Qwen2ForCausalLM(cfg)
    elif spec.build == "qwen3":
        cfg = tf.Qwen3Config(**c, attention_bias=False, use_sliding_window=False)
        model = tf.Qwen3ForCausalLM(cfg)
    elif spec.build == "qwen3_5":
        cfg = tf.Qwen3_5TextConfig(**c)
        model = tf.Qwen3_5ForCausalLM(cfg)
    elif spec.build == "qwen3_5_vl":
        text = tf.Qwen3_5TextConfig(**c)
        cfg = tf.Qwen3_5Config(
            text_config=text.to_dict(),
            vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                               num_position_embeddings=16, patch_size=4, spatial_merge_size=2,
                               temporal_patch_size=2),
            tie_word_embeddings=c["tie_word_embeddings"])
        model = tf.Qwen3_5ForConditionalGeneration(cfg)
    else:
        raise ValueError(spec.build)
    model.config._attn_implementation = "eager"
    return model.eval()


def randomize(model, seed: int) -> None:
    """Overwrite every parameter with seeded random values, sized so activations stay O(1).

    Matrices: N(0, (1/sqrt(fan_in))^2); embeddings and lm_head N(0, 0.3^2) (logit std ~2); norm weights: 1 + N(0, 0.2^2) for
    plain-weight norms, N(0, 0.2^2) for Qwen3.5's (1 + w) norms (so the +1 matters either way);
    biases N(0, 0.1^2); GDN A_log N(0, 0.5^2), dt_bias N(0, 0.5^2); conv1d N(0, 0.3^2).
    """
    g = torch.Generator().manual_seed(seed)
    one_plus = type(model).__name__.startswith("Qwen3_5")
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g, dtype=torch.float32)
            parts = name.split(".")
            leaf, parent = parts[-1], (parts[-2] if len(parts) > 1 else "")
            if name.endswith("embed_tokens.weight") or name.endswith("lm_head.weight"):
                v = r * 0.3
            elif "norm" in parent and leaf == "weight":
                # RMSNorm weights (input_layernorm, post_attention_layernorm, q_norm, k_norm, norm, ...)
                gdn_norm = ".linear_attn.norm." in name
                v = r * 0.2 if (one_plus and not gdn_norm and "visual" not in name) else 1.0 + r * 0.2
            elif leaf == "A_log" or leaf == "dt_bias":
                v = r * 0.5
            elif "conv1d" in name:
                v = r * 0.3
            elif leaf == "bias":
                v = r * 0.1
            elif p.dim() >= 2:
                fan_in = int(np.prod(p.shape[1:]))
                v = r / math.sqrt(fan_in)
            else:
                v = r * 0.2
            p.copy_(v.to(p.dtype))


# ---------------------------------------------------------------------------------------------
# reference


def forward_logits(model, tokens: list[int]) -> np.ndarray:
    ids = torch.tensor([tokens])
    with torch.no_grad():
        out = model(input_ids=ids, use_cache=False)
    return out.logits[0].float().numpy()


def decode_logits(model, tokens: list[int], prefill: int) -> np.ndarray:
    """Prefill `prefill` tokens with cache, then one token at a time; logits at every position."""
    ids = torch.tensor([tokens])
    rows = []
    with torch.no_grad():
        out = model(input_ids=ids[:, :prefill], use_cache=True)
        rows.append(out.logits[0])
        past = out.past_key_values
        for t in range(prefill, len(tokens)):
            out = model(input_ids=ids[:, t:t + 1], past_key_values=past, use_cache=True)
            past = out.past_key_values
            rows.append(out.logits[0])
    return torch.cat(rows, 0).float().numpy()


def greedy(model, tokens: list[int], n: int) -> list[int]:
    seq = list(tokens)
    with torch.no_grad():
        for _ in range(n):
            logits = model(input_ids=torch.tensor([seq]), use_cache=False).logits[0, -1]
            seq.append(int(torch.argmax(logits)))
    return seq[len(tokens):]


def state_dict_summary(path: Path) -> dict:
    from safetensors import safe_open
    out = {}
    with safe_open(str(path), "np") as f:
        for k in sorted(f.keys()):
            out[k] = list(f.get_slice(k).get_shape())
    return out


# ---------------------------------------------------------------------------------------------
# GGUF conversion (llama.cpp's converter from the llama-cpp-python sdist)


def convert_gguf(spec: Spec, d: Path, log: list[str]) -> Path | None:
    src = LLAMA_CPP / "src"
    if not (src / "convert_hf_to_gguf.py").exists():
        log.append("gguf: skipped (no llama.cpp tree; run tools/build_llama_cpp.sh)")
        return None
    out = d / "model-f32.gguf"
    cmd = [sys.executable, str(HERE / "hf_to_gguf.py"), "--pre", spec.gguf_pre, "--",
           str(d), "--outtype", "f32", "--outfile", str(out), *spec.convert_args]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0 or not out.exists():
        tail = (r.stderr or r.stdout).strip().splitlines()[-6:]
        log.append("gguf: converter FAILED: " + " | ".join(tail))
        out.unlink(missing_ok=True)
        return None
    log.append(f"gguf: converted with tokenizer.ggml.pre={spec.gguf_pre}")
    return out


def quantize_gguf(f32: Path, qtype: str, log: list[str]) -> Path | None:
    exe = LLAMA_CPP / "src" / "build" / "bin" / "llama-quantize"
    if not exe.exists():
        log.append(f"{qtype}: skipped (no llama-quantize)")
        return None
    out = f32.with_name(f"model-{qtype.lower()}.gguf")
    r = subprocess.run([str(exe), str(f32), str(out), qtype, "1"], capture_output=True, text=True)
    if r.returncode != 0:
        log.append(f"{qtype}: llama-quantize FAILED: {r.stderr.strip().splitlines()[-1:]}")
        return None
    log.append(f"{qtype}: written by llama-quantize")
    return out


def gguf_tensor_types(path: Path) -> dict[str, int]:
    """{ggml type name: tensor count} of a GGUF, read with the vendored gguf-py."""
    sys.path.insert(0, str(LLAMA_CPP / "src" / "gguf-py"))
    import gguf  # noqa: PLC0415

    counts: dict[str, int] = {}
    for t in gguf.GGUFReader(str(path)).tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    return counts


def llama_cpp_logits(gguf: Path, tokens: list[int]) -> np.ndarray | None:
    """Logits at every position from the built llama.cpp, via tools/llama_logits.py (subprocess)."""
    if not (LLAMA_CPP / "src" / "build" / "bin" / "libllama.so").exists():
        return None
    r = subprocess.run([sys.executable, str(HERE / "llama_logits.py"), "logits", str(gguf),
                        "--tokens", ",".join(map(str, tokens)), "--format", "npy", "--out", "-"],
                       capture_output=True)
    if r.returncode != 0:
        print(r.stderr.decode()[-2000:], file=sys.stderr)
        return None
    import io
    return np.load(io.BytesIO(r.stdout))


# ---------------------------------------------------------------------------------------------


def make(spec: Spec, want_gguf: bool) -> dict:
    import transformers

    t0 = time.time()
    d = FIXTURES / spec.name
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    log: list[str] = []

    tok_info = tiny_tokenizer.write(spec.family, d, vocab_size=384)
    torch.manual_seed(spec.seed)
    model = build_model(spec, tok_info)
    randomize(model, spec.seed)
    model.save_pretrained(d, safe_serialization=True)
    from transformers import GenerationConfig
    GenerationConfig(bos_token_id=tok_info["bos_id"], eos_token_id=tok_info["stop_ids"],
                     pad_token_id=tok_info.get("pad_id"), do_sample=False).save_pretrained(d)
    for extra in d.glob("*.jinja"):
        extra.unlink()

    # Reload from disk, exactly as a user would, and compute the reference on the reloaded model.
    from transformers import AutoModelForCausalLM
    cls = type(model)
    model = cls.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()

    tokens = tok_info["reference_tokens"]
    logits = forward_logits(model, tokens)
    dec = decode_logits(model, tokens, prefill=5)
    dec_diff = float(np.abs(dec - logits).max())
    assert dec_diff < 1e-4, f"{spec.name}: cached decode differs from full forward by {dec_diff}"
    auto = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager").eval()
    auto_diff = float(np.abs(forward_logits(auto, tokens) - logits).max())
    assert auto_diff < 1e-5, f"{spec.name}: AutoModelForCausalLM differs by {auto_diff}"
    cont = greedy(model, tokens, 8)

    ref = {
        "fixture": spec.name,
        "architecture": cls.__name__,
        "notes": spec.notes,
        "source": f"transformers {transformers.__version__}, torch {torch.__version__}, float32, eager "
                  f"attention, torch.no_grad(), full forward with use_cache=False",
        "seed": spec.seed,
        "vocab_size": int(logits.shape[1]),
        "tokens": tokens,
        "text": tok_info["reference_text"],
        "logits": [[sig7(v) for v in row] for row in logits.tolist()],
        "decode_check": {"prefill": 5, "max_abs_diff_vs_full_forward": dec_diff,
                         "what": "prefill 5 tokens with cache, then one token at a time"},
        "greedy_continuation": cont,
        "logit_stats": {"mean": sig7(float(logits.mean())), "std": sig7(float(logits.std())),
                        "max_abs": sig7(float(np.abs(logits).max()))},
        "tensors": state_dict_summary(d / "model.safetensors"),
    }

    if want_gguf and spec.gguf_pre:
        f32 = convert_gguf(spec, d, log)
        ref["gguf"] = {"file": f32.name if f32 else None}
        if f32:
            ll = llama_cpp_logits(f32, tokens)
            if ll is not None:
                diff = float(np.abs(ll - logits).max())
                ref["gguf"]["llama_cpp_max_abs_diff"] = diff
                ref["gguf"]["llama_cpp_argmax_agree"] = int((ll.argmax(1) == logits.argmax(1)).sum())
                log.append(f"llama.cpp on model-f32.gguf vs transformers: max |diff| {diff:.3g}")
            for q in spec.quantize:
                qf = quantize_gguf(f32, q, log)
                if qf:
                    entry = {"file": qf.name, "tensor_types": gguf_tensor_types(qf)}
                    ql = llama_cpp_logits(qf, tokens)
                    if ql is not None:
                        # llama.cpp's own logits for the quantized file: the exact-math reference for a
                        # quantized loader/kernel (same tokens as above).
                        entry["llama_cpp_logits"] = [[sig7(v) for v in row] for row in ql.tolist()]
                        entry["max_abs_diff_vs_f32_reference"] = float(np.abs(ql - logits).max())
                    ref["gguf"].setdefault("quantized", []).append(entry)
    ref["log"] = log
    with open(d / "reference.json", "w") as f:
        json.dump(ref, f, indent=None, separators=(",", ":"))
        f.write("\n")
    size = sum(p.stat().st_size for p in d.iterdir())
    print(f"{spec.name}: {len(tokens)} tokens, logits std {logits.std():.3f}, decode diff {dec_diff:.2g}, "
          f"{size / 1e6:.2f} MB, {time.time() - t0:.1f} s; " + "; ".join(log), flush=True)
    return ref


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", help="fixture names (default: all): " + ", ".join(s.name for s in SPECS))
    ap.add_argument("--no-gguf", action="store_true", help="skip llama.cpp conversion and cross-check")
    a = ap.parse_args()
    torch.set_num_threads(1)
    specs = [s for s in SPECS if not a.names or s.name in a.names]
    if a.names and len(specs) != len(a.names):
        sys.exit(f"unknown fixture in {a.names}")
    for s in specs:
        make(s, not a.no_gguf)


if __name__ == "__main__":
    main()
