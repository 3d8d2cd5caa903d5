"""Builds the host emulation's translation unit for kernels/mma.cu: matvec_emulate's unit
(common.cuh and matvec.cu, the real sources, through tools/matvec_emulate/gen.py: mma.cu uses
matvec.cu's MatArgs, quantize_acts and argmax_key) with its pre.h inlined for blocks of up to
512 threads, then mma.cu with its PTX wrappers (mma.sync, cp.async) cut out for emu_mma.h's
emulations, its dynamic shared memory mapped onto the emulator's and its static shared arrays
registered (poisoned at each block's start), and mma_packed.cu the same way (its L2 prefetch a
no-op). Fails if any asm is left or a pattern is not
found (the kernel source changed: adjust this file)."""
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
MV = os.path.join(HERE, "../matvec_emulate")
K = os.environ.get("KASOKU_KERNELS", os.path.join(HERE, "../../crates/kasoku-cuda/src/kernels"))
OUT = sys.argv[1]


def sub(pat, rep, text, count_min=1, flags=re.S):
    new, n = re.subn(pat, rep, text, flags=flags)
    if n < count_min:
        sys.exit(f"gen.py: pattern not found ({n} < {count_min}): {pat}")
    return new


subprocess.run([sys.executable, os.path.join(MV, "gen.py"), OUT + ".mv"], check=True,
               env=dict(os.environ, KASOKU_KERNELS=K))
unit = open(OUT + ".mv").read()
os.remove(OUT + ".mv")
pre = open(os.path.join(MV, "pre.h")).read()
pre = sub(r"#define EMU_MAXT 256\b", "#define EMU_MAXT 512", pre)
pre = sub(r"#define EMU_STACK \(256 \* 1024\)", "#define EMU_STACK (128 * 1024)", pre)
unit = sub(r'#include "pre.h"\n', lambda m: pre + "\n", unit)
unit = sub(r'\n#include "main.h"\n$', "\n", unit)

mma = open(os.path.join(K, "mma.cu")).read()
a = mma.index("// ---- PTX wrappers")
b = mma.index("// ---- end of PTX wrappers")
mma = mma[:a] + '#include "emu_mma.h"\n' + mma[b:]
mma = sub(r"extern __shared__ __align__\(16\) u8 mma_smem\[\];", "u8* mma_smem = g_dyn_smem;", mma)
mma = sub(r"(\n\s*)__shared__ ([^;\n]*?)(\w+)(\[[^\]\n]*\])?;", r"\1__shared__ \2\3\4; emu_shared(&\3, sizeof(\3));", mma, 1)
# mma_packed.cu: its PTX wrapper (an L2 prefetch) does nothing on the host; its static
# shared arrays are registered like mma.cu's.
packed = open(os.path.join(K, "mma_packed.cu")).read()
a = packed.index("// ---- PTX wrappers")
b = packed.index("// ---- end of PTX wrappers")
packed = (packed[:a] + "static void mmap_prefetch(const u8* p) { (void)p; }\n" + packed[b:])
packed = sub(r"(\n\s*)__shared__ ([^;\n]*?)(\w+)(\[[^\]\n]*\])?;", r"\1__shared__ \2\3\4; emu_shared(&\3, sizeof(\3));", packed, 2)
for name, text in (("mma.cu", mma), ("mma_packed.cu", packed)):
    code = re.sub(r"//[^\n]*", "", text)
    if re.search(r"\basm\b", code):
        sys.exit(f"gen.py: inline asm left in {name}: " + code[re.search(r'\basm\b', code).start():][:120])
open(OUT, "w").write(unit + "\n// ---- mma.cu\n" + mma + "\n// ---- mma_packed.cu\n" + packed + '\n#include "mma_main.h"\n')
