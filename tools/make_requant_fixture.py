"""Reference bytes for kasoku's load-time requantization to Q4_0 (draft models).

    python3 tools/make_requant_fixture.py [MODEL.gguf]   # default: the cached Qwen2.5-Coder-0.5B Q4_K_M

Runs llama.cpp's own `llama-quantize --allow-requantize MODEL Q4_0` (from tools/build_llama_cpp.sh)
and, for the first tensor of each source type it turned into Q4_0, records the first row's
source bytes and llama.cpp's Q4_0 bytes for it. llama.cpp requantizes by dequantizing to f32 and
quantizing with its reference Q4_0 rule (no importance matrix), which is what kasoku must match
byte for byte. Output: tests/fixtures/requant/q4_0.json (hex strings, a few KiB).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
from gguf_info import GGML_TYPES, read_gguf  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("KASOKU_CACHE", Path.home() / ".cache/kasoku"))
MODELS = Path(os.environ.get("KASOKU_MODELS", CACHE / "models"))


def tensors(path: Path) -> dict:
    """name -> (type name, shape [rows, cols], absolute byte offset) of a GGUF file."""
    return {t["name"]: (t["type"], t["shape"], t["offset"]) for t in read_gguf(path)["tensors"]}


def row_bytes(ttype: str, cols: int) -> int:
    _, blk, bb = next(v for v in GGML_TYPES.values() if v[0] == ttype)
    return cols // blk * bb


def main() -> None:
    src = Path(sys.argv[1]) if len(sys.argv) > 1 else MODELS / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    build = CACHE / "llama.cpp/src/build/bin"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "q4_0.gguf"
        env = dict(os.environ, LD_LIBRARY_PATH=str(build))
        subprocess.run([str(build / "llama-quantize"), "--allow-requantize", str(src), str(out), "Q4_0", "2"],
                       check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        a, b = tensors(src), tensors(out)
        cases, seen = [], set()
        with open(src, "rb") as fa, open(out, "rb") as fb:
            for name, (ta, shape, off_a) in a.items():
                tb, _, off_b = b[name]
                if tb != "Q4_0" or ta in seen or ta == "Q4_0" or len(shape) != 2:
                    continue
                seen.add(ta)
                cols = shape[1]
                fa.seek(off_a)
                fb.seek(off_b)
                cases.append({
                    "tensor": name,
                    "source_type": ta,
                    "cols": cols,
                    "source": fa.read(row_bytes(ta, cols)).hex(),
                    "q4_0": fb.read(row_bytes("Q4_0", cols)).hex(),
                })
    dest = ROOT / "tests/fixtures/requant/q4_0.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "made_by": "tools/make_requant_fixture.py: llama-quantize --allow-requantize (llama-cpp-python 0.3.36 sdist)",
        "model": src.name,
        "cases": cases,
    }
    dest.write_text(json.dumps(doc, indent=1) + "\n")
    print(dest, [(c["tensor"], c["source_type"], c["cols"]) for c in cases])


if __name__ == "__main__":
    main()
