#!/usr/bin/env python3
"""Prompt lookup against plain decoding on copy-heavy code-editing requests, through `kasoku run`.

Each request of bench/prompts/code_edit.jsonl (a function or class of ours with an edit to make
to it: type hints, renames, docstrings, f-strings, `with` statements; the answer copies most of
the prompt) is answered greedily once per strategy, the strategies taking turns in alternating
order, every answer in a process of its own (`kasoku run --device D --spec S -n N`). Reported
per request and in total: generation speed and tokens per target pass from run's statistics,
and whether each strategy's answer is byte for byte plain decoding's.

    python3 bench/prompt_lookup.py --kasoku target/release/kasoku --model M.gguf --device cuda
    python3 bench/prompt_lookup.py ... --strategies none,ngram,ngram:16 --out DIR

A strategy `ngram:16` is prompt lookup with --tree-budget 16 (`ngram:8:fixed`: always 8 nodes,
--fixed-budget); `draft` and `dflash` get --draft. Writes DIR/prompt_lookup.{json,md}
and each answer (DIR/answers/NAME.STRATEGY.txt).
"""

import argparse
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GEN = re.compile(r"generation (\d+) tokens at ([\d.]+) t/s \| ([\d.]+) tokens/pass")
DEVICE = re.compile(r"\] device (\S+)")


def run_one(args, message, strategy):
    spec, *rest = strategy.split(":")
    cmd = [args.kasoku, "run", "--model", args.model, "--device", args.device, "--spec", spec,
           "-n", str(args.max_tokens), "-m", message]
    for opt in rest:
        cmd += ["--fixed-budget"] if opt == "fixed" else ["--tree-budget", opt]
    if spec in ("draft", "dflash"):
        cmd += ["--draft", args.draft]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd[:9])} ...: exit {p.returncode}\n{p.stderr[-2000:]}")
    m = GEN.search(p.stderr)
    if not m:
        sys.exit(f"no statistics line in:\n{p.stderr[-2000:]}")
    d = DEVICE.search(p.stderr)
    return p.stdout, {
        "generated": int(m.group(1)),
        "tokens_per_s": float(m.group(2)),
        "tokens_per_pass": float(m.group(3)),
        "device": d.group(1) if d else "?",
        "stats": [line for line in p.stderr.splitlines() if "generation" in line or "speculation" in line],
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kasoku", default=str(ROOT / "target" / "release" / "kasoku"))
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--prompts", default=str(ROOT / "bench" / "prompts" / "code_edit.jsonl"))
    ap.add_argument("--strategies", default="none,ngram")
    ap.add_argument("--draft", default="", help="for the strategies draft and dflash")
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--limit", type=int, default=0, help="first N requests only")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "prompt_lookup"))
    args = ap.parse_args()

    requests = [json.loads(line) for line in open(args.prompts) if line.strip()]
    if args.limit:
        requests = requests[:args.limit]
    strategies = args.strategies.split(",")
    assert strategies[0] == "none", "the first strategy is plain decoding (none), the reference"
    out = Path(args.out)
    (out / "answers").mkdir(parents=True, exist_ok=True)
    rows = []
    for i, req in enumerate(requests):
        order = strategies if i % 2 == 0 else strategies[::-1]
        texts, stats = {}, {}
        for s in order:
            texts[s], stats[s] = run_one(args, req["message"], s)
            (out / "answers" / f"{req['name']}.{s.replace(':', '_')}.txt").write_text(texts[s])
        row = {"name": req["name"], "strategies": stats,
               "identical": {s: texts[s] == texts["none"] for s in strategies}}
        rows.append(row)
        print(req["name"], " ".join(
            f"{s}: {stats[s]['tokens_per_s']:.1f} t/s {stats[s]['tokens_per_pass']:.2f} t/pass"
            f"{'' if row['identical'][s] else ' DIFFERENT TEXT'}" for s in strategies), flush=True)

    def total(s):
        # Whole-set speed: all generated tokens over all generation time.
        toks = sum(r["strategies"][s]["generated"] for r in rows)
        secs = sum(r["strategies"][s]["generated"] / r["strategies"][s]["tokens_per_s"] for r in rows)
        return toks / secs

    summary = {s: {
        "tokens_per_s": total(s),
        "speedup_vs_plain": total(s) / total("none"),
        "median_speedup": statistics.median(
            r["strategies"][s]["tokens_per_s"] / r["strategies"]["none"]["tokens_per_s"] for r in rows),
        "mean_tokens_per_pass": statistics.mean(r["strategies"][s]["tokens_per_pass"] for r in rows),
        "all_identical": all(r["identical"][s] for r in rows),
    } for s in strategies}
    result = {"model": args.model, "device": rows[0]["strategies"]["none"]["device"],
              "max_tokens": args.max_tokens, "summary": summary, "requests": rows}
    (out / "prompt_lookup.json").write_text(json.dumps(result, indent=1) + "\n")
    md = ["| strategy | tokens/s | × plain | median × | tokens/pass | text = plain |",
          "|---|--:|--:|--:|--:|---|"]
    for s, v in summary.items():
        md.append(f"| {s} | {v['tokens_per_s']:.1f} | {v['speedup_vs_plain']:.2f} | "
                  f"{v['median_speedup']:.2f} | {v['mean_tokens_per_pass']:.2f} | "
                  f"{'yes' if v['all_identical'] else 'NO'} |")
    (out / "prompt_lookup.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
