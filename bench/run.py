#!/usr/bin/env python3
"""kasoku against llama.cpp and against this machine's memory-bandwidth ceiling, in one command.

    python3 bench/run.py                 # every model in ../shared/models/MODELS.md, 5 runs each
    python3 bench/run.py --quick         # 2 runs, decode 128 only: a smoke test of the harness
    python3 bench/run.py --model smollm2-135m --model path/to/other.gguf --runs 7 --hybrid

For each model, both engines get the same GGUF file, the same thread count and the same kind of
synthetic prompt (random token ids, as llama-bench uses):
  prefill  one forward pass over a 512-token prompt (kasoku bench / llama-bench -p 512);
  decode   128 and 512 tokens generated one pass at a time after a 16-token context
           (kasoku: greedy argmax; llama-bench -n N -d 16 feeds random tokens, no sampling;
           argmax over the vocabulary costs well under 1% of a step);
  verify   the time of one forward pass over k = 1, 2, 4, 8, 16 tokens after 16 tokens of
           context (kasoku bench --verify, logits at all k positions; llama-bench -p k -n 0 -d 16,
           whose prompt batches compute the last position's logits only).
Engines alternate run by run (A B A B ...) after one untimed warm-up run of each; kasoku/llama.cpp
ratios are computed pair by pair (run i of one against run i of the other) and summarised by their
median. Peak memory is the child process's maximum resident set (wait4 rusage), the same for both.
The ceiling: decode tokens/s = best read bandwidth at the same thread count (tools/bandwidth.c,
with transparent huge pages as kasoku's weights use) /
bytes one step reads (bench/gguf_info.py: weights + f16 KV cache at the decode's mean context).

Outputs: bench/results/latest.json, bench/results/latest.md, bench/results/chart.svg and
BENCHMARKS.md (regenerated). Python 3.11 standard library only.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
import chart  # noqa: E402
import gguf_info  # noqa: E402
import report  # noqa: E402

CACHE = Path(os.environ.get("KASOKU_CACHE", Path.home() / ".cache" / "kasoku"))
MODELS_DIR = Path(os.environ.get("KASOKU_MODELS") or CACHE / "models")
SYNTH_DIR = MODELS_DIR / "synthetic"
LLAMA_DIR = CACHE / "llama.cpp"
LLAMA_BIN = LLAMA_DIR / "sdist" / "llama_cpp_python-0.3.36" / "vendor" / "llama.cpp" / "build" / "bin"
SHARED_MODELS = REPO.parent / "shared" / "models"
CONTEXT = 16  # must equal kasoku bench's CONTEXT (crates/kasoku-cli/src/bench.rs)
OPTIONAL = {"gemma3-270m"}  # measured only when cached and kasoku runs it
HYBRID = ["qwen3.5-0.8b-q4_k_m", "qwen3.5-0.8b-q8_0", "qwen3.5-2b-q4_k_m", "qwen3.5-2b-q8_0"]


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------
# processes


class Proc:
    """A finished child process: exit code, output, wall time, peak resident memory, and the share
    of the machine's CPU time that went to other processes while it ran (`foreign_cpu`, 0..1)."""

    def __init__(self, rc: int, out: str, err: str, wall: float, max_rss: int | None, timed_out: bool,
                 foreign_cpu: float | None = None):
        self.rc, self.out, self.err, self.wall, self.max_rss, self.timed_out = rc, out, err, wall, max_rss, timed_out
        self.foreign_cpu = foreign_cpu

    def tail(self, n: int = 3) -> str:
        lines = [ln for ln in (self.err or self.out).strip().splitlines() if ln.strip()]
        return " | ".join(lines[-n:]) if lines else f"exit {self.rc}"


def cpu_busy_seconds() -> float | None:
    """Busy CPU seconds of the whole machine so far (/proc/stat: user+nice+system+irq+softirq+steal)."""
    try:
        f = Path("/proc/stat").read_text().splitlines()[0].split()
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in f[1:9])
        return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def run_proc(cmd: list[str], timeout: float = 3600, env: dict | None = None) -> Proc:
    """Runs cmd; peak RSS from wait4's rusage of exactly this child (kB on Linux); foreign CPU =
    (machine busy time - the child's own CPU time) / (wall time x CPUs)."""
    with tempfile.TemporaryFile() as fo, tempfile.TemporaryFile() as fe:
        busy0 = cpu_busy_seconds()
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=fo, stderr=fe, env=env)
        killed = threading.Event()

        def kill() -> None:
            killed.set()
            p.kill()

        timer = threading.Timer(timeout, kill)
        timer.start()
        try:
            _, status, ru = os.wait4(p.pid, 0)
        finally:
            timer.cancel()
        p.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        busy1 = cpu_busy_seconds()
        foreign = None
        if busy0 is not None and busy1 is not None and wall > 0:
            own = ru.ru_utime + ru.ru_stime
            foreign = max(0.0, min(1.0, (busy1 - busy0 - own) / (wall * (os.cpu_count() or 1))))
        fo.seek(0)
        fe.seek(0)
        return Proc(p.returncode, fo.read().decode(errors="replace"), fe.read().decode(errors="replace"),
                    wall, ru.ru_maxrss * 1024 if ru.ru_maxrss else None, killed.is_set(), foreign)


# ------------------------------------------------------------------------------------------------
# the machine


def machine() -> dict:
    m: dict = {"platform": platform.platform(), "python": platform.python_version(), "nproc": os.cpu_count()}
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        keep = ["Architecture", "Model name", "CPU(s)", "Thread(s) per core", "Core(s) per socket", "Socket(s)",
                "CPU max MHz", "L1d cache", "L2 cache", "L3 cache", "NUMA node(s)", "Hypervisor vendor"]
        info = {}
        for line in lscpu.splitlines():
            k, _, v = line.partition(":")
            if k.strip() in keep:
                info[k.strip()] = v.strip()
        flags = next((ln.split(":", 1)[1].split() for ln in lscpu.splitlines() if ln.startswith("Flags")), [])
        info["SIMD"] = " ".join(f for f in ["avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx_vnni"] if f in flags)
        m["lscpu"] = info
    except OSError:
        pass
    try:
        meminfo = Path("/proc/meminfo").read_text()
        kb = int(next(ln for ln in meminfo.splitlines() if ln.startswith("MemTotal")).split()[1])
        m["mem_total_gib"] = round(kb / (1 << 20), 1)
    except (OSError, StopIteration, ValueError):
        pass
    return m


def load_average() -> list[float]:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return []


def git_state() -> dict:
    def g(*a: str) -> str:
        return subprocess.run(["git", "-C", str(REPO), *a], capture_output=True, text=True).stdout.strip()
    return {"commit": g("rev-parse", "--short", "HEAD"), "dirty": bool(g("status", "--porcelain", "--untracked-files=no"))}


def bandwidth(threads: int, reps: int, mib: int) -> dict:
    script = REPO / "tools" / "bandwidth.sh"
    ts = sorted({1, threads})
    p = run_proc(["bash", str(script), "--mib", str(mib), "--reps", str(reps), "--threads", ",".join(map(str, ts))],
                 timeout=900)
    if p.rc != 0:
        raise SystemExit(f"bandwidth meter failed: {p.tail()}")
    bw = json.loads(p.out)
    by_t = {r["threads"]: r for r in bw["results"]}
    bw["threads_used"] = threads
    bw["gbps"] = by_t[threads]["best_gbps"]
    bw["gbps_1thread"] = by_t[1]["best_gbps"]
    return bw


def quick_bandwidth(threads: int) -> float | None:
    """A short meter run (512 MiB, best of 3, `threads` threads) between engine runs: GB/s, or None."""
    script = REPO / "tools" / "bandwidth.sh"
    p = run_proc(["bash", str(script), "--mib", "512", "--reps", "3", "--threads", str(threads)], timeout=300)
    if p.rc != 0:
        return None
    try:
        return json.loads(p.out)["results"][0]["best_gbps"]
    except (json.JSONDecodeError, KeyError, IndexError):
        return None


# ------------------------------------------------------------------------------------------------
# models


def known_models() -> list[tuple[str, str]]:
    """(name, file) rows of ../shared/models/MODELS.md's table, in order."""
    md = SHARED_MODELS / "MODELS.md"
    rows = []
    if md.exists():
        for line in md.read_text().splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) > 2 and "`" in cells[1] and cells[0] not in ("name",) and not cells[0].startswith("-"):
                rows.append((cells[0], cells[1].split("`")[1]))
    return rows or [("smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf"),
                    ("qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"),
                    ("qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")]


def resolve(spec: str, fetch: bool) -> tuple[Path | None, str]:
    """A --model value (known name, synthetic name, or path) -> (path or None, note)."""
    p = Path(spec).expanduser()
    if p.is_file():
        return p, ""
    synth = SYNTH_DIR / f"{spec}.gguf"
    if synth.is_file():
        return synth, ""
    files = dict(known_models())
    if spec not in files:
        return None, f"unknown model {spec!r} (not a file, not in MODELS.md, not in {SYNTH_DIR})"
    cached = MODELS_DIR / files[spec]
    if cached.is_file():
        return cached, ""
    if spec in OPTIONAL and not fetch:
        return None, f"not cached (optional; `bash {SHARED_MODELS}/fetch.sh {spec}` to include it)"
    fetcher = SHARED_MODELS / "fetch.sh"
    if not fetcher.exists():
        return None, f"not cached and no {fetcher}"
    log(f"fetching {spec}")
    r = run_proc(["bash", str(fetcher), spec], timeout=1800)
    path = Path(r.out.strip().splitlines()[-1]) if r.rc == 0 and r.out.strip() else None
    return (path, "") if path and path.is_file() else (None, f"fetch failed: {r.tail()}")


# ------------------------------------------------------------------------------------------------
# engines


class Kasoku:
    name = "kasoku"

    def __init__(self, binary: Path):
        self.binary = binary

    def available(self) -> str | None:
        return None if self.binary.is_file() else f"no binary at {self.binary}"

    def version(self) -> str:
        r = run_proc([str(self.binary), "--version"], timeout=30)
        return r.out.strip() or r.tail()

    def run(self, model: Path, a: argparse.Namespace) -> dict:
        with tempfile.TemporaryDirectory() as d:
            out = Path(d) / "kasoku.json"
            cmd = [str(self.binary), "bench", "--model", str(model), "--prompt-tokens", str(a.prompt_tokens),
                   "--gen-tokens", str(max(a.gen)), "--threads", str(a.threads), "--json", str(out)]
            if a.verify:
                cmd += ["--verify", ",".join(map(str, a.verify))]
            else:
                cmd += ["--verify", "1"]
            p = run_proc(cmd, timeout=a.timeout)
            if p.rc != 0 or not out.exists():
                return {"error": ("timed out" if p.timed_out else p.tail()), "cmd": shlex.join(cmd)}
            j = json.loads(out.read_text())
        at = {x["tokens"]: x["tokens_per_second"] for x in j["decode"]["at"]}
        res = {
            "prefill": j["prefill"]["tokens_per_second"],
            "peak_rss": p.max_rss,
            "self_peak_rss": j["memory"].get("peak_rss_bytes"),
            "wall": p.wall,
            "foreign_cpu": p.foreign_cpu,
            "cmd": shlex.join(cmd),
        }
        for n in a.gen:
            res[f"decode_{n}"] = at.get(n)
        if a.verify:
            res["verify_ms"] = {str(x["k"]): x["median_ms"] for x in j["verify"]["points"]}
        res["raw"] = {k: j.get(k) for k in ("bytes", "verify", "load_seconds", "threads")}
        return res


    def profile(self, model: Path, a: argparse.Namespace) -> dict:
        """Where a decode step's time goes (kasoku bench --profile), or {'error': ...}."""
        with tempfile.TemporaryDirectory() as d:
            out = Path(d) / "profile.json"
            cmd = [str(self.binary), "bench", "--model", str(model), "--prompt-tokens", "16", "--gen-tokens", "8",
                   "--verify", "1", "--threads", str(a.threads), "--profile", "--json", str(out)]
            p = run_proc(cmd, timeout=a.timeout)
            if p.rc != 0 or not out.exists():
                return {"error": p.tail(), "cmd": shlex.join(cmd)}
            prof = json.loads(out.read_text()).get("profile") or {}
            prof["cmd"] = shlex.join(cmd)
            return prof


class LlamaCpp:
    name = "llama.cpp"

    def __init__(self, bin_dir: Path):
        self.bench = bin_dir / "llama-bench"

    def available(self) -> str | None:
        return None if self.bench.is_file() else f"no {self.bench} (run tools/build_llama_cpp.sh)"

    def version(self) -> str:
        v = LLAMA_DIR / "VERSION"
        if v.exists():
            return "; ".join(ln.strip() for ln in v.read_text().splitlines() if ln.strip())[:300]
        return run_proc([str(self.bench), "--version"], timeout=30).tail(2)

    def _bench(self, model: Path, t: int, extra: list[str], timeout: float) -> tuple[list[dict] | None, Proc, list]:
        cmd = [str(self.bench), "-m", str(model), "-t", str(t), "-o", "json", *extra]
        p = run_proc(cmd, timeout=timeout)
        if p.rc != 0:
            return None, p, cmd
        try:
            return json.loads(p.out), p, cmd
        except json.JSONDecodeError:
            return None, p, cmd

    def run(self, model: Path, a: argparse.Namespace) -> dict:
        res: dict = {"cmd": []}
        rss = []
        foreign: list[tuple[float, float]] = []
        pp, p, cmd = self._bench(model, a.threads, ["-p", str(a.prompt_tokens), "-n", "0", "-r", "1"], a.timeout)
        res["cmd"].append(shlex.join(cmd))
        if pp is None:
            return {"error": p.tail(), "cmd": res["cmd"]}
        res["prefill"] = pp[0]["avg_ts"]
        rss.append(p.max_rss or 0)
        foreign.append((p.wall, p.foreign_cpu))
        tg, p, cmd = self._bench(model, a.threads, ["-p", "0", "-n", ",".join(map(str, a.gen)), "-d", str(CONTEXT),
                                                    "-r", "1"], a.timeout)
        res["cmd"].append(shlex.join(cmd))
        if tg is None:
            return {"error": p.tail(), "cmd": res["cmd"]}
        for t in tg:
            res[f"decode_{t['n_gen']}"] = t["avg_ts"]
        rss.append(p.max_rss or 0)
        foreign.append((p.wall, p.foreign_cpu))
        if a.verify:
            ks = ",".join(map(str, a.verify))
            vf, p, cmd = self._bench(model, a.threads, ["-p", ks, "-n", "0", "-d", str(CONTEXT), "-r",
                                                        str(a.verify_reps)], a.timeout)
            res["cmd"].append(shlex.join(cmd))
            if vf is not None:
                res["verify_ms"] = {str(t["n_prompt"]): statistics.median(t["samples_ns"]) / 1e6 for t in vf}
                rss.append(p.max_rss or 0)
                foreign.append((p.wall, p.foreign_cpu))
        res["peak_rss"] = max(rss) or None
        known = [(w, f) for w, f in foreign if f is not None]
        if known:
            res["foreign_cpu"] = sum(w * f for w, f in known) / max(1e-9, sum(w for w, _ in known))
        return res


# ------------------------------------------------------------------------------------------------
# one model


def summarize(values: list[float]) -> dict | None:
    v = [x for x in values if x is not None]
    if not v:
        return None
    return {"median": statistics.median(v), "min": min(v), "max": max(v), "n": len(v)}


def bench_model(name: str, path: Path, engines: list, a: argparse.Namespace, bw: dict | None) -> dict:
    info = gguf_info.decode_bytes(path)
    entry: dict = {"name": name, "path": str(path), "info": info, "status": {}, "runs": {e.name: [] for e in engines},
                   "warmup": {}, "load_average": {"before": load_average()}}
    live = []
    for e in engines:  # warm-up: page the file in, and find out whether the engine runs this model
        log(f"{name}: warm-up {e.name}")
        r = e.run(path, a)
        entry["warmup"][e.name] = {k: v for k, v in r.items() if k != "raw"}
        if "error" in r:
            entry["status"][e.name] = f"not measured: {r['error']}"
            log(f"{name}: {e.name} failed: {r['error']}")
        else:
            entry["status"][e.name] = "ok"
            live.append(e)
    if name in OPTIONAL and entry["status"].get("kasoku") != "ok":
        entry["skipped"] = f"optional model, kasoku does not run it ({entry['status'].get('kasoku')})"
        return entry
    # This VM's memory bandwidth drifts between settings within minutes: a short meter run
    # between engine runs gives each run the bandwidth of its moment (the mean of the readings
    # just before and just after it).
    before = quick_bandwidth(a.threads) if not a.no_bandwidth_per_run else None
    for i in range(a.runs):
        for e in live:  # strict alternation: A B A B ...
            r = e.run(path, a)
            if "error" in r:
                log(f"{name}: run {i + 1} {e.name} failed: {r['error']}")
            if not a.no_bandwidth_per_run:
                after = quick_bandwidth(a.threads)
                known = [b for b in (before, after) if b]
                r["bandwidth_around"] = [before, after]
                r["bandwidth_gbps"] = sum(known) / len(known) if known else None
                before = after
            entry["runs"][e.name].append(r)
        log(f"{name}: run {i + 1}/{a.runs}: " + ", ".join(
            f"{e.name} pp {_f(entry['runs'][e.name][-1].get('prefill'))} tg{a.gen[0]} "
            f"{_f(entry['runs'][e.name][-1].get(f'decode_{a.gen[0]}'))}" for e in live))
    entry["metrics"] = metrics(entry, a, bw)
    entry["load_average"]["after"] = load_average()
    kas = next((e for e in live if e.name == "kasoku"), None)
    if kas and not a.no_profile:
        log(f"{name}: kasoku bench --profile")
        entry["profile"] = kas.profile(path, a)
    return entry


def _f(x) -> str:
    return f"{x:.1f}" if isinstance(x, (int, float)) else "-"


def metrics(entry: dict, a: argparse.Namespace, bw: dict | None) -> dict:
    runs = entry["runs"]
    k, l = runs.get("kasoku", []), runs.get("llama.cpp", [])
    out: dict = {}
    keys = ["prefill"] + [f"decode_{n}" for n in a.gen]
    for key in keys:
        m: dict = {eng: summarize([r.get(key) for r in rs]) for eng, rs in runs.items()}
        pairs = [(x.get(key), y.get(key)) for x, y in zip(k, l)]
        m["ratio"] = summarize([x / y for x, y in pairs if x and y])
        if key.startswith("decode_") and bw:
            n = int(key.split("_")[1])
            mean_ctx = CONTEXT + n // 2
            bpt = gguf_info.bytes_per_token(entry["info"], mean_ctx, 2)
            ceiling = bw["gbps"] * 1e9 / bpt
            m["ceiling"] = {"tokens_per_second": ceiling, "bytes_per_token": bpt, "mean_context": mean_ctx,
                            "gbps": bw["gbps"]}
            for eng, rs in runs.items():
                if m.get(eng):
                    m[eng]["fraction_of_ceiling"] = m[eng]["median"] / ceiling
                    # Against the bandwidth of each run's own moment.
                    at_run = summarize([r[key] * bpt / (r["bandwidth_gbps"] * 1e9) for r in rs
                                        if r.get(key) and r.get("bandwidth_gbps")])
                    if at_run:
                        m[eng]["fraction_of_ceiling_at_run"] = at_run
        out[key] = m
    out["foreign_cpu"] = summarize([r.get("foreign_cpu") for rs in runs.values() for r in rs])
    out["peak_rss"] = {eng: max((r.get("peak_rss") or 0 for r in rs), default=0) or None for eng, rs in runs.items()}
    if a.verify:
        ver: dict = {}
        for eng, rs in runs.items():
            pts = {}
            for kk in map(str, a.verify):
                pts[kk] = summarize([r.get("verify_ms", {}).get(kk) for r in rs])
            base = pts.get("1")
            for kk, s in pts.items():
                if s and base:
                    s["ratio_to_k1"] = s["median"] / base["median"]
            ver[eng] = pts
        out["verify_ms"] = ver
    return out


# ------------------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", default=[],
                    help="model name (MODELS.md or synthetic) or GGUF path; repeatable; default: all of MODELS.md")
    ap.add_argument("--hybrid", action="store_true", help="add the synthetic Qwen3.5 GGUFs (bench/hybrid_models.py)")
    ap.add_argument("--runs", type=int, default=5, help="timed runs per engine (after one warm-up run each)")
    ap.add_argument("--quick", action="store_true", help="smoke test: 2 runs, decode 128 only, 3 verify reps")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--gen", default="128,512", help="decode lengths (comma-separated)")
    ap.add_argument("--verify", default="1,2,4,8,16", help="verify-curve sizes ('' to skip)")
    ap.add_argument("--verify-reps", type=int, default=7)
    ap.add_argument("--engines", default="kasoku,llama.cpp")
    ap.add_argument("--kasoku-bin", type=Path, default=REPO / "target" / "release" / "kasoku")
    ap.add_argument("--no-build", action="store_true", help="do not run cargo build --release first")
    ap.add_argument("--fetch-optional", action="store_true", help="also fetch optional models (gemma3-270m)")
    ap.add_argument("--bandwidth-reps", type=int, default=7)
    ap.add_argument("--bandwidth-json", type=Path,
                    help="reuse a bandwidth measurement (e.g. bench/results/bandwidth.json from a quiet moment)")
    ap.add_argument("--no-profile", action="store_true", help="skip the kasoku bench --profile pass per model")
    ap.add_argument("--bandwidth-mib", type=int, default=1024)
    ap.add_argument("--no-bandwidth-per-run", action="store_true",
                    help="skip the short meter run between engine runs (the per-run ceiling)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per engine invocation")
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--no-benchmarks-md", action="store_true", help="do not rewrite BENCHMARKS.md")
    ap.add_argument("--render", type=Path, metavar="RESULTS_JSON",
                    help="only regenerate the markdown, chart and BENCHMARKS.md from a results file")
    a = ap.parse_args()
    if a.render:
        result = json.loads(a.render.read_text())
        a.out.mkdir(parents=True, exist_ok=True)
        write_outputs(result, a)
        print(report.markdown(result))
        return
    command = "python3 bench/run.py " + shlex.join(sys.argv[1:])
    git = git_state()  # before this run writes its outputs into the tree
    if a.quick:
        a.runs = min(a.runs, 2)
        a.gen = "128"
        a.verify_reps = 3
        a.bandwidth_reps = 3
    a.gen = [int(x) for x in str(a.gen).split(",") if x.strip()]
    a.verify = [int(x) for x in str(a.verify).split(",") if x.strip()]

    specs = a.model or [n for n, _ in known_models()]
    if a.hybrid:
        specs += [h for h in HYBRID if (SYNTH_DIR / f"{h}.gguf").is_file() and h not in specs]
        missing = [h for h in HYBRID if not (SYNTH_DIR / f"{h}.gguf").is_file()]
        if missing:
            log(f"--hybrid: not built yet: {', '.join(missing)} (run bench/hybrid_models.py)")

    load_before = load_average()
    if load_before and load_before[0] > 0.5 * (os.cpu_count() or 1):
        log(f"WARNING: load average {load_before} — other work is running; numbers will be noisy")

    wanted = [e.strip() for e in a.engines.split(",") if e.strip()]
    engines, engine_notes = [], {}
    if "kasoku" in wanted:
        if not a.no_build:
            log("cargo build --release -p kasoku-cli")
            b = run_proc(["cargo", "build", "--release", "-p", "kasoku-cli"], timeout=3600)
            if b.rc != 0:
                engine_notes["kasoku"] = f"build failed: {b.tail()}"
        k = Kasoku(a.kasoku_bin)
        why = k.available()
        if why:
            engine_notes["kasoku"] = engine_notes.get("kasoku") or why
        else:
            engines.append(k)
            if "kasoku" in engine_notes:
                built = datetime.fromtimestamp(a.kasoku_bin.stat().st_mtime).strftime("%Y-%m-%d %H:%M")
                engine_notes["kasoku"] += f"; measured the existing binary (built {built})"
    if "llama.cpp" in wanted:
        lc = LlamaCpp(LLAMA_BIN)
        why = lc.available()
        if why:
            engine_notes["llama.cpp"] = why
        else:
            engines.append(lc)
    for eng, why in engine_notes.items():
        log(f"{eng}: {why}")

    a.out.mkdir(parents=True, exist_ok=True)
    if a.bandwidth_json:
        bw = json.loads(a.bandwidth_json.read_text())
        if bw.get("threads_used") != a.threads:
            raise SystemExit(f"{a.bandwidth_json} was measured with {bw.get('threads_used')} threads, not {a.threads}")
        bw["reused_from"] = str(a.bandwidth_json)
    else:
        log(f"bandwidth meter ({a.bandwidth_mib} MiB, threads 1 and {a.threads})")
        bw = bandwidth(a.threads, a.bandwidth_reps, a.bandwidth_mib)
        (a.out / "bandwidth.json").write_text(json.dumps(bw, indent=1) + "\n")
    log(f"bandwidth: {bw['gbps_1thread']:.1f} GB/s (1 thread), {bw['gbps']:.1f} GB/s ({a.threads} threads)")

    result = {
        "schema": 1,
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": command,
        "git": git,
        "machine": machine(),
        "settings": {"threads": a.threads, "runs": a.runs, "quick": a.quick, "prompt_tokens": a.prompt_tokens,
                     "gen": a.gen, "context": CONTEXT, "verify": a.verify, "verify_reps": a.verify_reps},
        "engines": {e.name: {"version": e.version()} for e in engines},
        "engine_notes": engine_notes,
        "bandwidth": bw,
        "models": [],
        "load_average": {"before": load_before},
        "complete": False,
    }
    for spec in specs:
        path, note = resolve(spec, a.fetch_optional)
        name = spec if path is None or Path(spec).name != path.name else path.stem
        if path is None:
            log(f"{spec}: skipped: {note}")
            result["models"].append({"name": spec, "skipped": note})
            continue
        log(f"{name}: {path}")
        result["models"].append(bench_model(name, path, engines, a, bw))
        write_outputs(result, a)  # partial results survive an interrupted run
    result["load_average"]["after"] = load_average()
    if not a.bandwidth_json and any("metrics" in m for m in result["models"]):
        # Memory bandwidth on a shared VM drifts: measure again and keep the best as the ceiling.
        log("bandwidth meter again (the ceiling uses the better of the two measurements)")
        again = bandwidth(a.threads, a.bandwidth_reps, a.bandwidth_mib)
        first = {k: bw[k] for k in ("gbps", "gbps_1thread", "results")}
        bw.update(gbps=max(bw["gbps"], again["gbps"]), gbps_1thread=max(bw["gbps_1thread"], again["gbps_1thread"]),
                  measurements=[first, {k: again[k] for k in ("gbps", "gbps_1thread", "results")}])
        log(f"bandwidth: {again['gbps']:.1f} GB/s now, {bw['gbps']:.1f} GB/s used for the ceiling")
        (a.out / "bandwidth.json").write_text(json.dumps(bw, indent=1) + "\n")
        for m in result["models"]:
            if "metrics" in m:
                m["metrics"] = metrics(m, a, bw)
    result["complete"] = True
    write_outputs(result, a)
    print(report.markdown(result))


def write_outputs(result: dict, a: argparse.Namespace) -> None:
    (a.out / "latest.json").write_text(json.dumps(result, indent=1) + "\n")
    (a.out / "chart.svg").write_text(chart.svg(result))
    (a.out / "latest.md").write_text(report.markdown(result))
    if not a.no_benchmarks_md:
        # Sections written by other benchmarks (hybrid shapes, speculative decoding, serving)
        # follow KEEP_MARKER and survive the rewrite.
        path = REPO / "BENCHMARKS.md"
        old = path.read_text() if path.exists() else ""
        kept = old[old.index(KEEP_MARKER):] if KEEP_MARKER in old else KEEP_MARKER + "\n"
        path.write_text(report.benchmarks_md(result, chart_path="bench/results/chart.svg").rstrip() + "\n\n" + kept)


KEEP_MARKER = "<!-- The sections below come from other benchmark commands; bench/run.py keeps them. -->"


if __name__ == "__main__":
    main()
