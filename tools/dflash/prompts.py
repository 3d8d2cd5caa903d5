#!/usr/bin/env python3
"""Prompts for regenerating a DFlash drafter's training data with the target itself, built from
the Python standard library's own source (whatever Python runs this; the manifest records which).
No benchmark prompt is used: HumanEval, MBPP and the like never enter.

Three kinds, all over functions that have a docstring (tests, `encodings/`, `pydoc_data/`,
`idlelib/` and `lib2to3/` excluded):

  instruct  a chat request: "Write a Python function `name(signature)` that ...", from the
            docstring (and the class it belongs to), which the target answers in its own words;
  edit      a chat request to rework a given function (add type hints, comments, simplify, turn
            into a class method, ...): answers copy much of the prompt, which is what prompt
            lookup and a drafter must both handle;
  complete  raw code: a file's text up to a function's body, which the target continues;
  body      raw code as HumanEval-style benchmarks pose it (only with `--kinds body`, in a
            file of its own): the file's imports, then a top-level function's header and
            docstring, which the target continues with the body. No benchmark prompt is used;
            this is the same form, from the standard library's functions.

Files are split by a hash of their path: 3% are held out for validation (`split: "val"`).

  python tools/dflash/prompts.py --out prompts.jsonl.xz [--limit N]
"""
from __future__ import annotations

import argparse
import ast
import hashlib
import json
import lzma
import os
import random
import sys
import sysconfig

SKIP_DIRS = {"test", "tests", "idle_test", "encodings", "pydoc_data", "idlelib", "lib2to3",
             "site-packages", "dist-packages", "__pycache__", "turtledemo", "ensurepip"}

INSTRUCT = [
    "Write a Python function `{sig}` that does the following:\n\n{doc}",
    "Implement `{sig}` in Python.\n\n{doc}",
    "I need a Python function with the signature `{sig}`. {doc}\nPlease write it.",
    "Create a Python function `{sig}`.\n\nSpecification:\n{doc}",
]
INSTRUCT_METHOD = [
    "Write the method `{sig}` of a Python class `{cls}`.\n\n{doc}",
    "Implement the `{cls}.{name}` method (`{sig}`).\n\n{doc}",
]
EDIT = [
    "Add type hints to this function:\n\n```python\n{code}\n```",
    "Add comments explaining each step of this code:\n\n```python\n{code}\n```",
    "Rewrite this function to be easier to read, keeping its behaviour:\n\n```python\n{code}\n```",
    "Write unit tests (unittest) for this function:\n\n```python\n{code}\n```",
    "Explain what this function does, then show it with a docstring in Google style:\n\n"
    "```python\n{code}\n```",
    "Find possible bugs or edge cases in this code and show a corrected version:\n\n"
    "```python\n{code}\n```",
]


def stdlib_files(root: str):
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        for f in sorted(filenames):
            if f.endswith(".py") and not f.startswith("test_"):
                yield os.path.join(dirpath, f)


def split_of(rel: str) -> str:
    h = int(hashlib.sha256(rel.encode()).hexdigest()[:8], 16)
    return "val" if h % 100 < 3 else "train"


def signature(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    args = ast.unparse(fn.args)
    ret = f" -> {ast.unparse(fn.returns)}" if fn.returns else ""
    prefix = "async def " if isinstance(fn, ast.AsyncFunctionDef) else ""
    return f"{prefix}{fn.name}({args}){ret}"


def short_doc(doc: str, limit: int = 1200) -> str:
    doc = doc.strip()
    if len(doc) > limit:
        doc = doc[:limit].rsplit("\n", 1)[0]
    return doc


def body_prompt(tree: ast.Module, lines: list[str], fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    """The file's top-level imports (at most 12), then `fn` from its first decorator through
    its docstring: what the target is asked to continue with the function's body."""
    imports = [ast.get_source_segment("".join(lines), n) for n in tree.body
               if isinstance(n, (ast.Import, ast.ImportFrom))][:12]
    start = min([d.lineno for d in fn.decorator_list] + [fn.lineno]) - 1
    head = "".join(lines[start:fn.body[0].end_lineno])
    return ("\n".join(i for i in imports if i) + "\n\n\n" if imports else "") + head


def prompts_of_file(path: str, rel: str, rng: random.Random, variants: int = 1,
                    kinds: frozenset = frozenset({"instruct", "edit", "complete"})):
    try:
        text = open(path, encoding="utf-8").read()
        tree = ast.parse(text)
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return
    lines = text.splitlines(keepends=True)
    split = split_of(rel)

    def functions():
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield None, node
            elif isinstance(node, ast.ClassDef):
                for sub in node.body:
                    if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                        yield node.name, sub

    for cls, fn in functions():
        doc = ast.get_docstring(fn)
        if not doc or len(doc) < 24 or fn.name.startswith("__") and fn.name != "__init__":
            continue
        sig = signature(fn)
        base = {"source": rel, "function": f"{cls + '.' if cls else ''}{fn.name}", "split": split}
        if "body" in kinds and cls is None and len(fn.body) > 1:
            yield {**base, "kind": "body", "text": body_prompt(tree, lines, fn)}
        # The templates are drawn whatever the kinds asked, so the default file stays the same.
        pool = INSTRUCT_METHOD if cls else INSTRUCT
        for tmpl in rng.sample(pool, min(variants, len(pool))):
            if "instruct" in kinds:
                yield {**base, "kind": "instruct",
                       "messages": [{"role": "user", "content": tmpl.format(
                           sig=sig, doc=short_doc(doc), cls=cls, name=fn.name)}]}
        start, end = fn.lineno - 1, fn.end_lineno or fn.lineno
        if fn.decorator_list:
            start = min(d.lineno for d in fn.decorator_list) - 1
        code = "".join(lines[start:end])
        if 3 <= end - start <= 80:
            indent = min((len(l) - len(l.lstrip()) for l in lines[start:end] if l.strip()),
                         default=0)
            code = "".join(l[indent:] if l.strip() else l for l in lines[start:end]).rstrip()
            for tmpl in rng.sample(EDIT, min(variants, len(EDIT))):
                if "edit" in kinds:
                    yield {**base, "kind": "edit",
                           "messages": [{"role": "user", "content": tmpl.format(code=code)}]}
        # Raw continuation: up to ~2500 characters of the file before the body's first line.
        body = fn.body[1] if len(fn.body) > 1 else fn.body[0]
        cut = sum(len(l) for l in lines[:body.lineno - 1])
        prefix = text[max(0, cut - 2500):cut]
        prefix = prefix[prefix.find("\n") + 1:] if cut > 2500 else prefix
        if len(prefix) > 200 and "complete" in kinds:
            yield {**base, "kind": "complete", "text": prefix}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="a .jsonl.xz file")
    ap.add_argument("--stdlib", default=sysconfig.get_paths()["stdlib"])
    ap.add_argument("--extra", action="append", default=[],
                    help="another source tree to draw from (e.g. site-packages), repeatable")
    ap.add_argument("--variants", type=int, default=2,
                    help="instruct and edit prompts per function (different templates)")
    ap.add_argument("--kinds", default="instruct,edit,complete",
                    help="comma-separated kinds to write: instruct, edit, complete, body (body "
                         "goes in a file of its own, so the default file and the shards "
                         "regenerated from it keep their order)")
    ap.add_argument("--limit", type=int, default=0, help="at most this many prompts (0: all)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    kinds = frozenset(k.strip() for k in args.kinds.split(",") if k.strip())
    unknown = kinds - {"instruct", "edit", "complete", "body"}
    if unknown or not kinds:
        ap.error(f"--kinds: unknown or empty: {sorted(unknown)}")
    out, counts = [], {}
    trees = [args.stdlib] + args.extra
    files = [(path, os.path.relpath(path, tree) if i == 0
              else f"extra{i}/{os.path.relpath(path, tree)}")
             for i, tree in enumerate(trees) for path in stdlib_files(tree)]
    for path, rel in files:
        for p in prompts_of_file(path, rel, rng, args.variants, kinds):
            out.append(p)
            key = f"{p['split']}/{p['kind']}"
            counts[key] = counts.get(key, 0) + 1
    rng.shuffle(out)
    if args.limit:
        out = out[:args.limit]
    data = "".join(json.dumps(p) + "\n" for p in out).encode()
    with lzma.open(args.out, "wb") as f:
        f.write(data)
    manifest = {
        "prompts": len(out), "counts": counts, "python": sys.version.split()[0],
        "stdlib": args.stdlib, "extra": args.extra, "variants": args.variants,
        "kinds": sorted(kinds),
        "seed": args.seed, "limit": args.limit,
        "sha256_jsonl": hashlib.sha256(data).hexdigest(),
    }
    with open(args.out + ".manifest.json", "w") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")
    print(json.dumps(manifest))


if __name__ == "__main__":
    main()
