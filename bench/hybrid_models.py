#!/usr/bin/env python3
"""Random-weight GGUFs with the real shapes of Qwen3.5-0.8B and Qwen3.5-2B, for speed only.

No trained Qwen3.5 weights are obtainable here. A decode step reads the same bytes whatever the
weights' values, so random weights of the real shapes measure decode speed faithfully (prefill and
verify too; only the text is meaningless). Each model is built by Hugging Face transformers
(Qwen3_5ForCausalLM, bf16, transformers' own random init), converted by llama.cpp's converter
(tools/hf_to_gguf.py: convert_hf_to_gguf.py with the pre-tokenizer name forced, --no-mtp), and
quantized by llama-quantize to Q4_K_M and Q8_0:

    ~/.cache/kasoku/venv/bin/python bench/hybrid_models.py            # both sizes, both types
    ~/.cache/kasoku/venv/bin/python bench/hybrid_models.py 0.8b --types Q8_0

Output: ${KASOKU_MODELS:-~/.cache/kasoku/models}/synthetic/qwen3.5-{0.8b,2b}-{q4_k_m,q8_0}.gguf
(existing files are kept; --force rebuilds). Intermediate HF directories and bf16 GGUFs are
deleted unless --keep. Needs the venv of tools/requirements-fixtures.txt and
tools/build_llama_cpp.sh; about 1.5 GB (0.8B) / 4 GB (2B) of free memory and disk while building.

Shapes (../shared/research/qwen35.md §1.3): 24 layers, every 4th full attention (3, 7, ..., 23),
8 q / 2 kv heads of 256, partial rotary 0.25 (mrope [11, 11, 10] interleaved, theta 1e7),
Gated DeltaNet 16 key / 16 value heads of 128, conv kernel 4, vocab 248320, tied embeddings;
0.8B: hidden 1024, ffn 3584; 2B: hidden 2048, ffn 6144. The tokenizer is the tiny Qwen3.5-style
one of the fixtures (tools/tiny_tokenizer.py); the converter pads the vocabulary to 248320
entries, so the embedding and head have their real size.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
TOOLS = REPO / "tools"
CACHE = Path(os.environ.get("KASOKU_CACHE", Path.home() / ".cache" / "kasoku"))
MODELS_DIR = Path(os.environ.get("KASOKU_MODELS") or CACHE / "models")
OUT = MODELS_DIR / "synthetic"
LLAMA_BIN = CACHE / "llama.cpp" / "sdist" / "llama_cpp_python-0.3.36" / "vendor" / "llama.cpp" / "build" / "bin"

COMMON = dict(
    num_hidden_layers=24,
    layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"] * 6,
    num_attention_heads=8, num_key_value_heads=2, head_dim=256,
    linear_num_key_heads=16, linear_num_value_heads=16, linear_key_head_dim=128, linear_value_head_dim=128,
    linear_conv_kernel_dim=4, rms_norm_eps=1e-6, vocab_size=248320, tie_word_embeddings=True,
    hidden_act="silu", attention_bias=False, max_position_embeddings=262144,
    rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                     "mrope_section": [11, 11, 10], "mrope_interleaved": True},
)
SIZES = {
    "0.8b": dict(COMMON, hidden_size=1024, intermediate_size=3584),
    "2b": dict(COMMON, hidden_size=2048, intermediate_size=6144),
}
TYPES = ["Q4_K_M", "Q8_0"]


def log(msg: str) -> None:
    print(f"[hybrid {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def target(size: str, qtype: str) -> Path:
    return OUT / f"qwen3.5-{size}-{qtype.lower()}.gguf"


def build_hf(size: str, d: Path) -> None:
    """A random-weight Qwen3_5ForCausalLM of the real shape, saved in bf16 with a tiny tokenizer."""
    import torch
    import transformers as tf

    sys.path.insert(0, str(TOOLS))
    import tiny_tokenizer  # noqa: PLC0415  (tools/tiny_tokenizer.py)

    d.mkdir(parents=True, exist_ok=True)
    tok = tiny_tokenizer.write("qwen3_5", d, vocab_size=384)
    cfg = tf.Qwen3_5TextConfig(**SIZES[size], bos_token_id=tok["bos_id"], eos_token_id=tok["eos_id"],
                               pad_token_id=tok.get("pad_id"))
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    try:
        model = tf.Qwen3_5ForCausalLM(cfg)
    finally:
        torch.set_default_dtype(torch.float32)
    n = sum(p.numel() for p in model.parameters())
    log(f"{size}: {n / 1e9:.3f} B parameters")
    model.save_pretrained(d, safe_serialization=True)
    for extra in d.glob("*.jinja"):
        extra.unlink()
    (d / "kasoku_synthetic.json").write_text(json.dumps({"size": size, "parameters": n, "config": SIZES[size]}))
    del model
    gc.collect()


def convert(d: Path, out: Path) -> None:
    cmd = [sys.executable, str(TOOLS / "hf_to_gguf.py"), "--pre", "qwen35", "--", str(d), "--outtype", "bf16",
           "--outfile", str(out), "--no-mtp"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0 or not out.exists():
        raise SystemExit("converter failed:\n" + (r.stderr or r.stdout)[-3000:])


def quantize(src: Path, qtype: str, out: Path) -> None:
    exe = LLAMA_BIN / "llama-quantize"
    tmp = out.with_suffix(".tmp")
    r = subprocess.run([str(exe), str(src), str(tmp), qtype, str(os.cpu_count() or 1)], capture_output=True, text=True)
    if r.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise SystemExit(f"llama-quantize {qtype} failed:\n" + (r.stderr or r.stdout)[-3000:])
    tmp.rename(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sizes", nargs="*", default=list(SIZES), choices=list(SIZES))
    ap.add_argument("--types", default=",".join(TYPES), help="llama-quantize types (comma-separated)")
    ap.add_argument("--force", action="store_true", help="rebuild files that exist")
    ap.add_argument("--keep", action="store_true", help="keep the HF directory and the bf16 GGUF")
    a = ap.parse_args()
    types = [t.strip() for t in a.types.split(",") if t.strip()]
    if not (LLAMA_BIN / "llama-quantize").exists():
        raise SystemExit(f"no llama-quantize in {LLAMA_BIN}: run tools/build_llama_cpp.sh")
    OUT.mkdir(parents=True, exist_ok=True)
    for size in a.sizes:
        todo = [t for t in types if a.force or not target(size, t).exists()]
        if not todo:
            log(f"{size}: cached ({', '.join(str(target(size, t)) for t in types)})")
            continue
        work = OUT / f"work-qwen3.5-{size}"
        hf, bf16 = work / "hf", work / f"qwen3.5-{size}-bf16.gguf"
        t0 = time.time()
        if not bf16.exists():
            if not (hf / "config.json").exists() or not any(hf.glob("*.safetensors")):
                log(f"{size}: building the random-weight HF checkpoint")
                build_hf(size, hf)
            log(f"{size}: converting to GGUF (bf16)")
            convert(hf, bf16)
        for t in todo:
            log(f"{size}: llama-quantize {t}")
            quantize(bf16, t, target(size, t))
            print(target(size, t))
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
        log(f"{size}: done in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
