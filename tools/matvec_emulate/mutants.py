"""Self-test of the emulation: injects known bugs into copies of common.cuh / matvec.cu and checks
that `main.h quick` (streamed build) reports each (a FAIL line or an emulation assert).
Usage: python3 tools/matvec_emulate/mutants.py   (about 5 minutes on 2 cores)"""
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
K = os.path.join(HERE, "../../crates/kasoku-cuda/src/kernels")
MUTANTS = [
    ("stream: wait on parity k & 1 instead of (k / stages) & 1", "matvec.cu",
     "stream_wait(full + stage, (u32)((k / stages) & 1));", "stream_wait(full + stage, (u32)(k & 1));"),
    ("stream: no __syncthreads before a stage is refilled", "matvec.cu",
     "__syncthreads();  // every warp is done with this stage's bytes", ";"),
    ("stream: refill with tile t + stages instead of t + stages * grid", "matvec.cu",
     "int next = t + stages * gridDim.x;", "int next = t + stages;"),
    ("stream: tile's lead ignored", "matvec.cu",
     "const u8* w_j0 = stream_buf + stage * stage_bytes + x.lead +", "const u8* w_j0 = stream_buf + stage * stage_bytes +"),
    ("stream: copy length not rounded up to 16", "matvec.cu",
     "x.bytes = (u32)((((size_t)end + 15) & ~(size_t)15) - (size_t)x.src);", "x.bytes = (u32)((size_t)end - (size_t)x.src);"),
    ("stream: block_best not cleared", "matvec.cu",
     "        for (int r = threadIdx.x; r < a.n; r += blockDim.x) block_best[r] = 0;\n    __syncthreads();\n    int lane",
     "        ;\n    __syncthreads();\n    int lane"),
    ("split: partial sums of the wrong warp", "matvec.cu",
     "t += partial[(warp + p) * 2 * NR + i];", "t += partial[(warp + p - (p > 1)) * 2 * NR + i];"),
    ("glu: group completes after 31 counts", "matvec.cu", "if (prev != 31) return;", "if (prev != 30) return;"),
    ("last partial tile: slot r reads row r, not min(r, nr - 1)", "matvec.cu",
     "size_t row_a = (size_t)(r0 + min(r, nr - 1)) * a.ldx;\n            int4 p[4];",
     "size_t row_a = (size_t)(r0 + r) * a.ldx;\n            int4 p[4];"),
    ("Q4_K: high nibbles' minimum on the low half's sum", "matvec.cu",
     "float xl = half ? sl.z : sl.y, xh = half ? sh.z : sh.y;\n#pragma unroll\n            for (int w = 0; w < 2; w++) {\n                int s0",
     "float xl = half ? sl.z : sl.y, xh = half ? sl.z : sh.y;\n#pragma unroll\n            for (int w = 0; w < 2; w++) {\n                int s0"),
    ("quant_block32: second-half sum from lane 15", "matvec.cu",
     "__shfl_sync(0xffffffffu, sum, 16)", "__shfl_sync(0xffffffffu, sum, 15)"),
    ("norm tail: last block test off by one", "matvec.cu",
     "last_block = atomicAdd(count, 1u) == gridDim.x - 1;", "last_block = atomicAdd(count, 1u) == gridDim.x - 2;"),
]


def main():
    fails = 0
    for name, f, old, new in MUTANTS:
        with tempfile.TemporaryDirectory() as t:
            kd = os.path.join(t, "kernels")
            os.mkdir(kd)
            for g in ("common.cuh", "matvec.cu"):
                shutil.copy(os.path.join(K, g), kd)
            src = open(os.path.join(kd, f)).read()
            if src.count(old) != 1:
                print(f"SKIP {name}: pattern found {src.count(old)} times")
                fails += 1
                continue
            open(os.path.join(kd, f), "w").write(src.replace(old, new))
            env = dict(os.environ, KASOKU_KERNELS=kd)
            subprocess.run([sys.executable, os.path.join(HERE, "gen.py"), os.path.join(t, "k.cpp")], env=env, check=True)
            flags = "-O2 -std=c++20 -w -ffp-contract=off -fno-strict-aliasing -DKASOKU_MATVEC_STREAM".split()
            subprocess.run(["g++", *flags, "-I" + HERE, os.path.join(t, "k.cpp"), "-o", os.path.join(t, "k")], check=True)
            r = subprocess.run([os.path.join(t, "k"), "quick"], capture_output=True, text=True, timeout=600)
            out = r.stdout + r.stderr
            first = next((l for l in out.splitlines() if l.startswith("FAIL") or "EMULATION" in l), "")
            caught = r.returncode != 0
            fails += not caught
            print(f"{'caught' if caught else 'MISSED'} {name}: rc {r.returncode}; {first[:150]}", flush=True)
    print(f"{len(MUTANTS) - fails} of {len(MUTANTS)} injected bugs caught")
    return fails != 0


if __name__ == "__main__":
    sys.exit(main())
