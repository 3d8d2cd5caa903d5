"""Builds the host emulation's translation unit: common.cuh and matvec.cu (the real sources)
with their inline PTX replaced (griddepcontrol and prefetch: nothing; mbarrier / bulk copies:
emu_ptx.h's emulation), CUDA's keywords by pre.h's shims, 16-byte vector casts by a checked
cast (al16) and weight loads (LDW, __ldg, ld16) by bounds-checked ones. Fails if any asm is
left or a pattern it replaces is not found (the kernel source changed: adjust this file)."""
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
K = os.environ.get("KASOKU_KERNELS", os.path.join(HERE, "../../crates/kasoku-cuda/src/kernels"))
OUT = sys.argv[1]
common = open(os.path.join(K, "common.cuh")).read()
mv = open(os.path.join(K, "matvec.cu")).read()


def sub(pat, rep, text, count_min=1, flags=re.S):
    new, n = re.subn(pat, rep, text, flags=flags)
    if n < count_min:
        sys.exit(f"gen.py: pattern not found ({n} < {count_min}): {pat}")
    return new


# common.cuh: h2f/f2h come from pre.h (_Float16); griddepcontrol is a no-op on the host.
common = sub(r"__device__ __forceinline__ float h2f\(u16 h\) \{.*?\n\}\n", "", common)
common = sub(r"__device__ __forceinline__ u16 f2h\(float f\) \{.*?\n\}\n", "", common)
common = sub(r'asm volatile\("griddepcontrol\.[a-z_]+;"[^;]*\);', ";", common, 3)
common = sub(r"__device__ __forceinline__ u16 ld16\(const u8\* p\) \{ return \*\(const u16\*\)p; \}",
             "__device__ __forceinline__ u16 ld16(const u8* p) { return ldw_chk((const u16*)p); }", common)

# matvec.cu
mv = sub(r'asm volatile\("prefetch\.global\.L2 \[%0\];" ::"l"\(p \+ o\)\);', "(void)(p + o);", mv, 2)
mv = sub(r'asm volatile\("mbarrier\.arrive\.expect_tx[^;]*;[^;]*;\s*asm volatile\("cp\.async\.bulk[^;]*;[^;]*;',
         "emu_fetch(bar, dst, src, bytes);", mv)
mv = sub(r'asm volatile\("\{\\n \.reg \.pred p;\\n mbarrier\.try_wait\.parity.*?: "memory"\);',
         "done = emu_try_wait(bar, parity);", mv)
mv = sub(r'asm volatile\("mbarrier\.init\.shared::cta\.b64 \[%0\], 1;" ::"r"\(smem_u32\(full \+ i\)\) : "memory"\);',
         "emu_mbar_init(full + i, 1);", mv)
mv = sub(r'asm volatile\("fence\.mbarrier_init\.release\.cluster;" ::: "memory"\);', ";", mv)
mv = sub(r"(\n\s*)__shared__ ([^;\n]*?)(\w+)(\[[^\]\n]*\])?;", r"\1__shared__ \2\3\4; emu_shared(&\3, sizeof(\3));", mv, 8)
mv = sub(r"extern __shared__ __align__\(16\) u8 stream_buf\[\];", "u8* stream_buf = g_dyn_smem;", mv)
mv = sub(r"#define LDW\(p\) \(\*\(p\)\)", "#define LDW(p) ldw_chk(p)", mv)
mv = sub(r"\(const (int4|float4|uint4)\*\)\(", r"al16<\1>(", mv, 5)

for name, text in (("common.cuh", common), ("matvec.cu", mv)):
    code = re.sub(r"//[^\n]*", "", text)
    if re.search(r"\basm\b", code):
        sys.exit(f"gen.py: inline asm left in {name}: " + code[re.search(r'\basm\b', code).start():][:120])

open(OUT, "w").write('#include "pre.h"\n' + common + '\n#include "emu_ptx.h"\n' + mv + '\n#include "main.h"\n')
