#!/usr/bin/env python3
"""Reference chat-template renderings -> tests/fixtures/tokenizer/chat_templates.json.

Each template is rendered by Hugging Face transformers' own `apply_chat_template(...,
tokenize=False)` (Jinja2 sandbox, trim_blocks/lstrip_blocks, HF tojson), from:
  - the SmolLM2 and Qwen2.5-Coder GGUFs (`AutoTokenizer.from_pretrained(dir, gguf_file=...)`),
  - the tiny Qwen3.5 fixture (tests/fixtures/qwen3_5/tiny, enable_thinking on/off).
The JSON stores the template source, bos/eos texts, and the expected text of every case, so the
Rust test runs without the models.

    ~/.cache/kasoku/venv/bin/python tools/chat_template_reference.py
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import jinja2
import transformers
from transformers import AutoTokenizer

ROOT = Path(__file__).resolve().parent.parent
MODELS_DIR = Path(os.environ.get("KASOKU_MODELS", Path.home() / ".cache" / "kasoku" / "models"))

TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city, e.g. «Zürich» & <Paris>; temperature=1e-05 \"quoted\"",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "default": 3}},
                       "required": ["city"]},
    },
}]

CASES = [
    {"name": "one user turn", "messages": [{"role": "user", "content": "Hello"}], "add_generation_prompt": True, "extra": {}},
    {"name": "multi-turn with system", "messages": [
        {"role": "system", "content": "You are a coding assistant."},
        {"role": "user", "content": "Write fizzbuzz"},
        {"role": "assistant", "content": "def fizzbuzz(n):\n    for i in range(1, n + 1):\n        print(i)\n"},
        {"role": "user", "content": "Thanks! Now in Rust?"},
    ], "add_generation_prompt": True, "extra": {}},
    {"name": "no generation prompt, odd characters", "messages": [
        {"role": "user", "content": "He said \"héllo\" & <b>bold</b>\n\n  indented {{ not jinja }}"},
        {"role": "assistant", "content": "  spaced reply  "},
    ], "add_generation_prompt": False, "extra": {}},
    {"name": "tools", "messages": [{"role": "user", "content": "Weather in Zürich?"}], "add_generation_prompt": True,
     "extra": {"tools": TOOLS}},
]
THINKING = [
    {"name": "thinking off", "messages": [{"role": "user", "content": "Hello"}], "add_generation_prompt": True,
     "extra": {"enable_thinking": False}},
    {"name": "thinking on", "messages": [{"role": "user", "content": "Hello"}], "add_generation_prompt": True,
     "extra": {"enable_thinking": True}},
]


def render(tok, cases):
    out = []
    for case in cases:
        extra = dict(case["extra"])
        tools = extra.pop("tools", None)
        text = tok.apply_chat_template(case["messages"], tools=tools, add_generation_prompt=case["add_generation_prompt"],
                                       tokenize=False, **extra)
        out.append(dict(case, expected=text))
    return out


def main() -> None:
    templates = []
    for name, file in [("smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf"),
                       ("qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")]:
        tok = AutoTokenizer.from_pretrained(str(MODELS_DIR), gguf_file=file)
        templates.append({"name": name, "gguf": file, "template": tok.chat_template, "bos_token": tok.bos_token or "",
                          "eos_token": tok.eos_token or "", "cases": render(tok, CASES)})
    tiny = ROOT / "tests" / "fixtures" / "qwen3_5" / "tiny"
    tok = AutoTokenizer.from_pretrained(str(tiny))
    templates.append({"name": "qwen3_5/tiny", "hf_dir": "tests/fixtures/qwen3_5/tiny", "template": tok.chat_template,
                      "bos_token": tok.bos_token or "", "eos_token": tok.eos_token or "",
                      "cases": render(tok, CASES + THINKING)})
    result = {"source": f"transformers {transformers.__version__} apply_chat_template(tokenize=False), jinja2 {jinja2.__version__}",
              "templates": templates}
    dest = ROOT / "tests" / "fixtures" / "tokenizer" / "chat_templates.json"
    dest.write_text(json.dumps(result, ensure_ascii=False, indent=1) + "\n")
    print(f"{dest}: {sum(len(t['cases']) for t in templates)} renderings")


if __name__ == "__main__":
    main()
