// CUDA's keywords and intrinsics for the host emulation of delta_net.cu: each block's threads
// are std::threads; __syncthreads and __syncwarp are barriers; a warp shuffle is an exchange
// through the warp's slots between two barriers (every lane of the warp calling, as the
// kernels' shuffles are).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cmath>
#include <cstdint>
#include <algorithm>
#include <barrier>
#include <thread>
#include <vector>
#include <memory>
using std::min;
#define __device__
#define __forceinline__ inline
#define __noinline__
#define __global__
#define __launch_bounds__(n)
#define __shared__ static
struct float4 {float x, y, z, w;};
static float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
struct dim3_ {unsigned x = 0, y = 0, z = 0;};
thread_local dim3_ threadIdx, blockIdx;
dim3_ blockDim, gridDim;
static float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static float __uint_as_float(unsigned i) { float f; memcpy(&f, &i, 4); return f; }
static float h2f(unsigned short h) { _Float16 x; memcpy(&x, &h, 2); return (float)x; }
static unsigned short f2h(float f) { _Float16 x = (_Float16)f; unsigned short h; memcpy(&h, &x, 2); return h; }
std::unique_ptr<std::barrier<>> g_block;
std::vector<std::unique_ptr<std::barrier<>>> g_warp;
static void __syncthreads() { g_block->arrive_and_wait(); }
static void __syncwarp() { g_warp[threadIdx.x / 32]->arrive_and_wait(); }
// One 8-byte slot per thread of the block.
static uint64_t g_slots[1024];
template <class T> static T shfl_from(T v, int src_lane) {
  int w = threadIdx.x / 32;
  uint64_t bits = 0;
  memcpy(&bits, &v, sizeof(T));
  g_slots[threadIdx.x] = bits;
  __syncwarp();
  uint64_t got = g_slots[w * 32 + src_lane];
  __syncwarp();
  T out;
  memcpy(&out, &got, sizeof(T));
  return out;
}
template <class T> static T __shfl_xor_sync(unsigned, T v, int o) { return shfl_from(v, (threadIdx.x & 31) ^ o); }
template <class T> static T __shfl_sync(unsigned, T v, int src) { return shfl_from(v, src & 31); }
