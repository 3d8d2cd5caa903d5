// Shared definitions of kasoku's CUDA kernels. Self-contained (no CUDA headers): NVRTC compiles
// this file and the kernel files after it as one translation unit at run time.
//
// Arithmetic that decides a result's bits is written with explicit fmaf and the module is
// compiled with --fmad=false, so the compiler cannot fuse some products in one kernel
// instantiation and not in another: each row of a batch gets the same bits whatever the
// batch (batch invariance: a verified draft reproduces plain decoding exactly).

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef signed char i8;

// +infinity (no math.h under NVRTC).
#define KINF __int_as_float(0x7f800000)

// GGML type ids (kasoku's DType::ggml_id).
#define FMT_F32 0
#define FMT_F16 1
#define FMT_Q4_0 2
#define FMT_Q4_1 3
#define FMT_Q5_0 6
#define FMT_Q5_1 7
#define FMT_Q8_0 8
#define FMT_Q4_K 12
#define FMT_Q5_K 13
#define FMT_Q6_K 14
#define FMT_BF16 30

// Programmatic dependent launch: a kernel may start while the one before it drains, so every
// kernel first waits until its predecessor's writes are visible (a no-op when launched
// without the attribute). Called first thing in every kernel (a product first prefetches its
// successor's weights, which no kernel writes).
//
// Once past the wait, a kernel lets the next one launch at once: its blocks become resident
// and stop at their own wait while this kernel runs, so the launch latency between two
// kernels of a pass is hidden instead of paid ~300 times a step. Each kernel still reads
// nothing before its predecessor completes, so results do not change.
//
// With KASOKU_TRIGGER_FIRST the next kernel may launch before this one has even passed its
// own wait: a chain of kernels then becomes resident ahead of the one running, as far as the
// SMs have room. Still safe: a kernel's wait is for its predecessor's completion, not for its
// trigger.
__device__ __forceinline__ void wait_for_predecessor() {
#if __CUDA_ARCH__ >= 900
#if defined(KASOKU_TRIGGER_FIRST) && !defined(KASOKU_NO_EARLY_LAUNCH)
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
    asm volatile("griddepcontrol.wait;" ::: "memory");
#if !defined(KASOKU_TRIGGER_FIRST) && !defined(KASOKU_NO_EARLY_LAUNCH)
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
#endif
}

__device__ __forceinline__ float h2f(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ u16 f2h(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ float bf2f(u16 b) { return __uint_as_float(((u32)b) << 16); }

__device__ __forceinline__ u16 ld16(const u8* p) { return *(const u16*)p; }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over a block of `blockDim.x` threads (a multiple of 32, at most 1024), same order every
// call; `red` holds 32 floats of shared memory. Every thread gets the total.
__device__ __forceinline__ float block_sum(float v, float* red) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float t = lane < nw ? red[lane] : 0.0f;
    t = warp_sum(t);
    return t;
}

__device__ __forceinline__ float block_max(float v, float* red) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float t = lane < nw ? red[lane] : -KINF;
    return warp_max(t);
}

__device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Q4_K / Q5_K: the 6-bit scale and min of sub-block j (0..8) from the 12 packed bytes q.
__device__ __forceinline__ void scale_min_k4(int j, const u8* q, float* sc, float* m) {
    if (j < 4) {
        *sc = (float)(q[j] & 63);
        *m = (float)(q[j + 4] & 63);
    } else {
        *sc = (float)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (float)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

// Value c of a row stored as `fmt` (any format; one value at a time: for embeddings).
__device__ float dequant_one(const u8* row, int fmt, int c) {
    switch (fmt) {
    case FMT_F32: return ((const float*)row)[c];
    case FMT_F16: return h2f(((const u16*)row)[c]);
    case FMT_BF16: return bf2f(((const u16*)row)[c]);
    case FMT_Q4_0: {
        const u8* b = row + (c / 32) * 18; int i = c % 32;
        int q = i < 16 ? (b[2 + i] & 15) : (b[2 + i - 16] >> 4);
        return h2f(ld16(b)) * (float)(q - 8);
    }
    case FMT_Q4_1: {
        const u8* b = row + (c / 32) * 20; int i = c % 32;
        int q = i < 16 ? (b[4 + i] & 15) : (b[4 + i - 16] >> 4);
        return fmaf(h2f(ld16(b)), (float)q, h2f(ld16(b + 2)));
    }
    case FMT_Q5_0: {
        const u8* b = row + (c / 32) * 22; int i = c % 32;
        u32 qh = (u32)ld16(b + 2) | ((u32)ld16(b + 4) << 16);
        int q = i < 16 ? ((b[6 + i] & 15) | (((qh >> i) & 1) << 4))
                       : ((b[6 + i - 16] >> 4) | (((qh >> i) & 1) << 4));
        return h2f(ld16(b)) * (float)(q - 16);
    }
    case FMT_Q5_1: {
        const u8* b = row + (c / 32) * 24; int i = c % 32;
        u32 qh = *(const u32*)(b + 4);
        int q = i < 16 ? ((b[8 + i] & 15) | (((qh >> i) & 1) << 4))
                       : ((b[8 + i - 16] >> 4) | (((qh >> i) & 1) << 4));
        return fmaf(h2f(ld16(b)), (float)q, h2f(ld16(b + 2)));
    }
    case FMT_Q8_0: {
        const u8* b = row + (c / 32) * 34; int i = c % 32;
        return h2f(ld16(b)) * (float)(i8)b[2 + i];
    }
    case FMT_Q4_K: {
        const u8* b = row + (c / 256) * 144; int i = c % 256;
        int j = i / 64, l = i % 64;
        int sub = 2 * j + (l >= 32);
        float sc, m; scale_min_k4(sub, b + 4, &sc, &m);
        u8 byte = b[16 + 32 * j + (l % 32)];
        int q = l < 32 ? (byte & 15) : (byte >> 4);
        return h2f(ld16(b)) * sc * (float)q - h2f(ld16(b + 2)) * m;
    }
    case FMT_Q5_K: {
        const u8* b = row + (c / 256) * 176; int i = c % 256;
        int j = i / 64, l = i % 64;
        int sub = 2 * j + (l >= 32);
        float sc, m; scale_min_k4(sub, b + 4, &sc, &m);
        u8 byte = b[48 + 32 * j + (l % 32)];
        int q = (l < 32 ? (byte & 15) : (byte >> 4)) + (((b[16 + (l % 32)] >> sub) & 1) << 4);
        return h2f(ld16(b)) * sc * (float)q - h2f(ld16(b + 2)) * m;
    }
    case FMT_Q6_K: {
        const u8* b = row + (c / 256) * 210; int i = c % 256;
        int h = i / 128, r = i % 128, quarter = r / 32, l = r % 32;
        const u8* ql = b + 64 * h; const u8* qh = b + 128 + 32 * h;
        int lo = quarter & 1 ? ql[l + 32] : ql[l];
        lo = quarter >= 2 ? (lo >> 4) : (lo & 15);
        int hi = (qh[l] >> (2 * quarter)) & 3;
        float sc = (float)(i8)b[192 + 8 * h + l / 16 + 2 * quarter];
        return h2f(ld16(b + 208)) * sc * (float)((lo | (hi << 4)) - 32);
    }
    }
    return 0.0f;
}
