"""Builds the host emulation's translation unit: common.cuh and gemm.cu with the PTX wrappers
(cp.async, ldmatrix, mma.sync) replaced by emu_ptx.h and CUDA's keywords by pre.h's shims."""
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
K = os.path.join(HERE, "../../crates/kasoku-cuda/src/kernels")
OUT = sys.argv[1]
common=open(os.path.join(K, "common.cuh")).read()
gemm=open(os.path.join(K, "gemm.cu")).read()
common=re.sub(r"__device__ __forceinline__ float h2f\(u16 h\) \{.*?\n\}\n", "", common, flags=re.S)
common=re.sub(r"__device__ __forceinline__ u16 f2h\(float f\) \{.*?\n\}\n", "", common, flags=re.S)
start=common.index("__device__ __forceinline__ float warp_sum"); end=common.index("// Q4_K / Q5_K")
common=common[:start]+common[end:]
# cut the PTX wrappers out of gemm.cu: from smem_addr up to gemm_store's comment
a=gemm.index("__device__ __forceinline__ u32 smem_addr"); b=gemm.index("// Output (r, j) of the product")
gemm=gemm[:a]+'#include "emu_ptx.h"\n'+gemm[b:]
gemm=gemm.replace("__ldg(","LDG(")
open(OUT, "w").write('#include "pre.h"\n' + common + gemm + '\n#include "main.h"\n')
