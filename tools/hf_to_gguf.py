#!/usr/bin/env python3
"""Run llama.cpp's convert_hf_to_gguf.py (from the llama-cpp-python sdist) on a fixture checkpoint.

  python tools/hf_to_gguf.py --pre qwen2 -- MODEL_DIR --outtype f32 --outfile out.gguf

Why a wrapper: the converter identifies a BPE tokenizer's pre-tokenizer by hashing the token ids
of a fixed test string and looking the hash up in `TextModel.get_vocab_base_pre`. Our fixture
tokenizers have their own tiny vocabularies, so every hash is unknown and the converter refuses.
The pre-tokenizer *regex* of each fixture tokenizer is the real family's (tools/tiny_tokenizer.py),
so we import the converter as a module, replace `get_vocab_base_pre` with a function returning the
family's llama.cpp name (`--pre`: llama-bpe, qwen2, qwen35, ...), and then run its main().
The llama.cpp source tree is not modified. Everything else is the converter's own behaviour.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

CACHE = Path(os.environ.get("KASOKU_CACHE", Path.home() / ".cache" / "kasoku"))
SRC = CACHE / "llama.cpp" / "sdist" / "llama_cpp_python-0.3.36" / "vendor" / "llama.cpp"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pre", required=True, help="tokenizer.ggml.pre to write (llama.cpp pre-tokenizer name)")
    ap.add_argument("rest", nargs=argparse.REMAINDER, help="-- then convert_hf_to_gguf.py arguments")
    a = ap.parse_args()
    rest = a.rest[1:] if a.rest[:1] == ["--"] else a.rest

    sys.path.insert(0, str(SRC))
    sys.path.insert(1, str(SRC / "gguf-py"))
    import conversion.base as base  # noqa: PLC0415

    pre = a.pre
    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
    import convert_hf_to_gguf  # noqa: PLC0415

    sys.argv = [str(SRC / "convert_hf_to_gguf.py"), *rest]
    convert_hf_to_gguf.main()


if __name__ == "__main__":
    main()
