"""Markdown for bench/run.py's results: the tables (bench/results/latest.md) and BENCHMARKS.md."""
from __future__ import annotations

import re

ENGINES = ["kasoku", "llama.cpp"]


def _num(x, digits: int = 1) -> str:
    return f"{x:.{digits}f}" if isinstance(x, (int, float)) else "–"


def _cell(s: dict | None, digits: int = 1) -> str:
    """median [min–max]"""
    if not s:
        return "–"
    if s["n"] == 1:
        return _num(s["median"], digits)
    return f"{_num(s['median'], digits)} [{_num(s['min'], digits)}–{_num(s['max'], digits)}]"


def _mib(b) -> str:
    return f"{b / (1 << 20):.0f} MiB" if b else "–"


def _measured(models: list[dict]) -> list[dict]:
    return [m for m in models if "metrics" in m]


def speed_table(r: dict) -> str:
    s = r["settings"]
    gen = s["gen"]
    head = ["model", "engine", f"prefill {s['prompt_tokens']}"] + [f"decode {n}" for n in gen] + \
        [f"% ceiling (decode {n})" for n in gen] + ["peak RSS"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for m in _measured(r["models"]):
        mt = m["metrics"]
        for eng in ENGINES:
            if eng not in m["runs"]:
                continue
            if m["status"].get(eng) != "ok":
                lines.append(f"| {m['name']} | {eng} | " + " | ".join(["–"] * (len(head) - 3)) +
                             f" | {m['status'].get(eng, '')[:80]} |")
                continue
            row = [m["name"], eng, _cell(mt["prefill"].get(eng))]
            row += [_cell(mt[f"decode_{n}"].get(eng)) for n in gen]
            row += [_pcts(mt[f"decode_{n}"].get(eng)) for n in gen]
            row.append(_mib(mt["peak_rss"].get(eng)))
            lines.append("| " + " | ".join(row) + " |")
        ratio = [_cell(mt["prefill"].get("ratio"), 2)] + [_cell(mt[f"decode_{n}"].get("ratio"), 2) for n in gen]
        if any(c != "–" for c in ratio):
            lines.append(f"| {m['name']} | **kasoku / llama.cpp** | " + " | ".join(f"**{c}**" for c in ratio) +
                         " |" + " |" * len(gen) + " |")
        ceil = [_num((mt[f"decode_{n}"].get("ceiling") or {}).get("tokens_per_second")) for n in gen]
        lines.append(f"| {m['name']} | ceiling | – | " + " | ".join(ceil) + " |" + " |" * len(gen) + " |")
    return "\n".join(lines)


def _pct(x) -> str:
    return f"{100 * x:.0f}%" if isinstance(x, (int, float)) else "–"


def _pcts(m: dict | None) -> str:
    """% of the ceiling at the best bandwidth, then (where measured) the median over runs of the
    % of the ceiling at each run's own bandwidth."""
    m = m or {}
    best = _pct(m.get("fraction_of_ceiling"))
    at = (m.get("fraction_of_ceiling_at_run") or {}).get("median")
    return f"{best} ({_pct(at)})" if at is not None else best


def verify_table(r: dict) -> str:
    ks = [str(k) for k in r["settings"]["verify"]]
    if not ks:
        return ""
    head = ["model", "engine"] + [f"k={k}" for k in ks]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for m in _measured(r["models"]):
        for eng in ENGINES:
            pts = m["metrics"].get("verify_ms", {}).get(eng)
            if not pts or not any(pts.values()):
                continue
            cells = []
            for k in ks:
                p = pts.get(k)
                cells.append("–" if not p else f"{p['median']:.2f} ms ({p.get('ratio_to_k1', float('nan')):.2f}×)")
            lines.append(f"| {m['name']} | {eng} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def bytes_table(r: dict) -> str:
    lines = ["| model | file | weights read / token | KV / position (f16) | recurrent state | tensor types |",
             "|---|---|---|---|---|---|"]
    for m in r["models"]:
        i = m.get("info")
        if not i:
            continue
        types = ", ".join(f"{t} {b / (1 << 20):.0f} MiB" for t, b in i["tensor_bytes_by_type"].items())
        lines.append(f"| {m['name']} | {i['file'].rsplit('/', 1)[-1]} | {i['weights_per_token'] / (1 << 20):.1f} MiB"
                     f"{' (tied head)' if i['tied_head'] else ''} | {i['kv_bytes_per_position_f16'] / 1024:.1f} KiB | "
                     f"{i['recurrent_state_bytes'] / (1 << 20):.1f} MiB | {types} |")
    return "\n".join(lines)


def profile_tables(r: dict) -> str:
    parts = []
    for m in r["models"]:
        p = m.get("profile")
        if not p or "entries" not in p:
            continue
        lines = [f"**{m['name']}**: {p['ms_per_step']:.2f} ms per instrumented step "
                 f"({p['forward_ms_per_step']:.2f} ms through Model::forward"
                 f"{'' if p.get('matches_forward') else '; WARNING: the instrumented path picked other tokens'})", "",
                 "| kind | ms / step | share | GB/s |", "|---|---|---|---|"]
        for e in p["entries"]:
            if e["share"] < 0.005:
                continue
            g = f"{e['gbps']:.1f}" if e.get("gbps") else "–"
            lines.append(f"| {e['kind']} | {e['ms_per_step']:.3f} | {100 * e['share']:.1f}% | {g} |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def notes(r: dict) -> list[str]:
    out = []
    for m in r["models"]:
        if m.get("skipped"):
            out.append(f"- {m['name']}: skipped — {m['skipped']}")
        for eng, st in m.get("status", {}).items():
            if st != "ok":
                out.append(f"- {m['name']}: {eng} {st}")
        if m.get("profile", {}).get("error"):
            out.append(f"- {m['name']}: kasoku --profile failed: {m['profile']['error']}")
    for eng, why in r.get("engine_notes", {}).items():
        out.append(f"- {eng}: {why}")
    return out


def markdown(r: dict) -> str:
    s, bw = r["settings"], r["bandwidth"]
    parts = [
        f"Measured {r['date']}, {s['threads']} threads, {s['runs']} alternated runs per engine after a warm-up"
        f"{' (QUICK smoke run: not for quoting)' if s.get('quick') else ''}; tokens/s as median [min–max]. "
        f"Memory bandwidth {bw['gbps']:.1f} GB/s at {s['threads']} threads ({bw['gbps_1thread']:.1f} GB/s at 1)"
        f"{_per_run_bandwidth(r)}.",
        "",
        speed_table(r),
        "",
    ]
    v = verify_table(r)
    if v:
        parts += [f"Verify curve: time of one forward pass over k tokens after {s['context']} tokens of context "
                  f"(median; × = relative to k=1).", "", v, ""]
    parts += ["Bytes a decode step reads:", "", bytes_table(r), ""]
    pt = profile_tables(r)
    if pt:
        parts += ["Where a kasoku decode step's time goes (`kasoku bench --profile`, 32 steps after "
                  f"{s['context']} tokens; GB/s = bytes the kind reads / its time):", "", pt, ""]
    n = notes(r)
    if n:
        parts += ["Notes:", "", *n, ""]
    return "\n".join(parts)


def _per_run_bandwidth(r: dict) -> str:
    """The spread of the short meter readings between engine runs, with how the % column uses them."""
    seen = [b for m in _measured(r["models"]) for rs in m["runs"].values() for x in rs
            for b in (x.get("bandwidth_around") or []) if b]
    if not seen:
        return ""
    return (f"; between engine runs a short meter read {min(seen):.1f}–{max(seen):.1f} GB/s. "
            "% ceiling: against the ceiling at the best bandwidth, and in parentheses the median over runs "
            "of each run's share of the ceiling at the bandwidth read around it")


def busy_warning(r: dict) -> str:
    """A banner when other processes used the CPUs during the runs (or, for results without that
    measurement, when the load average before the run was high)."""
    n = r["machine"].get("nproc") or 1
    foreign = [m["metrics"]["foreign_cpu"] for m in _measured(r["models"]) if m["metrics"].get("foreign_cpu")]
    if foreign:
        worst = max(f["median"] for f in foreign)
        if worst <= 0.05:
            return ""
        what = f"other processes used a median of up to {100 * worst:.0f}% of the {n} CPUs during a model's runs"
    else:
        la = (r.get("load_average", {}).get("before") or [0.0])[0]
        if la <= 0.5 * n:
            return ""
        what = f"1-minute load average {la:.1f} on {n} CPUs before the run"
    return (f"**The machine was busy during this run ({what}): these numbers are not a valid comparison. "
            "Under CPU contention llama.cpp's spinning thread pool degrades far more than kasoku's, so ratios "
            "come out inflated in kasoku's favour, and the bandwidth (hence the ceiling) comes out low. "
            "Re-run on a quiet machine.**")


def _bw_runs(r: dict) -> str:
    ms = r["bandwidth"].get("measurements")
    if not ms:
        return ""
    return (" (the better of " + " and ".join(f"{x['gbps']:.1f}" for x in ms) +
            " GB/s, measured before and after the models: this VM's bandwidth drifts)")


def _foreign(r: dict) -> str:
    parts = [f"{m['name']} {100 * m['metrics']['foreign_cpu']['median']:.0f}%"
             for m in _measured(r["models"]) if m["metrics"].get("foreign_cpu")]
    return ", ".join(parts) if parts else "not recorded"


def benchmarks_md(r: dict, chart_path: str) -> str:
    return re.sub(r"\n{3,}", "\n\n", _benchmarks_md(r, chart_path))


def _benchmarks_md(r: dict, chart_path: str) -> str:
    m, s = r["machine"], r["settings"]
    cpu = m.get("lscpu", {})
    la = r.get("load_average", {})
    engines = "\n".join(f"- {k}: {v['version']}" for k, v in r.get("engines", {}).items())
    cpu_line = ", ".join(f"{k}: {v}" for k, v in cpu.items())
    return f"""# kasoku benchmarks

kasoku side by side with llama.cpp on the same GGUF files, prompts and threads, and against this
machine's memory-bandwidth ceiling. This file is regenerated by the command below; the raw data is
[bench/results/latest.json](bench/results/latest.json).

```sh
{r['command']}
```

Run on {r['date']} at commit `{r['git']['commit']}`{' (with uncommitted changes)' if r['git']['dirty'] else ''}.
{'**This was a `--quick` smoke run (2 runs, decode 128 only): do not quote these numbers.**' if s.get('quick') else ''}
{'**Partial results: the run was interrupted; only the models below were measured.**' if r.get('complete') is False else ''}
{busy_warning(r)}

## Machine

- CPU: {cpu_line or m.get('platform')}
- memory: {m.get('mem_total_gib', '?')} GiB; {m.get('platform')}
- read bandwidth (tools/bandwidth.c, {r['bandwidth'].get('buffer_bytes', 1 << 30) / (1 << 30):g} GiB buffer, {r['bandwidth'].get('pages', 'small')} pages, best of {r['bandwidth'].get('reps')}): \
{r['bandwidth']['gbps_1thread']:.1f} GB/s with 1 thread, {r['bandwidth']['gbps']:.1f} GB/s with {s['threads']}{_bw_runs(r)}
- load average before / after: {la.get('before')} / {la.get('after')} (on {m.get('nproc')} CPUs; the
  benchmark itself keeps it near the thread count); CPU share taken by other processes during each
  model's runs: {_foreign(r)}

Engines:
{engines}

## Results

![tokens/s per model and engine, ceiling marked]({chart_path})

{markdown(r)}
## Method

- Same file, same threads (`--threads {s['threads']}` / `-t {s['threads']}`), synthetic prompts of random
  token ids for both engines (what llama-bench does).
- Prefill: one pass over {s['prompt_tokens']} tokens from an empty context (`kasoku bench`; `llama-bench -p {s['prompt_tokens']} -n 0`).
- Decode: {', '.join(map(str, s['gen']))} tokens one pass at a time after {s['context']} tokens of context
  (`kasoku bench`, greedy argmax timed with each step; `llama-bench -n N -d {s['context']}`, which feeds
  random tokens without sampling — argmax costs well under 1% of a step).
- Verify curve: one forward pass over k tokens after {s['context']} tokens (`kasoku bench --verify`: logits
  at all k positions, as speculative verification needs; `llama-bench -p k -n 0 -d {s['context']}`: last
  position's logits only, so llama.cpp does slightly less work here).
- Runs alternate engine by engine (A B A B …) after one warm-up run of each; the kasoku/llama.cpp ratio
  is the median of the run-by-run ratios (pair i = run i of each), with min and max.
- Ceiling: tokens/s = read bandwidth at the same thread count / bytes per step, bytes per step = the
  GGUF's weights (embedding table replaced by one row, plus the table when the head is tied) + the f16
  KV cache at the decode's mean context ({s['context']} + N/2 positions) + any recurrent state.
  kasoku keeps its KV cache in f32 (twice the bytes; negligible at these lengths). This VM's
  bandwidth switches between settings (about 35 and 65 GB/s at 2 threads) within minutes, so a
  short meter run (512 MiB, best of 3) goes between engine runs, and each run is also set against
  the ceiling at the mean of the readings just before and after it.
- Peak memory: maximum resident set size of the engine process (wait4 rusage; includes the mapped
  file pages the process touched), the largest over all runs.
"""
