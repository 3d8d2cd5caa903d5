#!/usr/bin/env python3
"""Load test for `kasoku serve` (stdlib only, loopback only, bounded in time and count).

N client threads send streaming chat requests (greedy, short answers, prompts that share a
system prefix so the prefix cache is exercised) for --duration seconds or --max-requests in
all, whichever comes first. Reports requests/s, generated tokens/s, latency and time-to-first-
token percentiles, errors, and the server's resident memory over time (growth after warm-up).
Exits non-zero on any error or on memory growth beyond --max-growth-mb.

    python3 bench/load_test.py --model smollm2-135m                 # starts target/release/kasoku
    python3 bench/load_test.py --url http://127.0.0.1:8000 --pid PID  # an already running server
"""

import argparse
import http.client
import json
import os
import re
import subprocess
import sys
import threading
import time

SYSTEM = ("You are a helpful assistant for a small town library. The library opens at nine, "
          "closes at five, and lends books for three weeks. ") * 4
QUESTIONS = [
    "When does the library open?", "How long can I borrow a book?", "Can I renew a loan?",
    "Do you have audiobooks?", "Where is the nearest bus stop?", "Write a haiku about books.",
    "What is two plus two?", "Name a famous novel.",
]


def rss_mb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def percentile(values, p):
    if not values:
        return 0.0
    v = sorted(values)
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))]


def one_request(host, port, model, question, max_tokens, timeout):
    body = json.dumps({
        "model": model, "temperature": 0, "max_tokens": max_tokens, "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
    })
    start = time.perf_counter()
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            return {"error": f"HTTP {resp.status}: {resp.read()[:200]!r}"}
        ttft, tokens, done = None, 0, False
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                break
            chunk = json.loads(data)
            if "error" in chunk:
                return {"error": f"stream error: {chunk['error']}"}
            if chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                ttft = ttft or time.perf_counter() - start
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
        if not done:
            return {"error": "stream ended without [DONE]"}
        latency = time.perf_counter() - start
        return {"latency": latency, "ttft": ttft or latency, "tokens": tokens}
    except Exception as e:  # noqa: BLE001 - every failure is counted, none stops the test
        return {"error": f"{type(e).__name__}: {e}"}
    finally:
        conn.close()


def start_server(args):
    cmd = [args.kasoku, "serve", "--model", args.model, "--host", "127.0.0.1", "--port", "0",
           "--parallel", str(args.parallel), "--ctx-size", "2048"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        m = re.search(r"'([^']+)' on http://([\d.]+):(\d+)", line)
        if m:
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
            return proc, m.group(2), int(m.group(3)), m.group(1)
    raise SystemExit(f"server did not start: {' '.join(cmd)}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", help="an already running server (loopback only)")
    ap.add_argument("--pid", type=int, help="its process id, for memory readings")
    ap.add_argument("--model", default="smollm2-135m", help="model to serve when starting one")
    ap.add_argument("--kasoku", default="target/release/kasoku")
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--duration", type=float, default=60)
    ap.add_argument("--max-requests", type=int, default=2000)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--warmup", type=float, default=10, help="seconds before the memory baseline")
    ap.add_argument("--max-growth-mb", type=float, default=64)
    ap.add_argument("--json", help="write the summary here")
    args = ap.parse_args()
    args.duration = min(args.duration, 600)  # bounded, whatever is asked

    proc = None
    if args.url:
        m = re.match(r"http://(127\.0\.0\.1|localhost|\[::1\]):(\d+)", args.url)
        if not m:
            raise SystemExit("--url must be a loopback http:// address")
        host, port, pid = m.group(1), int(m.group(2)), args.pid
        conn = http.client.HTTPConnection(host, port, timeout=10)
        conn.request("GET", "/v1/models")
        model = json.loads(conn.getresponse().read())["data"][0]["id"]
    else:
        proc, host, port, model = start_server(args)
        pid = proc.pid

    results, lock = [], threading.Lock()
    deadline = time.monotonic() + args.duration
    issued = [0]

    def client(i):
        n = i
        while time.monotonic() < deadline:
            with lock:
                if issued[0] >= args.max_requests:
                    return
                issued[0] += 1
            r = one_request(host, port, model, QUESTIONS[n % len(QUESTIONS)], args.max_tokens, 120)
            r["at"] = time.monotonic()
            with lock:
                results.append(r)
            n += 1

    memory = []
    t0 = time.monotonic()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        if pid:
            memory.append((time.monotonic() - t0, rss_mb(pid)))
        time.sleep(1)
    elapsed = time.monotonic() - t0
    if pid:
        memory.append((elapsed, rss_mb(pid)))
    if proc:
        proc.terminate()
        proc.wait()

    ok = [r for r in results if "latency" in r]
    errors = [r["error"] for r in results if "error" in r]
    lat = [r["latency"] for r in ok]
    ttft = [r["ttft"] for r in ok]
    tokens = sum(r["tokens"] for r in ok)
    mem = [m for _, m in memory if m is not None]
    base = [m for t, m in memory if m is not None and t >= args.warmup]
    growth = (max(base) - base[0]) if len(base) > 1 else 0.0
    summary = {
        "clients": args.clients, "parallel": args.parallel if proc else None,
        "duration_s": round(elapsed, 1), "requests": len(results), "errors": len(errors),
        "requests_per_s": round(len(ok) / elapsed, 2), "tokens_per_s": round(tokens / elapsed, 1),
        "latency_ms": {p: round(percentile(lat, q) * 1e3, 1) for p, q in (("p50", 50), ("p90", 90), ("p99", 99))},
        "ttft_ms": {p: round(percentile(ttft, q) * 1e3, 1) for p, q in (("p50", 50), ("p90", 90), ("p99", 99))},
        "rss_mb": {"first": round(mem[0], 1) if mem else None, "peak": round(max(mem), 1) if mem else None,
                   "growth_after_warmup": round(growth, 1)},
        "load_average_before_end": os.getloadavg()[0],
    }
    print(json.dumps(summary, indent=2))
    if errors:
        print(f"{len(errors)} errors, first: {errors[0]}", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)
    failed = bool(errors) or not ok or growth > args.max_growth_mb
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
