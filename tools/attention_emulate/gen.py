"""Builds the host emulation's translation unit: common.cuh (its PTX conversions and
griddepcontrol replaced), the batch description, head_post and qkv_post of ops.cu,
quant_block32 of matvec.cu and the whole of attention.cu, after tools/matvec_emulate/pre.h's shims (every
__shared__ variable registered, so each block starts with it poisoned) and before main.h's
driver. Fails if a pattern it replaces is not found or any asm is left."""
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
K = os.environ.get("KASOKU_KERNELS", os.path.join(HERE, "../../crates/kasoku-cuda/src/kernels"))
OUT = sys.argv[1]


def read(name):
    return open(os.path.join(K, name)).read()


def sub(pat, rep, text, count_min=1):
    new, n = re.subn(pat, rep, text, flags=re.S)
    if n < count_min:
        sys.exit(f"gen.py: pattern not found ({n} < {count_min}): {pat}")
    return new


def grab(pat, text):
    m = re.search(pat, text, flags=re.S)
    if not m:
        sys.exit(f"gen.py: pattern not found: {pat}")
    return m.group(0)


def register_shared(text, count_min):
    return sub(r"(\n\s*)__shared__ ([^;\n]*?)(\w+)(\[[^\]\n]*\])?;", r"\1__shared__ \2\3\4; emu_shared(&\3, sizeof(\3));",
               text, count_min)


common = read("common.cuh")
common = sub(r"__device__ __forceinline__ float h2f\(u16 h\) \{.*?\n\}\n", "", common)
common = sub(r"__device__ __forceinline__ u16 f2h\(float f\) \{.*?\n\}\n", "", common)
common = sub(r'asm volatile\("griddepcontrol\.[a-z_]+;"[^;]*\);', ";", common, 3)
ops = read("ops.cu")
batch = grab(r"struct Batch \{.*?\n\};\n", ops)
head_post = register_shared(grab(r"__device__ __noinline__ void head_post\(.*?\n\}\n", ops), 1)
qkv_post = register_shared(grab(r'extern "C" __global__ void __launch_bounds__\(128\) qkv_post\(.*?\n\}\n', ops), 1)
quant = grab(r"__device__ __forceinline__ void quant_block32\(.*?\n\}\n", read("matvec.cu"))
att = register_shared(read("attention.cu"), 15)
body = (common + batch + quant + head_post + qkv_post + att).replace('extern "C" ', "")
code = re.sub(r"//[^\n]*", "", body)
if re.search(r"\basm\b", code):
    sys.exit("gen.py: inline asm left: " + code[re.search(r"\basm\b", code).start():][:120])
open(OUT, "w").write('#include "pre.h"\n' + body + '\n#include "main.h"\n')
