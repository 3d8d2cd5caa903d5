#!/usr/bin/env python3
"""Reference token ids for kasoku's GGUF tokenizers -> tests/fixtures/tokenizer/<model>.json.

The reference is llama.cpp's own tokenizer (libllama from tools/build_llama_cpp.sh, through the
llama_cpp Python package of the sdist, vocab only), since a GGUF's vocabulary is defined by how
llama.cpp reads it. As a cross-check every case is also encoded by Hugging Face transformers'
GGUF tokenizer conversion (`AutoTokenizer.from_pretrained(dir, gguf_file=...)`); cases where the
two disagree are listed under "hf_disagrees" (e.g. transformers has no split rule for
`tokenizer.ggml.pre = smollm`, which llama.cpp splits digit by digit).

    ~/.cache/kasoku/venv/bin/python tools/tokenizer_reference.py            # both models
    ~/.cache/kasoku/venv/bin/python tools/tokenizer_reference.py smollm2-135m

Models are found in ${KASOKU_MODELS:-~/.cache/kasoku/models} (shared/models/fetch.sh NAME).
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import llama_logits  # noqa: E402  (sets up libllama and the llama_cpp package)

MODELS_DIR = Path(os.environ.get("KASOKU_MODELS", Path.home() / ".cache" / "kasoku" / "models"))
MODELS = {
    "smollm2-135m": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "qwen2.5-coder-0.5b": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
}

CHATML = "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"
TEXTS = [
    "The capital of France is",
    "Hello world! How are you doing today?",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n\n\nprint(fibonacci(10))\n",
    "class A:\n\tdef f(self):\n\t\treturn {'a': [1, 2, 3]}  # comment\n",
    "In 2024, 1234567 people paid $3.14159 each (x=42, y=-7).",
    "héllo wörld — naïve café; 日本語のテキスト; Привет мир; emoji 🤖🎉 👨‍👩‍👧",
    "  leading spaces\tand\ttabs   trailing   \n\n\nmultiple\r\nnewlines  ",
    "I'm sure they'll say it's fine, but we'd've DON'T YOU'RE",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa !!!!!!!!!! ...... ----",
    " ",
    "\n",
    " Hello",
    "e\u0301 vs \u00e9",
    CHATML,
    "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>",
    "<tool_call>\n{\"name\": \"x\"}\n</tool_call><|endoftext|>",
    "<|im_start|>user <|im_start|><|im_end|>text<|im_start",
]


def cases_for(llm, hf, special_texts: set[str]):
    cases, disagree = [], []
    for text in TEXTS:
        for parse_special in ([True, False] if text in special_texts else [True]):
            ids = llm.tokenize(text.encode(), add_bos=False, special=parse_special)
            hf_ids = hf(text, add_special_tokens=False, split_special_tokens=not parse_special)["input_ids"]
            decoded = llm.detokenize(ids, special=True).decode("utf-8", "replace")
            case = {"text": text, "parse_special": parse_special, "ids": ids, "decoded": decoded}
            cases.append(case)
            if hf_ids != ids:
                disagree.append({"text": text, "parse_special": parse_special, "hf_ids": hf_ids})
    return cases, disagree


def main() -> None:
    from transformers import AutoTokenizer  # noqa: PLC0415
    import transformers  # noqa: PLC0415

    names = sys.argv[1:] or list(MODELS)
    out_dir = ROOT / "tests" / "fixtures" / "tokenizer"
    out_dir.mkdir(parents=True, exist_ok=True)
    Llama = llama_logits._import_llama()
    for name in names:
        file = MODELS[name]
        path = MODELS_DIR / file
        llm = Llama(model_path=str(path), vocab_only=True, verbose=False)
        hf = AutoTokenizer.from_pretrained(str(MODELS_DIR), gguf_file=file)
        special_texts = {t for t in TEXTS if "<|" in t or "<tool" in t}
        cases, disagree = cases_for(llm, hf, special_texts)
        result = {
            "model": file,
            "source": "llama.cpp tokenizer (llama_tokenize add_special=false; detokenize special=true), "
            f"llama-cpp-python sdist 0.3.36 vendored llama.cpp; cross-check transformers {transformers.__version__}",
            "bos": llm.token_bos(),
            "eos": llm.token_eos(),
            "n_vocab": llm.n_vocab(),
            "cases": cases,
            "hf_disagrees": disagree,
        }
        dest = out_dir / f"{name}.json"
        dest.write_text(json.dumps(result, ensure_ascii=False, indent=1) + "\n")
        print(f"{dest}: {len(cases)} cases, transformers disagrees on {len(disagree)}")
        for d in disagree:
            print("   ", repr(d["text"][:40]), "parse_special" if d["parse_special"] else "plain")


if __name__ == "__main__":
    main()
