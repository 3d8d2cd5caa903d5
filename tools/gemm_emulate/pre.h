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
#define __global__
#define __launch_bounds__(n)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
struct float4 {float x,y,z,w;}; struct uint4 {unsigned x,y,z,w;};
struct dim3_ {unsigned x=0,y=0,z=0;};
thread_local dim3_ threadIdx, blockIdx; dim3_ blockDim, gridDim;
static uint4 make_uint4(unsigned a,unsigned b,unsigned c,unsigned d){return {a,b,c,d};}
static float __int_as_float(int i){float f; memcpy(&f,&i,4); return f;}
static float __uint_as_float(unsigned i){float f; memcpy(&f,&i,4); return f;}
static float h2f(unsigned short h){ _Float16 x; memcpy(&x,&h,2); return (float)x; }
static unsigned short f2h(float f){ _Float16 x=(_Float16)f; unsigned short h; memcpy(&h,&x,2); return h; }
template<class T> static T LDG(const T* p){ return *p; }
static void __trap(){ abort(); }
// block / warp barriers of the emulated block
std::unique_ptr<std::barrier<>> g_block; std::vector<std::unique_ptr<std::barrier<>>> g_warp;
static void __syncthreads(){ g_block->arrive_and_wait(); }
static void warp_sync(){ g_warp[threadIdx.x/32]->arrive_and_wait(); }
