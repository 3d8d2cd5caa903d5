"""Quality of kasoku's own formats (M, L; rotated and not) against llama.cpp's Q4_0, Q4_K_M,
Q5_K_M and Q8_0, all made from the same unquantized source, on held-out Python and English
prose: KL divergence of the next-token distributions from the source model's, top-1 agreement
with it, and perplexity; with the bits per weight of each.

    python3 bench/quant_quality.py [--model GGUF] [--ctx 512] [--chunks 4] [--out results.json]

The source: no unquantized checkpoint of the model is obtainable here, so "the unquantized
model" is the f32 dequantization of the cached Qwen2.5-Coder-0.5B Q4_K_M GGUF
(`examples/dequantize_gguf`). Every candidate is quantized from that f32 file. Its tensors were
stored as Q5_0 (q/k/output/gate/up projections and the embedding), Q8_0 (attn_v and the
head), Q6_K (12 ffn_down) and Q4_K (the other 12 ffn_down): all but the Q4_K ffn_down are on
grids finer than M's 4-bit one, so M is measured on its own error there. The 12 Q4_K ffn_down
matrices are already on a 4-bit K-quant grid, which requantizing to Q4_K (Q4_K_M, and Q5_K
for Q5_K_M) reproduces almost losslessly: they favour the K-quants, and the script says so
beside the table.

Texts (not in any prompt set of this repository): Python, /usr/lib/python3.11/fractions.py and
heapq.py; prose, the reST sources of the Python 3.11 FAQ (general.rst, design.rst) from Debian's
python3.11-doc package (`apt-get download python3.11-doc`, unpacked into /tmp/pydoc when not
installed).

Tools: target/release/kasoku and the examples dequantize_gguf and quant_quality
(`cargo build --release -p kasoku-cli -p kasoku --examples`), and llama.cpp's llama-quantize
(tools/build_llama_cpp.sh). Intermediate files go to ~/.cache/kasoku/quant_quality/.
"""
from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gguf_info import read_gguf  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
HOME = Path.home() / ".cache" / "kasoku"
KASOKU = ROOT / "target" / "release" / "kasoku"
EXAMPLES = ROOT / "target" / "release" / "examples"
LLAMA_QUANTIZE = HOME / "llama.cpp" / "src" / "build" / "bin" / "llama-quantize"
DOC_DIRS = [Path("/usr/share/doc/python3.11/html/_sources"),
            Path("/tmp/pydoc/usr/share/doc/python3.11/html/_sources")]
GGUF_TYPES = ["Q4_0", "Q4_K_M", "Q5_K_M", "Q8_0"]
KASOKU_VARIANTS = [("M", ["--format", "m"]), ("M no-rot", ["--format", "m", "--no-rotate"]),
                   ("mixed", ["--format", "mixed"]),
                   ("L", ["--format", "l"]), ("L no-rot", ["--format", "l", "--no-rotate"])]


def run(cmd: list, **kw) -> None:
    print("+", " ".join(str(c) for c in cmd), file=sys.stderr, flush=True)
    subprocess.run([str(c) for c in cmd], check=True, **kw)


def doc_file(rel: str) -> Path:
    for d in DOC_DIRS:
        if (d / rel).exists():
            return d / rel
    deb = sorted(Path("/tmp").glob("python3.11-doc_*.deb"))
    if not deb:
        run(["apt-get", "download", "python3.11-doc"], cwd="/tmp")
        deb = sorted(Path("/tmp").glob("python3.11-doc_*.deb"))
    run(["dpkg-deb", "-x", deb[-1], "/tmp/pydoc"])
    return DOC_DIRS[1] / rel


def gguf_bits(path: Path) -> dict:
    info = read_gguf(path)
    values = bytes_ = mvalues = mbytes = 0
    for t in info["tensors"]:
        n = 1
        for d in t["shape"]:
            n *= d
        b = t["nbytes"]
        values, bytes_ = values + n, bytes_ + b
        if t["name"].startswith("blk.") and len(t["shape"]) == 2:
            mvalues, mbytes = mvalues + n, mbytes + b
    return {"bpw_all": 8 * bytes_ / values, "bpw_layers": 8 * mbytes / mvalues, "bytes": bytes_}


def safetensors_bits(path: Path) -> dict:
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    specs = json.loads(header["__metadata__"]["kasoku.tensors"])
    values = bytes_ = mvalues = mbytes = 0
    sizes = {k: v["data_offsets"][1] - v["data_offsets"][0] for k, v in header.items()
             if k != "__metadata__"}
    for name, size in sizes.items():
        base = name.rsplit(".", 1)[0]
        if base in specs:
            continue
        n = 1
        for d in header[name]["shape"]:
            n *= d
        values, bytes_ = values + n, bytes_ + size
    for name, spec in specs.items():
        rows, cols = spec["shape"]
        b = sum(sizes.get(f"{name}.{p}", 0) for p in ("codes", "scales", "zeros"))
        values, bytes_ = values + rows * cols, bytes_ + b
        if name.startswith("blk.") or ".layers." in name:
            mvalues, mbytes = mvalues + rows * cols, mbytes + b
    return {"bpw_all": 8 * bytes_ / values, "bpw_layers": 8 * mbytes / mvalues, "bytes": bytes_}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=str(HOME / "models" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"))
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "quant_quality.json"))
    args = ap.parse_args()

    work = HOME / "quant_quality"
    work.mkdir(parents=True, exist_ok=True)
    stem = Path(args.model).stem
    f32 = work / f"{stem}.f32.gguf"
    if not f32.exists():
        run([EXAMPLES / "dequantize_gguf", args.model, f32, "f32"])
    threads = str(os.cpu_count() or 1)
    models: list[tuple[str, Path, dict]] = []
    for t in GGUF_TYPES:
        out = work / f"{stem}.{t}.gguf"
        if not out.exists():
            run([LLAMA_QUANTIZE, f32, out, t, threads], stdout=subprocess.DEVNULL)
        models.append((f"GGUF {t}", out, gguf_bits(out)))
    for label, flags in KASOKU_VARIANTS:
        out = work / f"{stem}.kasoku-{label.replace(' ', '-')}"
        if not (out / "model.safetensors").exists():
            run([KASOKU, "quantize", f32, out, *flags])
        models.append((f"kasoku {label}", out, safetensors_bits(out / "model.safetensors")))

    texts = [("python", Path("/usr/lib/python3.11/fractions.py")),
             ("python", Path("/usr/lib/python3.11/heapq.py")),
             ("prose", doc_file("faq/general.rst.txt")),
             ("prose", doc_file("faq/design.rst.txt"))]
    cmd = [EXAMPLES / "quant_quality", "--ref", f32, "--ctx", args.ctx, "--chunks", args.chunks]
    for label, path, _ in models:
        cmd += ["--model", f"{label}={path}"]
    for group, path in texts:
        cmd += ["--text", f"{group}={path}"]
    print("+", " ".join(str(c) for c in cmd), file=sys.stderr, flush=True)
    out = subprocess.run([str(c) for c in cmd], check=True, capture_output=True, text=True).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.strip()]
    bits = {label: b for label, _, b in models}
    result = {"source": str(f32), "ctx": args.ctx, "chunks": args.chunks,
              "texts": [str(p) for _, p in texts], "bits": bits, "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))

    groups = sorted({r["group"] for r in rows})
    ref = {g: next(r["ref_ppl"] for r in rows if r["group"] == g) for g in groups}
    print(f"source {f32.name}: reference perplexity " +
          ", ".join(f"{g} {ref[g]:.3f}" for g in groups))
    head = "| model | bpw (all) | bpw (layer matrices) | " + " | ".join(
        f"{g} KL | {g} top-1 | {g} PPL" for g in groups) + " |"
    print(head)
    print("|" + "---|" * (3 + 3 * len(groups)))
    for label, _, b in models:
        cells = []
        for g in groups:
            r = next(r for r in rows if r["model"] == label and r["group"] == g)
            cells += [f"{r['kl']:.4f}", f"{100 * r['top1']:.1f}%", f"{r['ppl']:.3f}"]
        print(f"| {label} | {b['bpw_all']:.3f} | {b['bpw_layers']:.3f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
