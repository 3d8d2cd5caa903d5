"""Builds the host emulation's translation unit: common.cuh (without its PTX conversions), the
batch description of ops.cu, quant_block32 of matvec.cu, the sigmoid_gate kernel of ops.cu and
the whole of delta_net.cu, after pre.h's shims and before main.h's driver."""
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
K = os.path.join(HERE, "../../crates/kasoku-cuda/src/kernels")
OUT = sys.argv[1]


def read(name):
    return open(os.path.join(K, name)).read()


common = read("common.cuh")
common = re.sub(r"__device__ __forceinline__ float h2f\(u16 h\) \{.*?\n\}\n", "", common, flags=re.S)
common = re.sub(r"__device__ __forceinline__ u16 f2h\(float f\) \{.*?\n\}\n", "", common, flags=re.S)
ops = read("ops.cu")
batch = re.search(r"struct Batch \{.*?\n\};\n", ops, flags=re.S).group(0)
gate = re.search(r'extern "C" __global__ void sigmoid_gate\(.*?\n\}\n', ops, flags=re.S).group(0)
matvec = read("matvec.cu")
quant = re.search(r"__device__ __forceinline__ void quant_block32\(.*?\n\}\n", matvec, flags=re.S).group(0)
delta = read("delta_net.cu")
body = (common + batch + quant + gate + delta).replace('extern "C" ', "")
open(OUT, "w").write('#include "pre.h"\n' + body + '\n#include "main.h"\n')
