#!/usr/bin/env python3
"""Reference next-token logits for the real SmolLM2-135M-Instruct Q4_1 GGUF, from llama.cpp.

Writes tests/fixtures/smollm2/reference.json (schema in tools/README.md). The model file comes
from `bash /work/shared/models/fetch.sh smollm2-135m` (or --model PATH). Exactly the same file and
llama.cpp's own quantized CPU math (the build from tools/build_llama_cpp.sh), via tools/llama_logits.py.

  python tools/smollm2_reference.py [--model PATH] [--top-k 20]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
import llama_logits  # noqa: E402

PROMPT = ("The history of computing is a story of people trying to make machines do arithmetic faster and "
          "more reliably. Early mechanical calculators gave way to vacuum tubes, then to transistors, and "
          "finally to chips with billions of parts.")
GREEDY_PROMPT = "The capital of France is"
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def sig7(x: float) -> float:
    return float(f"{x:.7g}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="path of SmolLM2-135M-Instruct.Q4_1.gguf (default: fetch.sh)")
    ap.add_argument("--top-k", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(REPO / "tests" / "fixtures" / "smollm2" / "reference.json"))
    a = ap.parse_args()
    t0 = time.time()

    path = a.model or subprocess.run(["bash", "/work/shared/models/fetch.sh", "smollm2-135m"], check=True,
                                     capture_output=True, text=True).stdout.strip().splitlines()[-1]
    digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    if digest != SHA256:
        sys.exit(f"unexpected model file {path}: sha256 {digest}")

    llm = llama_logits.load(path, n_ctx=512, n_threads=a.threads)
    meta = dict(llm.metadata)
    # add_special=True: BOS/EOS exactly as the GGUF's tokenizer.ggml.add_bos_token says (SmolLM2: false).
    tokens = llm.tokenize(PROMPT.encode(), add_bos=True, special=False)
    logits = llama_logits.logits(llm, tokens).astype(np.float64)
    m = logits.max(1, keepdims=True)
    lse = (m[:, 0] + np.log(np.exp(logits - m).sum(1)))
    positions = []
    for i in range(len(tokens)):
        row = logits[i]
        top = np.argsort(-row, kind="stable")[: a.top_k]
        positions.append({"top_ids": [int(t) for t in top], "top_logits": [sig7(row[t]) for t in top],
                          "logsumexp": sig7(lse[i])})

    gtoks = llm.tokenize(GREEDY_PROMPT.encode(), add_bos=True, special=False)
    cont = llama_logits.greedy(llm, gtoks, 8)
    # Also check: the batch path's argmax agrees with the greedy (one token at a time) path.
    batch_next = int(np.argmax(llama_logits.logits(llm, gtoks)[-1]))
    assert batch_next == cont[0]

    # How much the reference moves with llama.cpp's settings (guides test tolerances): the default
    # f16 KV cache + auto flash attention, and 1 thread instead of a.threads.
    Llama = llama_logits._import_llama()
    llm16 = Llama(model_path=str(path), n_ctx=512, n_batch=512, n_ubatch=512, n_threads=a.threads,
                  n_threads_batch=a.threads, logits_all=True, verbose=False)
    l16 = llama_logits.logits(llm16, tokens).astype(np.float64)
    l1 = llama_logits.logits(llama_logits.load(path, n_ctx=512, n_threads=1), tokens).astype(np.float64)
    idx = np.array([p["top_ids"] for p in positions])
    sens = {
        "f16_kv_default_fa": {"top1_agree": int((l16.argmax(1) == logits.argmax(1)).sum()),
                              "max_abs_diff_top_k": float(np.abs(np.take_along_axis(l16 - logits, idx, 1)).max())},
        "one_thread": {"top1_agree": int((l1.argmax(1) == logits.argmax(1)).sum()),
                       "max_abs_diff_all": float(np.abs(l1 - logits).max())},
    }

    version = (llama_logits.ROOT / "VERSION").read_text().strip().splitlines() \
        if (llama_logits.ROOT / "VERSION").exists() else []
    ref = {
        "model": "SmolLM2-135M-Instruct.Q4_1.gguf",
        "model_sha256": digest,
        "fetch": "bash /work/shared/models/fetch.sh smollm2-135m",
        "source": "llama.cpp CPU backend (tools/build_llama_cpp.sh), llama-cpp-python 0.3.36 API, "
                  f"logits_all, one batch, n_threads={a.threads}",
        "llama_cpp": version,
        "gguf_add_bos_token": str(meta.get("tokenizer.ggml.add_bos_token")).lower() == "true",
        "kv_cache": "f32, flash attention off",
        "sensitivity": sens,
        "vocab_size": int(logits.shape[1]),
        "prompt": PROMPT,
        "tokens": tokens,
        "top_k": a.top_k,
        "positions": positions,
        "greedy": {
            "prompt": GREEDY_PROMPT,
            "prompt_tokens": gtoks,
            "continuation": cont,
            "text": llm.detokenize(cont).decode("utf-8", "replace"),
            "how": "prompt in one batch, then argmax token appended one at a time (KV cache), raw text, no template",
        },
    }
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w") as f:
        json.dump(ref, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    top1 = [p["top_ids"][0] for p in positions]
    print(f"{out}: {len(tokens)} tokens, argmax {top1[:8]}..., greedy {cont} = {ref['greedy']['text']!r}, "
          f"{time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
