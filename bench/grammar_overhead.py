"""Decode speed with and without an enforced json_schema, against a running `kasoku serve`.

Usage: kasoku serve --model M --port 8766 --spec none &
       python3 bench/grammar_overhead.py [--url http://127.0.0.1:8766] [--rounds 4]

The same question is asked plain and under a strict json_schema, taking turns (the machine's
bandwidth drifts); each answer's decode speed comes from the server's usage.timings. Prints the
per-run speeds, the medians and their ratio (schema / plain).
"""

import argparse
import json
import statistics
import urllib.request

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "summary": {"type": "string"},
        "features": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "summary", "features"],
    "additionalProperties": False,
}
QUESTION = ("Describe the Rust programming language as JSON with a name, a long summary and "
            "a list of features.")


def ask(url, model, schema):
    body = {"model": model, "messages": [{"role": "user", "content": QUESTION}],
            "temperature": 0, "max_tokens": 128}
    if schema:
        body["response_format"] = {"type": "json_schema",
                                   "json_schema": {"name": "d", "schema": SCHEMA, "strict": True}}
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    v = json.load(urllib.request.urlopen(req))
    return v["usage"]["timings"]["decode_tokens_per_s"], v["usage"]["completion_tokens"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8766")
    ap.add_argument("--rounds", type=int, default=4)
    a = ap.parse_args()
    model = json.load(urllib.request.urlopen(a.url + "/v1/models"))["data"][0]["id"]
    runs = {"plain": [], "schema": []}
    for _ in range(a.rounds):
        for kind in runs:
            runs[kind].append(ask(a.url, model, kind == "schema"))
    med = {}
    for kind, r in runs.items():
        med[kind] = statistics.median(x[0] for x in r)
        print(f"{kind:6} t/s {[round(x[0], 1) for x in r]} tokens {[x[1] for x in r]} "
              f"median {med[kind]:.1f}")
    print(f"schema / plain: {med['schema'] / med['plain']:.3f}")


if __name__ == "__main__":
    main()
