"""Speed of kasoku's own formats against the GGUF files of the same model, side by side:
`kasoku bench` (decode, prefill, the verify curve, peak memory) on kasoku M against the
Q4_K_M file, and kasoku L against a Q8_0 requantization, taking turns run by run so that a
drifting machine (memory bandwidth moves with the other work on it) affects them alike; medians
over the rounds.

    python3 bench/quant_speed.py [--model GGUF] [--rounds 3] [--verify 1,2,4,8,16]

The model: the cached Qwen2.5-Coder-1.5B Q4_K_M GGUF. M, L and the Q8_0 file are made from
its f16 dequantization (`examples/dequantize_gguf`; for speed the source's precision does not
matter). Bits per weight are over every tensor (embedding and head included) and over the
decoder layers' matrices alone. Needs target/release/kasoku and examples (cargo build --release
-p kasoku-cli -p kasoku --examples) and llama.cpp's llama-quantize. Files go to
~/.cache/kasoku/quant_speed/.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quant_quality import (EXAMPLES, HOME, KASOKU, LLAMA_QUANTIZE, ROOT,  # noqa: E402
                           gguf_bits, run, safetensors_bits)


def bench(model: Path, verify: str, out: Path, extra: list[str]) -> dict:
    cmd = [KASOKU, "bench", "--model", model, "--verify", verify, "--json", out, *extra]
    subprocess.run([str(c) for c in cmd], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return json.loads(out.read_text())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=str(HOME / "models" / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--verify", default="1,2,4,8,16")
    ap.add_argument("--gen-tokens", default="64")
    ap.add_argument("--prompt-tokens", default="256")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "quant_speed.json"))
    args = ap.parse_args()

    work = HOME / "quant_speed"
    work.mkdir(parents=True, exist_ok=True)
    stem = Path(args.model).stem
    f16 = work / f"{stem}.f16.gguf"
    if not f16.exists():
        run([EXAMPLES / "dequantize_gguf", args.model, f16, "f16"])
    q8 = work / f"{stem}.Q8_0.gguf"
    if not q8.exists():
        run([LLAMA_QUANTIZE, f16, q8, "Q8_0", str(os.cpu_count() or 1)], stdout=subprocess.DEVNULL)
    kas = {}
    for fmt in ("m", "l"):
        out = work / f"{stem}.kasoku-{fmt}"
        if not (out / "model.safetensors").exists():
            run([KASOKU, "quantize", f16, out, "--format", fmt])
        kas[fmt] = out
    models = [("GGUF Q4_K_M", Path(args.model), gguf_bits(Path(args.model))),
              ("kasoku M", kas["m"], safetensors_bits(kas["m"] / "model.safetensors")),
              ("GGUF Q8_0 (requantized)", q8, gguf_bits(q8)),
              ("kasoku L", kas["l"], safetensors_bits(kas["l"] / "model.safetensors"))]
    extra = ["--gen-tokens", args.gen_tokens, "--prompt-tokens", args.prompt_tokens]
    runs: dict[str, list[dict]] = {label: [] for label, _, _ in models}
    for r in range(args.rounds):
        for label, path, _ in models:
            res = bench(path, args.verify, work / "bench.json", extra)
            runs[label].append(res)
            print(f"round {r + 1} {label}: decode {res['decode']['tokens_per_second']:.2f} t/s, "
                  f"prefill {res['prefill']['tokens_per_second']:.1f} t/s", file=sys.stderr, flush=True)

    def med(label: str, f) -> float:
        return statistics.median(f(x) for x in runs[label])

    ks = [int(k) for k in args.verify.split(",")]
    summary = {}
    for label, path, bits in models:
        verify = {k: med(label, lambda x, k=k: next(p["median_ms"] for p in x["verify"]["points"] if p["k"] == k))
                  for k in ks}
        summary[label] = {
            "path": str(path), "bits": bits,
            "decode_tps": med(label, lambda x: x["decode"]["tokens_per_second"]),
            "prefill_tps": med(label, lambda x: x["prefill"]["tokens_per_second"]),
            "verify_ms": verify,
            "verify_ratio": {k: verify[k] / verify[ks[0]] for k in ks},
            "peak_rss_mib": med(label, lambda x: x["memory"]["peak_rss_bytes"] / 2**20),
            "packed_matmul_mib": runs[label][0]["bytes"]["packed_matmul_bytes"] / 2**20,
        }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"rounds": args.rounds, "models": summary,
                                          "runs": runs}, indent=1))
    print(f"medians of {args.rounds} alternating rounds, {runs[models[0][0]][0]['threads']} threads")
    print("| model | bpw (all) | bpw (layers) | decode t/s | prefill t/s | "
          + " | ".join(f"verify k={k} ms" for k in ks) + f" | k={ks[-2] if len(ks) > 1 else ks[0]}/k=1 | peak RSS MiB |")
    print("|" + "---|" * (7 + len(ks)))
    for label, s in summary.items():
        kk = ks[-2] if len(ks) > 1 else ks[0]
        print(f"| {label} | {s['bits']['bpw_all']:.3f} | {s['bits']['bpw_layers']:.3f} | "
              f"{s['decode_tps']:.2f} | {s['prefill_tps']:.1f} | "
              + " | ".join(f"{s['verify_ms'][k]:.1f}" for k in ks)
              + f" | {s['verify_ratio'][kk]:.2f} | {s['peak_rss_mib']:.0f} |")


if __name__ == "__main__":
    main()
