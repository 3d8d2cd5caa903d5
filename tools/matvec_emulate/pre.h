// CUDA shims for the host emulation of matvec.cu (see gen.py). A block's threads are fibers
// (cooperative user-level threads on one OS thread, one stack each) switched only at
// barriers: __syncthreads is a block barrier, and the warp collectives (__shfl_*_sync,
// __syncwarp) exchange through per-warp tables between two warp barriers that all 32 lanes
// must reach. A barrier no fiber can pass (some threads waiting at another barrier, or
// finished) is reported as a deadlock and aborts. Blocks of a grid run one after another;
// __shared__ variables are statics (one block alive at a time), atomics are plain
// read-modify-writes.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cmath>
#include <math.h>
#include <cstdint>
#include <algorithm>
#include <functional>
#include <map>
#include <vector>
#include <memory>
#include <string>
#include <cstdarg>
using std::min;
#define __CUDA_ARCH__ 900
#define __device__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __global__
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
struct float4 { float x, y, z, w; };
struct uint4 { unsigned x, y, z, w; };
struct int4 { int x, y, z, w; };
struct dim3_ { unsigned x = 0, y = 0, z = 0; };
dim3_ threadIdx, blockIdx, blockDim, gridDim;
static float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
static uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
static float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static float __uint_as_float(unsigned i) { float f; memcpy(&f, &i, 4); return f; }
static unsigned __float_as_uint(float f) { unsigned i; memcpy(&i, &f, 4); return i; }
static float h2f(unsigned short h) { _Float16 x; memcpy(&x, &h, 2); return (float)x; }
static unsigned short f2h(float f) { _Float16 x = (_Float16)f; unsigned short h; memcpy(&h, &x, 2); return h; }
#define EMU_FAIL(...) do { fprintf(stderr, "EMULATION ASSERT (block %u thread %u): ", blockIdx.x, threadIdx.x); \
    fprintf(stderr, __VA_ARGS__); fprintf(stderr, "\n"); abort(); } while (0)
static void __trap() { EMU_FAIL("__trap()"); }
static size_t __cvta_generic_to_shared(const void* p) { return (size_t)p; }
static void __threadfence() {}

// ---- memory the kernel may read through LDW / __ldg / ld16: the weight buffers (each with
// the 64 bytes of slack the device buffers carry) and the dynamic shared memory of a launch.
struct Range { const unsigned char* p; size_t len; };
static std::vector<Range> g_weights;
alignas(128) static unsigned char g_dyn_smem[100 * 1024 + 128];
static size_t g_dyn_size = 0;  // bytes of dynamic shared memory the launch asked for
static long long g_bad_reads = 0;
static void chk_read(const void* p, size_t n) {
    const unsigned char* b = (const unsigned char*)p;
    if (b >= g_dyn_smem && b < g_dyn_smem + sizeof g_dyn_smem) {
        if (b + n > g_dyn_smem + g_dyn_size) {
            if (g_bad_reads++ < 5) fprintf(stderr, "read of %zu bytes at dynamic shared offset %zu past its %zu bytes\n", n, (size_t)(b - g_dyn_smem), g_dyn_size);
        }
        return;
    }
    for (auto& r : g_weights) if (b >= r.p && b + n <= r.p + r.len) return;
    if (g_bad_reads++ < 5) fprintf(stderr, "weight read of %zu bytes at %p outside every weight buffer (+64 slack)\n", n, p);
}
// Activation rows of the running product (exactly its n rows): 16-byte vector reads must land
// in them, the weights or the dynamic shared memory.
static std::vector<Range> g_acts;
static void chk_any(const void* p, size_t n) {
    const unsigned char* b = (const unsigned char*)p;
    for (auto& r : g_acts) if (b >= r.p && b + n <= r.p + r.len) return;
    chk_read(p, n);
}
template <class T> static T __ldg(const T* p) { chk_read(p, sizeof(T)); return *p; }
template <class T> static T ldw_chk(const T* p) { chk_read(p, sizeof(T)); return *p; }
template <class T> static T __ldcg(const T* p) { return *p; }
// A cast to a 16-byte vector pointer (the device faults on a misaligned vector load).
static long long g_misaligned = 0;
template <class T> static const T* al16(const void* p) {
    if ((size_t)p & 15) { if (g_misaligned++ < 5) fprintf(stderr, "misaligned 16-byte vector load at %p\n", p); }
    chk_any(p, 16);
    return (const T*)p;
}

// ---- integer intrinsics (CUDA Math API definitions)
static int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; i++) c += (int)(signed char)(a >> (8 * i)) * (int)(signed char)(b >> (8 * i));
    return c;
}
static int __vsubss4(int a, int b) {  // per byte, signed, saturated
    unsigned r = 0;
    for (int i = 0; i < 4; i++) {
        int d = (int)(signed char)(a >> (8 * i)) - (int)(signed char)(b >> (8 * i));
        d = d < -128 ? -128 : d > 127 ? 127 : d;
        r |= (unsigned)(d & 0xff) << (8 * i);
    }
    return (int)r;
}
static unsigned __funnelshift_r(unsigned lo, unsigned hi, unsigned shift) {
    unsigned long long v = ((unsigned long long)hi << 32) | lo;
    return (unsigned)(v >> (shift & 31));
}
static unsigned atomicAdd(unsigned* p, unsigned v) { unsigned o = *p; *p = o + v; return o; }
static int atomicAdd(int* p, int v) { int o = *p; *p = o + v; return o; }
static unsigned long long atomicMax(unsigned long long* p, unsigned long long v) {
    unsigned long long o = *p; if (v > o) *p = v; return o;
}

// ---- fibers
extern "C" void emu_switch(void** save_sp, void* to_sp);
asm(R"(
.text
.globl emu_switch
.type emu_switch,@function
emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
.size emu_switch, .-emu_switch
)");
enum { F_RUN, F_WAIT, F_DONE };
#define EMU_MAXT 256
#define EMU_STACK (256 * 1024)
struct Fiber { void* sp; int state, bar; };
static Fiber g_f[EMU_MAXT];
static char* g_stacks = nullptr;
static void* g_sched_sp;
static int g_cur, g_nthreads, g_arrived[1 + EMU_MAXT / 32];
static bool g_reverse = false;  // scheduling order of the fibers (main runs both)
static std::function<void()> g_body;
static void fiber_entry() {
    g_body();
    g_f[g_cur].state = F_DONE;
    emu_switch(&g_f[g_cur].sp, g_sched_sp);
    abort();
}
static void emu_barrier(int id, int expected) {
    Fiber& f = g_f[g_cur];
    f.state = F_WAIT; f.bar = id;
    if (++g_arrived[id] == expected) {
        g_arrived[id] = 0;
        for (int i = 0; i < g_nthreads; i++) if (g_f[i].state == F_WAIT && g_f[i].bar == id) g_f[i].state = F_RUN;
    }
    emu_switch(&f.sp, g_sched_sp);
}
static void __syncthreads() { emu_barrier(0, g_nthreads); }
static void warp_bar() { emu_barrier(1 + (int)(threadIdx.x >> 5), 32); }
static void __syncwarp() { warp_bar(); }
static unsigned long long g_xchg[EMU_MAXT];
template <class T> static T shfl_from(T v, int src_lane) {
    unsigned long long b = 0; memcpy(&b, &v, sizeof(T));
    int me = threadIdx.x;
    g_xchg[me] = b;
    warp_bar();
    unsigned long long r = g_xchg[(me & ~31) + (src_lane & 31)];
    warp_bar();
    T out; memcpy(&out, &r, sizeof(T)); return out;
}
template <class T> static T __shfl_xor_sync(unsigned mask, T v, int o) {
    if (mask != 0xffffffffu) EMU_FAIL("partial shuffle mask");
    return shfl_from(v, (int)(threadIdx.x & 31) ^ o);
}
template <class T> static T __shfl_sync(unsigned mask, T v, int src) {
    if (mask != 0xffffffffu) EMU_FAIL("partial shuffle mask");
    return shfl_from(v, src);
}
// __shared__ variables (statics): registered where declared, poisoned (0xFF) at every block's
// start, as a block's shared memory starts undefined.
static std::vector<std::pair<void*, size_t>> g_shared;
static void emu_shared(void* p, size_t n) {
    for (auto& s : g_shared) if (s.first == p) return;
    g_shared.push_back({p, n});
}
static void block_start();  // emu_ptx.h: per-block state of the emulated mbarriers
static void block_end();
// Runs `body` as a grid of gx × gy × gz blocks of `threads` threads (a multiple of 32), the
// blocks in the order `order` gives (a permutation of the flat indices x + gx * (y + gy * z)).
static void launch3(unsigned gx, unsigned gy, unsigned gz, int threads, const std::vector<unsigned>& order,
                    std::function<void()> body) {
    if (!g_stacks) g_stacks = (char*)aligned_alloc(64, (size_t)EMU_MAXT * EMU_STACK);
    if (threads % 32 || threads > EMU_MAXT) EMU_FAIL("block of %d threads", threads);
    blockDim = {(unsigned)threads, 1, 1}; gridDim = {gx, gy, gz};
    g_body = body; g_nthreads = threads;
    for (unsigned flat : order) {
        blockIdx = {flat % gx, flat / gx % gy, flat / gx / gy};
        block_start();
        for (int i = 0; i < threads; i++) {
            void** top = (void**)(g_stacks + (size_t)(i + 1) * EMU_STACK);
            top[-1] = nullptr;               // fiber_entry's return address (never used)
            top[-2] = (void*)&fiber_entry;   // where emu_switch's ret goes
            for (int k = 3; k <= 8; k++) top[-k] = nullptr;  // rbp rbx r12 r13 r14 r15
            g_f[i] = {(void*)(top - 8), F_RUN, -1};
        }
        memset(g_arrived, 0, sizeof g_arrived);
        int done = 0;
        while (done < threads) {
            bool progress = false;
            for (int k = 0; k < threads; k++) {
                int i = g_reverse ? threads - 1 - k : k;
                if (g_f[i].state != F_RUN) continue;
                g_cur = i; threadIdx = {(unsigned)i, 0, 0};
                emu_switch(&g_sched_sp, g_f[i].sp);
                progress = true;
                if (g_f[i].state == F_DONE) done++;
            }
            if (!progress) {
                fprintf(stderr, "EMULATION DEADLOCK in block (%u, %u, %u):", blockIdx.x, blockIdx.y, blockIdx.z);
                for (int i = 0; i < threads; i++)
                    fprintf(stderr, " t%d:%s", i, g_f[i].state == F_DONE ? "done" : g_f[i].bar == 0 ? "block" : "warp");
                fprintf(stderr, "\n");
                abort();
            }
        }
        block_end();
    }
}
// Runs `body` as a grid of `blocks` blocks of `threads` threads, in order.
static void launch(unsigned blocks, int threads, std::function<void()> body) {
    std::vector<unsigned> order(blocks);
    for (unsigned b = 0; b < blocks; b++) order[b] = b;
    launch3(blocks, 1, 1, threads, order, body);
}
