#!/usr/bin/env python3
"""Logits, tokenization and greedy decoding from the llama.cpp build (tools/build_llama_cpp.sh).

Uses the `llama_cpp` Python package from the llama-cpp-python sdist against the built
libllama.so (LLAMA_CPP_LIB_PATH), so no pip build of llama-cpp-python is needed.

  python tools/llama_logits.py logits MODEL.gguf --tokens 1,2,3 [--format json|npy] [--out FILE|-]
  python tools/llama_logits.py tokenize MODEL.gguf "some text" [--no-bos] [--special]
  python tools/llama_logits.py greedy MODEL.gguf --tokens 1,2,3 -n 8

`logits` evaluates the whole sequence in one batch with logits for every position (logits_all).
KV cache f32, flash attention off (see load()).
`greedy` evaluates the prompt, then appends argmax tokens one at a time (decode with KV cache).
"""
from __future__ import annotations

import argparse
import io
import json
import os
import sys
from pathlib import Path

import numpy as np

CACHE = Path(os.environ.get("KASOKU_CACHE", Path.home() / ".cache" / "kasoku"))
ROOT = CACHE / "llama.cpp"
SDIST = ROOT / "sdist" / "llama_cpp_python-0.3.36"
BIN = SDIST / "vendor" / "llama.cpp" / "build" / "bin"


def _import_llama():
    os.environ.setdefault("LLAMA_CPP_LIB_PATH", str(BIN))
    os.environ["LD_LIBRARY_PATH"] = str(BIN) + ":" + os.environ.get("LD_LIBRARY_PATH", "")
    if str(SDIST) not in sys.path:
        sys.path.insert(0, str(SDIST))
    from llama_cpp import Llama  # noqa: PLC0415

    return Llama


def load(path: str | Path, n_ctx: int = 512, n_threads: int = 2, logits_all: bool = True):
    Llama = _import_llama()
    # KV cache in f32 and no flash attention: llama.cpp's defaults (f16 cache, FA auto) add ~1e-3
    # rounding to attention, which would blur a reference. GGML_TYPE_F32 == 0.
    return Llama(model_path=str(path), n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, n_threads=n_threads,
                 n_threads_batch=n_threads, logits_all=logits_all, verbose=False, seed=0,
                 type_k=0, type_v=0, flash_attn=False)


def logits(llm, tokens: list[int]) -> np.ndarray:
    """[len(tokens), n_vocab] float32 logits, one batch, fresh context."""
    llm.reset()
    llm.eval(tokens)
    return np.array(llm.scores[: len(tokens)], dtype=np.float32, copy=True)


def greedy(llm, tokens: list[int], n: int) -> list[int]:
    llm.reset()
    llm.eval(tokens)
    out = []
    for _ in range(n):
        t = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        out.append(t)
        llm.eval([t])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("logits")
    p.add_argument("model")
    p.add_argument("--tokens", required=True)
    p.add_argument("--format", choices=["json", "npy"], default="json")
    p.add_argument("--out", default="-")
    p = sub.add_parser("tokenize")
    p.add_argument("model")
    p.add_argument("text")
    p.add_argument("--no-bos", action="store_true")
    p.add_argument("--special", action="store_true")
    p = sub.add_parser("greedy")
    p.add_argument("model")
    p.add_argument("--tokens", required=True)
    p.add_argument("-n", type=int, default=8)
    a = ap.parse_args()

    if a.cmd == "logits":
        toks = [int(t) for t in a.tokens.split(",")]
        x = logits(load(a.model), toks)
        if a.format == "npy":
            buf = io.BytesIO()
            np.save(buf, x)
            data = buf.getvalue()
        else:
            data = json.dumps({"tokens": toks, "logits": x.tolist()}).encode()
        if a.out == "-":
            sys.stdout.buffer.write(data)
        else:
            Path(a.out).write_bytes(data)
    elif a.cmd == "tokenize":
        llm = load(a.model, logits_all=False)
        print(json.dumps(llm.tokenize(a.text.encode(), add_bos=not a.no_bos, special=a.special)))
    elif a.cmd == "greedy":
        llm = load(a.model)
        toks = [int(t) for t in a.tokens.split(",")]
        out = greedy(llm, toks, a.n)
        print(json.dumps({"tokens": out, "text": llm.detokenize(out).decode("utf-8", "replace")}))


if __name__ == "__main__":
    main()
