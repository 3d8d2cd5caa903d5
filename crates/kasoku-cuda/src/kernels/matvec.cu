// Matrix products y = x · Wᵀ for 1..N activation rows, straight on the GGUF block layouts.
//
// One warp computes a pair of weight rows (four in the 8-row kernel) against every activation
// row: the rows' bytes come from device memory once and serve all of them (tiles of up to 8 activation rows share each load;
// a second tile re-reads the row from L1/L2, not from DRAM). A lane takes fixed units of the
// row in a fixed order and keeps one partial sum per activation row; the warp then adds its
// lanes' sums in a fixed butterfly. So a row's result does not depend on how many rows came
// with it.
//
// Block formats multiply integer quants with int8 activations (dp4a, four products per
// instruction), as the CPU backend does: activations are quantized per 32 values by their
// producer (`quantize_acts`, fused into RMSNorm, SwiGLU and the attention merge), each block
// with its scale d and d·Σq over each half (for the formats' offsets and minimums). Float
// formats (F32, F16, BF16) multiply f32 activations.

// Most activation rows one matvec call takes (the model's largest pass of tree rows).
#define MATVEC_MAX_ROWS 64

// How a product reads weight bytes: through the read-only cache from device memory, or (with
// KASOKU_MATVEC_STREAM, where rows may sit in shared memory: see matvec_stream) with plain
// loads, which reach either space.
#ifdef KASOKU_MATVEC_STREAM
#define LDW(p) (*(p))
#else
#define LDW(p) __ldg(p)
#endif

struct MatSeg {
    const u8* w;        // rows × row_bytes, GGUF layout
    float* y;           // output: y[r * ldy + j]
    const float* bias;  // or null
    long long row_bytes;
    int fmt;
    int rows;
    int ldy;
    int accumulate;     // 1: y += result (residual epilogue)
    u64* best;          // or null: per activation row, atomicMax of (ordered value, ~index)
    const u8* packed;   // or null: its fragment-order copy (Q4_K, Q6_K; mma_packed.cu)
};

struct MatArgs {
    MatSeg seg[3];
    const float* x;   // f32 activations, x[r * ldx + c] (float formats)
    const i8* xq;     // int8 activations, xq[r * ldx + c] (block formats)
    const float4* xs; // per 32 values: (d, d·Σq first half, d·Σq second half, 0), xs[r * ldx / 32 + b]
    int nseg;
    int cols;
    int n;
    int ldx;
    int split;               // warps per group of weight rows: 1, 2 or 4
    const u8* pre[3];        // weights a later kernel reads (or null): prefetched into L2
    long long pre_len[3];    // their lengths in bytes
    u32* glu_count;          // or null: SwiGLU fused in (glu_group_done), a count per 32 rows
    i8* glu_q;               // the int8 blocks of its result
    float4* glu_s;
    u32* norm_count;         // or null: RMSNorm of segment 0's output fused in (norm_tail)
    const float* norm_w;
    float* norm_y;
    i8* norm_q;
    float4* norm_s;
    float norm_eps;
    int norm_pad;
    int stream_stages;       // > 0: weights streamed through shared memory (matvec_stream)
    int stream_stage_bytes;  // bytes of one stage (a tile's rows, 16-byte aligned, + 32)
};

// Brings `len` bytes at `p` into L2 without waiting for them: the pass's next matrices stream
// in from DRAM while this kernel and the small ones after it run, so the next product finds
// its weights in L2 instead of starting a DRAM round trip. Every thread of the grid takes
// every (grid size)-th 128-byte line.
__device__ __forceinline__ void prefetch_l2(const u8* p, long long len) {
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long o = t * 128; o < len; o += stride * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(p + o));
}

// Quantizes 32 values, one per lane of a warp, to int8 with d = max|v| / 127 and
// q = round-half-even(v / d); writes the quants and (d, d·Σq[0..16), d·Σq[16..32), 0). The
// one rule every producer uses (the maximum and the integer sums do not depend on order).
__device__ __forceinline__ void quant_block32(float v, i8* q, float4* s) {
    int lane = threadIdx.x & 31;
    float amax = warp_max(fabsf(v));
    float d = amax / 127.0f;
    int qi = d == 0.0f ? 0 : (int)rintf(v / d);
    q[lane] = (i8)qi;
    int sum = qi;
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    int s0 = __shfl_sync(0xffffffffu, sum, 0), s1 = __shfl_sync(0xffffffffu, sum, 16);
    if (lane == 0) *s = make_float4(d, d * (float)s0, d * (float)s1, 0.0f);
}

// The RMSNorm of one row of `dim` values (a multiple of 32) by a whole block (every thread
// calling; `part`: dim / 32 doubles of shared memory): per 32-value block its sum of squares
// in f64 (a warp's butterfly), then the blocks' sums by one warp (lane l adds blocks l, l + 32,
// ... in order, then a butterfly), so the bits do not depend on the block's size (the rmsnorm
// kernel and a product's fused tail agree). y = x · scale · w, and with xq/xs its int8
// blocks. x is read from L2 (other blocks of a fused product wrote it). A thread's values and
// weights are loaded before any is used, unconditionally (at a clamped block), so they go out
// together.
#define RMS_HELD 16
__device__ __noinline__ void rms_row(const float* xr, const float* w, float eps, int dim, float* yr, i8* xq, float4* xs,
                        double* part, float* scale_out) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int nb = dim / 32;
    bool held = nb <= RMS_HELD * nw;
    float hv[RMS_HELD], wv[RMS_HELD];
    if (held) {
#pragma unroll
        for (int i = 0; i < RMS_HELD; i++) {
            int b = min(warp + nw * i, nb - 1);
            hv[i] = __ldcg(xr + 32 * b + lane);
            wv[i] = w[32 * b + lane];
        }
    }
#pragma unroll
    for (int i = 0; i < RMS_HELD; i++) {
        int b = warp + nw * i;
        if (!held || b >= nb) break;
        float v = hv[i];
        double ss = warp_sum_d((double)v * (double)v);
        if (lane == 0) part[b] = ss;
    }
    if (!held)
        for (int b = warp; b < nb; b += nw) {
            float v = __ldcg(xr + 32 * b + lane);
            double ss = warp_sum_d((double)v * (double)v);
            if (lane == 0) part[b] = ss;
        }
    __syncthreads();
    if (warp == 0) {
        double t = 0.0;
        for (int b = lane; b < nb; b += 32) t += part[b];
        t = warp_sum_d(t);
        if (lane == 0) *scale_out = 1.0f / sqrtf((float)(t / dim) + eps);
    }
    __syncthreads();
    float scale = *scale_out;
#pragma unroll
    for (int i = 0; i < RMS_HELD; i++) {
        int b = warp + nw * i;
        if (!held || b >= nb) break;
        int c = 32 * b + lane;
        float v = hv[i] * scale * wv[i];
        yr[c] = v;
        if (xq) quant_block32(v, xq + 32 * b, xs + b);
    }
    if (!held)
        for (int b = warp; b < nb; b += nw) {
            int c = 32 * b + lane;
            float v = __ldcg(xr + c) * scale * w[c];
            yr[c] = v;
            if (xq) quant_block32(v, xq + 32 * b, xs + b);
        }
    __syncthreads();
}

// Quantizes rows of f32 activations (a multiple of 32 values): one warp per block of 32.
extern "C" __global__ void quantize_acts(const float* x, long long blocks, i8* xq, float4* xs) {
    wait_for_predecessor();
    long long b = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (b >= blocks) return;
    quant_block32(x[32 * b + (threadIdx.x & 31)], xq + 32 * b, xs + b);
}

__device__ __forceinline__ u32 ld32u(const u8* p) { return (u32)ld16(p) | ((u32)ld16(p + 2) << 16); }

// Each warp computes NW weight rows (w0, w1, ...: a group of consecutive rows of one matrix;
// NW = 2, or 4 in the 8-row kernel) against every activation row: an activation load
// serves all of them. acc[w * NR + r] is weight row w, activation row r. The arithmetic of each
// (weight row, activation row) is the same whatever is beside it.

template <int NR, int NW>
__device__ __forceinline__ void dot_f32(const u8* const* rows, int cols, int lane, int step, const float* x, int ldx, int nr, float* acc) {
    for (int u = lane; u < cols / 8; u += step) {
        float wv[NW][8];
#pragma unroll
        for (int w = 0; w < NW; w++) {
            const float* wr = (const float*)rows[w];
            float4 a = LDW((const float4*)(wr + 8 * u));
            float4 b = LDW((const float4*)(wr + 8 * u + 4));
            wv[w][0] = a.x; wv[w][1] = a.y; wv[w][2] = a.z; wv[w][3] = a.w;
            wv[w][4] = b.x; wv[w][5] = b.y; wv[w][6] = b.z; wv[w][7] = b.w;
        }
#pragma unroll
        for (int r = 0; r < NR; r++) {
            const float4* xv = (const float4*)(x + (size_t)min(r, nr - 1) * ldx + 8 * u);
            float4 p = xv[0], q = xv[1];
            float xs[8] = {p.x, p.y, p.z, p.w, q.x, q.y, q.z, q.w};
#pragma unroll
            for (int w = 0; w < NW; w++)
#pragma unroll
                for (int i = 0; i < 8; i++) acc[w * NR + r] = fmaf(wv[w][i], xs[i], acc[w * NR + r]);
        }
    }
}

template <int NR, int NW, bool BF>
__device__ __forceinline__ void dot_f16(const u8* const* rows, int cols, int lane, int step, const float* x, int ldx, int nr, float* acc) {
    for (int u = lane; u < cols / 8; u += step) {
        float wv[NW][8];
#pragma unroll
        for (int w = 0; w < NW; w++) {
            uint4 raw = LDW((const uint4*)(rows[w] + 16 * u));
            u32 words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
            for (int i = 0; i < 4; i++) {
                u16 lo = (u16)(words[i] & 0xffff), hi = (u16)(words[i] >> 16);
                wv[w][2 * i] = BF ? bf2f(lo) : h2f(lo);
                wv[w][2 * i + 1] = BF ? bf2f(hi) : h2f(hi);
            }
        }
#pragma unroll
        for (int r = 0; r < NR; r++) {
            const float4* xv = (const float4*)(x + (size_t)min(r, nr - 1) * ldx + 8 * u);
            float4 p = xv[0], q = xv[1];
            float xs[8] = {p.x, p.y, p.z, p.w, q.x, q.y, q.z, q.w};
#pragma unroll
            for (int w = 0; w < NW; w++)
#pragma unroll
                for (int i = 0; i < 8; i++) acc[w * NR + r] = fmaf(wv[w][i], xs[i], acc[w * NR + r]);
        }
    }
}

// 16 bytes at a 2-byte-aligned address, as four words: five aligned 32-bit loads and funnel
// shifts (the matrix buffers carry slack past their end for the fifth).
__device__ __forceinline__ void ld16B(const u8* p, u32* out) {
    const u32* b = (const u32*)((size_t)p & ~(size_t)3);
    u32 w[5];
#pragma unroll
    for (int i = 0; i < 5; i++) w[i] = LDW(b + i);
    int sh = ((size_t)p & 3) * 8;
#pragma unroll
    for (int i = 0; i < 4; i++) out[i] = __funnelshift_r(w[i], w[i + 1], sh);
}

// Legacy blocks of 32 values, one block per unit. Q4_0/Q5_0/Q8_0 are d·q (q with its offset
// 8 / 16 / 0), Q4_1/Q5_1 are d·q + m.
template <int NR, int NW>
__device__ __forceinline__ void dot_legacy(const u8* const* rows, int fmt, int cols, int lane, int step, const MatArgs& a, int r0, int nr, float* acc) {
    int bb = fmt == FMT_Q4_0 ? 18 : fmt == FMT_Q4_1 ? 20 : fmt == FMT_Q5_0 ? 22 : fmt == FMT_Q5_1 ? 24 : 34;
    for (int b = lane; b < cols / 32; b += step) {
        float d[NW], m[NW], off = 0.0f;
        int wq[NW][8];
#pragma unroll
        for (int w = 0; w < NW; w++) {
            const u8* blk = rows[w] + (size_t)b * bb;
            d[w] = h2f(ld16(blk));
            m[w] = 0.0f;
            if (fmt == FMT_Q8_0) {
                u32 v[8];
                ld16B(blk + 2, v);
                ld16B(blk + 18, v + 4);
#pragma unroll
                for (int k = 0; k < 8; k++) wq[w][k] = (int)v[k];
            } else {
                const u8* qs; u32 qh = 0;
                if (fmt == FMT_Q4_0) { qs = blk + 2; off = 8.0f; }
                else if (fmt == FMT_Q4_1) { m[w] = h2f(ld16(blk + 2)); qs = blk + 4; }
                else if (fmt == FMT_Q5_0) { qh = ld32u(blk + 2); qs = blk + 6; off = 16.0f; }
                else { m[w] = h2f(ld16(blk + 2)); qh = ld32u(blk + 4); qs = blk + 8; }
                u32 v4[4];
                ld16B(qs, v4);
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    u32 v = v4[k];
                    u32 lo = v & 0x0F0F0F0Fu, hi = (v >> 4) & 0x0F0F0F0Fu;
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        lo |= ((qh >> (4 * k + i)) & 1u) << (8 * i + 4);
                        hi |= ((qh >> (16 + 4 * k + i)) & 1u) << (8 * i + 4);
                    }
                    wq[w][k] = (int)lo;
                    wq[w][k + 4] = (int)hi;
                }
            }
        }
#pragma unroll
        for (int r = 0; r < NR; r++) {
            size_t row_a = (size_t)(r0 + min(r, nr - 1)) * a.ldx;
            const int4* xv = (const int4*)(a.xq + row_a + 32 * b);
            float4 xs = a.xs[row_a / 32 + b];
            int4 p = xv[0], q = xv[1];
            float sx = xs.y + xs.z;
#pragma unroll
            for (int w = 0; w < NW; w++) {
                int sumi = 0;
                sumi = __dp4a(wq[w][0], p.x, sumi); sumi = __dp4a(wq[w][1], p.y, sumi);
                sumi = __dp4a(wq[w][2], p.z, sumi); sumi = __dp4a(wq[w][3], p.w, sumi);
                sumi = __dp4a(wq[w][4], q.x, sumi); sumi = __dp4a(wq[w][5], q.y, sumi);
                sumi = __dp4a(wq[w][6], q.z, sumi); sumi = __dp4a(wq[w][7], q.w, sumi);
                // d·(d_a·Σ q·a − off·Σa) (+ m·Σa)
                float t = fmaf(xs.x, (float)sumi, -off * sx);
                float v = fmaf(d[w], t, acc[w * NR + r]);
                acc[w * NR + r] = fmaf(m[w], sx, v);
            }
        }
    }
}

// Q4_K and Q5_K: a unit is 16 bytes of quants of one 64-value group j of a super-block:
// 16 low nibbles (values 64j + l0 + i, sub-block 2j) and 16 high ones (64j + 32 + l0 + i,
// sub-block 2j + 1), l0 = 0 or 16: half l0/16 of activation blocks 8sb + 2j and 8sb + 2j + 1.
template <int NR, int NW, bool Q5>
__device__ __forceinline__ void dot_q45k(const u8* const* rows, int cols, int lane, int step, const MatArgs& a, int r0, int nr, float* acc) {
    const int bb = Q5 ? 176 : 144, qoff = Q5 ? 48 : 16;
    for (int u = lane; u < cols / 32; u += step) {
        int sb = u >> 3, j = (u >> 1) & 3, half = u & 1, l0 = half * 16;
        int lo[NW][4], hi[NW][4];
        float dl[NW], ml[NW], dh[NW], mh[NW];
#pragma unroll
        for (int w = 0; w < NW; w++) {
            const u8* blk = rows[w] + (size_t)sb * bb;
            float d = h2f(ld16(blk)), dmin = h2f(ld16(blk + 2));
            float sc0, m0, sc1, m1;
            scale_min_k4(2 * j, blk + 4, &sc0, &m0);
            scale_min_k4(2 * j + 1, blk + 4, &sc1, &m1);
            uint4 raw = LDW((const uint4*)(blk + qoff + 32 * j + l0));
            u32 words[4] = {raw.x, raw.y, raw.z, raw.w};
            u32 hw[4] = {0, 0, 0, 0};
            if (Q5) {
                uint4 h = LDW((const uint4*)(blk + 16 + l0));
                hw[0] = h.x; hw[1] = h.y; hw[2] = h.z; hw[3] = h.w;
            }
#pragma unroll
            for (int k = 0; k < 4; k++) {
                lo[w][k] = (int)((words[k] & 0x0F0F0F0Fu) | (Q5 ? ((hw[k] >> (2 * j)) & 0x01010101u) << 4 : 0u));
                hi[w][k] = (int)(((words[k] >> 4) & 0x0F0F0F0Fu) | (Q5 ? ((hw[k] >> (2 * j + 1)) & 0x01010101u) << 4 : 0u));
            }
            dl[w] = d * sc0; ml[w] = dmin * m0; dh[w] = d * sc1; mh[w] = dmin * m1;
        }
        int blo = 8 * sb + 2 * j;
#pragma unroll
        for (int r = 0; r < NR; r++) {
            size_t row_a = (size_t)(r0 + min(r, nr - 1)) * a.ldx;
            int4 pl = *(const int4*)(a.xq + row_a + 32 * blo + l0);
            int4 ph = *(const int4*)(a.xq + row_a + 32 * (blo + 1) + l0);
            float4 sl = a.xs[row_a / 32 + blo], sh = a.xs[row_a / 32 + blo + 1];
            float xl = half ? sl.z : sl.y, xh = half ? sh.z : sh.y;
#pragma unroll
            for (int w = 0; w < NW; w++) {
                int s0 = 0, s1 = 0;
                s0 = __dp4a(lo[w][0], pl.x, s0); s0 = __dp4a(lo[w][1], pl.y, s0);
                s0 = __dp4a(lo[w][2], pl.z, s0); s0 = __dp4a(lo[w][3], pl.w, s0);
                s1 = __dp4a(hi[w][0], ph.x, s1); s1 = __dp4a(hi[w][1], ph.y, s1);
                s1 = __dp4a(hi[w][2], ph.z, s1); s1 = __dp4a(hi[w][3], ph.w, s1);
                float t = acc[w * NR + r];
                t = fmaf(dl[w] * sl.x, (float)s0, t); t = fmaf(-ml[w], xl, t);
                t = fmaf(dh[w] * sh.x, (float)s1, t); t = fmaf(-mh[w], xh, t);
                acc[w * NR + r] = t;
            }
        }
    }
}

#ifdef KASOKU_MATVEC_V2
// Byte k (0..11) of a K-quant super-block's packed scales, from its first 16 bytes in h.
__device__ __forceinline__ u32 k_scale_byte(uint4 h, int k) {
    u32 w = k < 4 ? h.y : (k < 8 ? h.z : h.w);
    return (w >> (8 * (k & 3))) & 0xFFu;
}

// scale_min_k4 on the header in registers.
__device__ __forceinline__ void scale_min_k4_regs(int j, uint4 h, float* sc, float* m) {
    if (j < 4) {
        *sc = (float)(k_scale_byte(h, j) & 63);
        *m = (float)(k_scale_byte(h, j + 4) & 63);
    } else {
        *sc = (float)((k_scale_byte(h, j + 4) & 0xF) | ((k_scale_byte(h, j - 4) >> 6) << 4));
        *m = (float)((k_scale_byte(h, j + 4) >> 4) | ((k_scale_byte(h, j) >> 6) << 4));
    }
}

// dot_q45k with every load of two units issued before any arithmetic: a super-block's header
// (d, dmin, scales) as one 16-byte load, the unit's quants as another (Q5: the high bits as a
// third), for the lane's unit u and u + step together. The arithmetic is dot_q45k's, in its
// order.
template <int NR, int NW, bool Q5>
__device__ __forceinline__ void dot_q45k_v2(const u8* const* rows, int cols, int lane, int step, const MatArgs& a, int r0, int nr, float* acc) {
    const int bb = Q5 ? 176 : 144, qoff = Q5 ? 48 : 16;
    const int units = cols / 32;
    for (int u0 = lane; u0 < units; u0 += 2 * step) {
        uint4 hdr[2][NW], qw[2][NW], hw4[2][NW];
        const bool second = u0 + step < units;
#pragma unroll
        for (int k = 0; k < 2; k++) {
            int u = k == 1 && second ? u0 + step : u0;
            int sb = u >> 3, j = (u >> 1) & 3, l0 = (u & 1) * 16;
#pragma unroll
            for (int w = 0; w < NW; w++) {
                const u8* blk = rows[w] + (size_t)sb * bb;
                hdr[k][w] = LDW((const uint4*)blk);
                qw[k][w] = LDW((const uint4*)(blk + qoff + 32 * j + l0));
                if (Q5) hw4[k][w] = LDW((const uint4*)(blk + 16 + l0));
            }
        }
#pragma unroll
        for (int k = 0; k < 2; k++) {
            if (k == 1 && !second) break;
            int u = u0 + k * step;
            int sb = u >> 3, j = (u >> 1) & 3, half = u & 1, l0 = half * 16;
            int lo[NW][4], hi[NW][4];
            float dl[NW], ml[NW], dh[NW], mh[NW];
#pragma unroll
            for (int w = 0; w < NW; w++) {
                uint4 h = hdr[k][w];
                float d = h2f((u16)(h.x & 0xffff)), dmin = h2f((u16)(h.x >> 16));
                float sc0, m0, sc1, m1;
                scale_min_k4_regs(2 * j, h, &sc0, &m0);
                scale_min_k4_regs(2 * j + 1, h, &sc1, &m1);
                u32 words[4] = {qw[k][w].x, qw[k][w].y, qw[k][w].z, qw[k][w].w};
                u32 hb[4] = {0, 0, 0, 0};
                if (Q5) { hb[0] = hw4[k][w].x; hb[1] = hw4[k][w].y; hb[2] = hw4[k][w].z; hb[3] = hw4[k][w].w; }
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    lo[w][e] = (int)((words[e] & 0x0F0F0F0Fu) | (Q5 ? ((hb[e] >> (2 * j)) & 0x01010101u) << 4 : 0u));
                    hi[w][e] = (int)(((words[e] >> 4) & 0x0F0F0F0Fu) | (Q5 ? ((hb[e] >> (2 * j + 1)) & 0x01010101u) << 4 : 0u));
                }
                dl[w] = d * sc0; ml[w] = dmin * m0; dh[w] = d * sc1; mh[w] = dmin * m1;
            }
            int blo = 8 * sb + 2 * j;
#pragma unroll
            for (int r = 0; r < NR; r++) {
                size_t row_a = (size_t)(r0 + min(r, nr - 1)) * a.ldx;
                int4 pl = *(const int4*)(a.xq + row_a + 32 * blo + l0);
                int4 ph = *(const int4*)(a.xq + row_a + 32 * (blo + 1) + l0);
                float4 sl = a.xs[row_a / 32 + blo], sh = a.xs[row_a / 32 + blo + 1];
                float xl = half ? sl.z : sl.y, xh = half ? sh.z : sh.y;
#pragma unroll
                for (int w = 0; w < NW; w++) {
                    int s0 = 0, s1 = 0;
                    s0 = __dp4a(lo[w][0], pl.x, s0); s0 = __dp4a(lo[w][1], pl.y, s0);
                    s0 = __dp4a(lo[w][2], pl.z, s0); s0 = __dp4a(lo[w][3], pl.w, s0);
                    s1 = __dp4a(hi[w][0], ph.x, s1); s1 = __dp4a(hi[w][1], ph.y, s1);
                    s1 = __dp4a(hi[w][2], ph.z, s1); s1 = __dp4a(hi[w][3], ph.w, s1);
                    float t = acc[w * NR + r];
                    t = fmaf(dl[w] * sl.x, (float)s0, t); t = fmaf(-ml[w], xl, t);
                    t = fmaf(dh[w] * sh.x, (float)s1, t); t = fmaf(-mh[w], xh, t);
                    acc[w * NR + r] = t;
                }
            }
        }
    }
}
#endif

// Q6_K: a unit is half h of a super-block and l0 (0 or 16): 16 values in each quarter k,
// values 128h + 32k + l0 + i (half l0/16 of activation block 8sb + 4h + k), scale
// sc[8h + l0/16 + 2k]; quants minus 32 as signed bytes.
template <int NR, int NW>
__device__ __forceinline__ void dot_q6k(const u8* const* rows, int cols, int lane, int step, const MatArgs& a, int r0, int nr, float* acc) {
    for (int u = lane; u < cols / 64; u += step) {
        int sb = u >> 2, h = (u >> 1) & 1, l0 = (u & 1) * 16;
        int q[NW][4][4];
        float ds[NW][4];
#pragma unroll
        for (int w = 0; w < NW; w++) {
            const u8* blk = rows[w] + (size_t)sb * 210;
            float d = h2f(ld16(blk + 208));
            const i8* sc = (const i8*)(blk + 192 + 8 * h + l0 / 16);
            u32 A[4], B[4], H[4];
            ld16B(blk + 64 * h + l0, A);
            ld16B(blk + 64 * h + 32 + l0, B);
            ld16B(blk + 128 + 32 * h + l0, H);
#pragma unroll
            for (int k = 0; k < 4; k++) {
                q[w][0][k] = __vsubss4((int)((A[k] & 0x0F0F0F0Fu) | ((H[k] & 0x03030303u) << 4)), 0x20202020);
                q[w][1][k] = __vsubss4((int)((B[k] & 0x0F0F0F0Fu) | (((H[k] >> 2) & 0x03030303u) << 4)), 0x20202020);
                q[w][2][k] = __vsubss4((int)(((A[k] >> 4) & 0x0F0F0F0Fu) | (((H[k] >> 4) & 0x03030303u) << 4)), 0x20202020);
                q[w][3][k] = __vsubss4((int)(((B[k] >> 4) & 0x0F0F0F0Fu) | (((H[k] >> 6) & 0x03030303u) << 4)), 0x20202020);
            }
#pragma unroll
            for (int k = 0; k < 4; k++) ds[w][k] = d * (float)sc[2 * k];
        }
        int blk_a = 8 * sb + 4 * h;
#pragma unroll
        for (int r = 0; r < NR; r++) {
            size_t row_a = (size_t)(r0 + min(r, nr - 1)) * a.ldx;
            int4 p[4];
            float da[4];
#pragma unroll
            for (int k = 0; k < 4; k++) {
                p[k] = *(const int4*)(a.xq + row_a + 32 * (blk_a + k) + l0);
                da[k] = a.xs[row_a / 32 + blk_a + k].x;
            }
#pragma unroll
            for (int w = 0; w < NW; w++) {
                float t = acc[w * NR + r];
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    int si = 0;
                    si = __dp4a(q[w][k][0], p[k].x, si); si = __dp4a(q[w][k][1], p[k].y, si);
                    si = __dp4a(q[w][k][2], p[k].z, si); si = __dp4a(q[w][k][3], p[k].w, si);
                    t = fmaf(ds[w][k] * da[k], (float)si, t);
                }
                acc[w * NR + r] = t;
            }
        }
    }
}

template <int NR, int NW>
__device__ __forceinline__ void row_dot(const u8* const* rows, int fmt, const MatArgs& a, int r0, int nr, int lane, int step, float* acc) {
    const float* x = a.x + (size_t)r0 * a.ldx;
    switch (fmt) {
    case FMT_F32: dot_f32<NR, NW>(rows, a.cols, lane, step, x, a.ldx, nr, acc); break;
    case FMT_F16: dot_f16<NR, NW, false>(rows, a.cols, lane, step, x, a.ldx, nr, acc); break;
    case FMT_BF16: dot_f16<NR, NW, true>(rows, a.cols, lane, step, x, a.ldx, nr, acc); break;
#ifdef KASOKU_MATVEC_V2
    case FMT_Q4_K: dot_q45k_v2<NR, NW, false>(rows, a.cols, lane, step, a, r0, nr, acc); break;
    case FMT_Q5_K: dot_q45k_v2<NR, NW, true>(rows, a.cols, lane, step, a, r0, nr, acc); break;
#else
    case FMT_Q4_K: dot_q45k<NR, NW, false>(rows, a.cols, lane, step, a, r0, nr, acc); break;
    case FMT_Q5_K: dot_q45k<NR, NW, true>(rows, a.cols, lane, step, a, r0, nr, acc); break;
#endif
    case FMT_Q6_K: dot_q6k<NR, NW>(rows, a.cols, lane, step, a, r0, nr, acc); break;
    default: dot_legacy<NR, NW>(rows, fmt, a.cols, lane, step, a, r0, nr, acc); break;
    }
}

// The ordered key of a value for a maximum by atomicMax on u64: larger values give larger
// keys, and on equal values the smaller index wins.
__device__ __forceinline__ u64 argmax_key(float v, int j) {
    u32 b = __float_as_uint(v);
    b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    return ((u64)b << 32) | (u64)(0xFFFFFFFFu - (u32)j);
}

// Weight rows j0 .. j0 + count − 1 (count ≤ NW) of segment s against activation rows
// r0..r0+nr, by `split` warps of the block (this one is `part` of them): each takes every
// split-th group of 32 units of the rows, and the first adds the warps' sums in order
// (p0 + p1 + ...). Every warp of the block calls this the same number of times (`valid` false:
// a warp past the last row only joins the block's synchronisations).
template <int NR, int NW>
__device__ __forceinline__ void row_tile(const MatSeg& s, const u8* w_j0, int j0, int count, bool valid, const MatArgs& a, int r0, int nr,
                                         int lane, int part, int split, float* partial, u64* block_best) {
    float acc[NW * NR];
#pragma unroll
    for (int i = 0; i < NW * NR; i++) acc[i] = 0.0f;
    if (valid) {
        // Slots past the matrix's last row compute row j0 again, and are dropped.
        const u8* rows[NW];
#pragma unroll
        for (int w = 0; w < NW; w++) rows[w] = w < count ? w_j0 + (size_t)w * s.row_bytes : w_j0;
        row_dot<NR, NW>(rows, s.fmt, a, r0, nr, lane + 32 * part, 32 * split, acc);
    }
#pragma unroll
    for (int i = 0; i < NW * NR; i++) acc[i] = warp_sum(acc[i]);
    if (split > 1) {
        int warp = threadIdx.x >> 5;
        if (lane == 0)
#pragma unroll
            for (int i = 0; i < NW * NR; i++) partial[warp * NW * NR + i] = acc[i];
        __syncthreads();
        if (part == 0)
#pragma unroll
            for (int i = 0; i < NW * NR; i++) {
                float t = partial[warp * NW * NR + i];
                for (int p = 1; p < split; p++) t += partial[(warp + p) * NW * NR + i];
                acc[i] = t;
            }
        __syncthreads();
    }
    if (valid && part == 0 && lane == 0) {
#pragma unroll
        for (int w = 0; w < NW; w++) {
            if (w >= count) break;
            int j = j0 + w;
            float b = s.bias ? s.bias[j] : 0.0f;
#pragma unroll
            for (int r = 0; r < NR; r++) {
                if (r < nr) {
                    float* out = s.y + (size_t)(r0 + r) * s.ldy + j;
                    float v = acc[w * NR + r] + b;
                    v = s.accumulate ? *out + v : v;
                    *out = v;
                    if (s.best) atomicMax(block_best + r0 + r, argmax_key(v, j));
                }
            }
        }
    }
}

// Every activation row in tiles of NR. With KASOKU_MATVEC_TAIL_TILES, a last tile of fewer rows
// runs as the smallest tile that holds them (1, 2 or 4 rows) instead of a tile of NR whose
// unused slots repeat its last row: a 9-row pass then costs an 8-row tile and a 1-row one, not
// two 8-row tiles. A row's arithmetic is the same in every tile.
template <int NR, int NW>
__device__ __forceinline__ void row_tiles(const MatSeg& s, const u8* w_j0, int j0, int count, bool valid, const MatArgs& a,
                                          int lane, int part, int split, float* partial, u64* block_best) {
#ifdef KASOKU_MATVEC_TAIL_TILES
    int r0 = 0;
    for (; r0 + NR <= a.n; r0 += NR)
        row_tile<NR, NW>(s, w_j0, j0, count, valid, a, r0, NR, lane, part, split, partial, block_best);
    int left = a.n - r0;
    if (left <= 0) return;
    if (NR > 1 && left == 1)
        row_tile<1, NW>(s, w_j0, j0, count, valid, a, r0, 1, lane, part, split, partial, block_best);
    else if (NR > 2 && left <= 2)
        row_tile<2, NW>(s, w_j0, j0, count, valid, a, r0, left, lane, part, split, partial, block_best);
    else if (NR > 4 && left <= 4)
        row_tile<4, NW>(s, w_j0, j0, count, valid, a, r0, left, lane, part, split, partial, block_best);
    else
        row_tile<NR, NW>(s, w_j0, j0, count, valid, a, r0, left, lane, part, split, partial, block_best);
#else
    for (int r0 = 0; r0 < a.n; r0 += NR)
        row_tile<NR, NW>(s, w_j0, j0, count, valid, a, r0, min(NR, a.n - r0), lane, part, split, partial, block_best);
#endif
}

// Grid: `split` warps per group of NW weight rows over the segments' rows, 4 warps a block. A split
// of 1 (short rows: one warp has enough loads in flight) or 2 or 4 (long rows, e.g. the down
// projection: one warp per pair would leave too few warps to keep DRAM busy) is chosen by the
// launcher from the matrices' format and width only. One kernel per tile height NR (each
// compiled with the registers its own tile needs: a decode step's NR = 1 kernel keeps a high
// occupancy); rows past NR loop over further tiles, and a last partial tile repeats its final
// row in the unused slots. A row's arithmetic is the same source code at every NR, in every
// slot of a group and at every batch size, so its bits do not depend on the kernel, the tile or
// the group it lands in.
// SwiGLU fused into the gate|up product (segment 0 the gate, 1 the up projection, the same
// rows, ldy = rows): each warp counts its NW rows in their group of 32 rows; the warp that
// completes a group (32 / NW gate warps and as many up warps) computes g = silu(g)·u for the group's 32
// values of every activation row, and their int8 blocks, with the swiglu kernel's arithmetic
// (the same bits), then resets the count for the next pass. Each warp publishes its rows
// (fence) before counting, so the completing warp reads every one of them, from L2.
__device__ __noinline__ void glu_group_done(float* gy, const float* uy, int ld, int n, u32* counts, i8* gq,
                                            float4* gs, int j0, int lane, int nw) {
    int grp = j0 >> 5;
    u32 prev = 0;
    __syncwarp();
    if (lane == 0) {
        __threadfence();
        prev = atomicAdd(counts + grp, 1u);
    }
    prev = __shfl_sync(0xffffffffu, prev, 0);
    if (prev != 64 / nw - 1) return;
    __threadfence();
    for (int r = 0; r < n; r++) {
        size_t c = (size_t)r * ld + 32 * grp + lane;
        float x = __ldcg(gy + c);
        float v = x / (1.0f + expf(-x)) * __ldcg(uy + c);
        gy[c] = v;
        size_t b = ((size_t)r * ld) / 32 + grp;
        if (gq) quant_block32(v, gq + 32 * b, gs + b);
    }
    if (lane == 0) counts[grp] = 0;
}

// RMSNorm fused into a residual product (segment 0 writes the residual stream, ldy = its
// rows): each block counts itself in once its rows are written; the last block normalizes
// every activation row of the result (rms_row, the rmsnorm kernel's bits) and resets the count.
#define NORM_MAX_DIM 8192
__device__ __noinline__ void norm_tail(u32* count, const float* y, int dim, int n, const float* w, float eps,
                                       float* ny, i8* nq, float4* ns) {
    __shared__ int last_block;
    __shared__ double part[NORM_MAX_DIM / 32];
    __shared__ float scale;
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        last_block = atomicAdd(count, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last_block) return;
    __threadfence();
    for (int r = 0; r < n; r++)
        rms_row(y + (size_t)r * dim, w, eps, dim, ny + (size_t)r * dim, nq ? nq + (size_t)r * dim : 0,
                nq ? ns + (size_t)r * (dim / 32) : 0, part, &scale);
    if (threadIdx.x == 0) *count = 0;
}

// The rows this warp takes in matvec_body's grid: segment *si (a.nseg past the last row) and
// its first row *j0, from the block, the warp and `split` warps per group of NW rows.
template <int NW>
__device__ __forceinline__ void warp_rows(const MatArgs& a, int warp, int split, int* si, int* j0) {
    int g = blockIdx.x * (4 / split) + warp / split;
    int i = 0;
    while (i < a.nseg && g >= (a.seg[i].rows + NW - 1) / NW) { g -= (a.seg[i].rows + NW - 1) / NW; i++; }
    *si = i;
    *j0 = NW * g;
}

// With KASOKU_OWN_PREFETCH (the default; KASOKU_CUDA_OWN_PREFETCH=0 leaves it out), each warp asks L2 for its own NW weight rows before waiting
// for its predecessor: with early launch, the rows stream in from DRAM while the kernels
// before this one finish, and the loads after the wait find them in L2.
template <int NW>
__device__ __forceinline__ void prefetch_own_rows(const MatArgs& a) {
#ifdef KASOKU_OWN_PREFETCH
    const int split = a.split;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int part = warp % split;
    int si, j0;
    warp_rows<NW>(a, warp, split, &si, &j0);
    if (si >= a.nseg) return;
    const MatSeg& s = a.seg[si];
    long long len = (long long)min(NW, s.rows - j0) * s.row_bytes;
    const u8* p = s.w + (size_t)j0 * s.row_bytes;
    for (long long o = (long long)(lane + 32 * part) * 128; o < len; o += 32LL * split * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(p + o));
#endif
}

template <int NR, int NW>
__device__ __forceinline__ void matvec_body(const MatArgs& a) {
    // A fused argmax (the head: one segment) first takes the maximum over the block in shared
    // memory, then one atomic per block and row reaches the global key: one global atomic per
    // weight row on a single address would serialize a 150k-row head.
    __shared__ u64 block_best[MATVEC_MAX_ROWS];
    __shared__ float partial[4 * NW * NR];
    const bool best = a.nseg == 1 && a.seg[0].best;
    if (best) {
        for (int r = threadIdx.x; r < a.n; r += blockDim.x) block_best[r] = 0;
        __syncthreads();
    }
    const int split = a.split;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int part = warp % split;
    int si, j0;
    warp_rows<NW>(a, warp, split, &si, &j0);
    bool valid = si < a.nseg;
    const MatSeg& s = a.seg[valid ? si : 0];
    int count = valid ? min(NW, s.rows - j0) : 0;
    row_tiles<NR, NW>(s, s.w + (size_t)j0 * s.row_bytes, j0, count, valid, a, lane, part, split, partial, block_best);
    if (a.glu_count && valid && part == 0)
        glu_group_done(a.seg[0].y, a.seg[1].y, a.seg[0].ldy, a.n, a.glu_count, a.glu_q, a.glu_s, j0, lane, NW);
    if (a.norm_count)
        norm_tail(a.norm_count, a.seg[0].y, a.seg[0].rows, a.n, a.norm_w, a.norm_eps, a.norm_y, a.norm_q, a.norm_s);
    if (best) {
        __syncthreads();
        for (int r = threadIdx.x; r < a.n; r += blockDim.x)
            if (block_best[r]) atomicMax(a.seg[0].best + r, block_best[r]);
    }
}

#ifdef KASOKU_MATVEC_STREAM
// Weights streamed through shared memory (compute capability 9.0: bulk asynchronous copies).
// A block's tile is the rows its warps take in matvec_body (4 / split pairs of one segment);
// a persistent grid walks the tiles (block b takes tiles b, b + grid, ...), and each block
// keeps `stream_stages` tiles in flight: one thread asks the copy engine for a tile's bytes
// (one contiguous range of the matrix, widened to 16-byte bounds; the buffers carry slack
// past their end) with an mbarrier counting them in, the warps compute from shared memory
// when it completes, and the stage is refilled with the tile `stages` further on. The first
// tiles are asked for before the wait for the predecessor (weights are never written), so
// with early launch they stream in while the kernels before this one finish. A row's
// arithmetic is row_tile's, reading the same bytes from another place: the same bits.
#define STREAM_MAX_STAGES 8

__device__ __forceinline__ u32 smem_u32(const void* p) { return (u32)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void stream_fetch(u64* bar, u8* dst, const u8* src, u32 bytes) {
#if __CUDA_ARCH__ >= 900
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"(smem_u32(dst)), "l"(src), "r"(bytes), "r"(smem_u32(bar)) : "memory");
#else
    __trap();
#endif
}

__device__ __forceinline__ void stream_wait(u64* bar, u32 parity) {
#if __CUDA_ARCH__ >= 900
    u32 done = 0;
    while (!done)
        asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done) : "r"(smem_u32(bar)), "r"(parity) : "memory");
#else
    __trap();
#endif
}

// Where tile t lies: its segment, its first pair, and the byte range it copies.
struct StreamTile {
    int seg, pair0;
    const u8* src;    // 16-byte aligned start of the copy
    u32 bytes;        // a multiple of 16
    int lead;         // bytes from src to the tile's first row
};

__device__ __forceinline__ StreamTile stream_tile(const MatArgs& a, int t, int ppt) {
    StreamTile x = {-1, 0, 0, 0, 0};
    for (int si = 0; si < a.nseg; si++) {
        int pairs = (a.seg[si].rows + 1) / 2, tiles = (pairs + ppt - 1) / ppt;
        if (t < tiles) {
            const MatSeg& s = a.seg[si];
            int j = 2 * t * ppt, rows = min(s.rows - j, 2 * ppt);
            const u8* first = s.w + (size_t)j * s.row_bytes;
            const u8* end = first + (size_t)rows * s.row_bytes;
            x.seg = si;
            x.pair0 = t * ppt;
            x.src = (const u8*)((size_t)first & ~(size_t)15);
            x.lead = (int)(first - x.src);
            x.bytes = (u32)((((size_t)end + 15) & ~(size_t)15) - (size_t)x.src);
            return x;
        }
        t -= tiles;
    }
    return x;
}

template <int NR>
__device__ __forceinline__ void matvec_stream(const MatArgs& a) {
#if __CUDA_ARCH__ < 900
    __trap();
#else
    extern __shared__ __align__(16) u8 stream_buf[];
    __shared__ __align__(8) u64 full[STREAM_MAX_STAGES];
    __shared__ u64 block_best[MATVEC_MAX_ROWS];
    __shared__ float partial[4 * 2 * NR];
    const int split = a.split, ppt = 4 / split, stages = a.stream_stages, stage_bytes = a.stream_stage_bytes;
    int total = 0;
    for (int si = 0; si < a.nseg; si++) total += ((a.seg[si].rows + 1) / 2 + ppt - 1) / ppt;
    if (threadIdx.x == 0) {
        for (int i = 0; i < stages; i++)
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(full + i)) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        for (int i = 0; i < stages; i++) {
            int t = blockIdx.x + i * gridDim.x;
            if (t >= total) break;
            StreamTile x = stream_tile(a, t, ppt);
            stream_fetch(full + i, stream_buf + i * stage_bytes, x.src, x.bytes);
        }
    }
    wait_for_predecessor();
    const bool best = a.nseg == 1 && a.seg[0].best;
    if (best)
        for (int r = threadIdx.x; r < a.n; r += blockDim.x) block_best[r] = 0;
    __syncthreads();
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int part = warp % split;
    int k = 0;
    for (int t = blockIdx.x; t < total; t += gridDim.x, k++) {
        int stage = k % stages;
        stream_wait(full + stage, (u32)((k / stages) & 1));
        StreamTile x = stream_tile(a, t, ppt);
        const MatSeg& s = a.seg[x.seg];
        int g = x.pair0 + warp / split;
        bool valid = g < (s.rows + 1) / 2;
        int j0 = 2 * g;
        int count = valid ? min(2, s.rows - j0) : 0;
        const u8* w_j0 = stream_buf + stage * stage_bytes + x.lead + (size_t)(j0 - 2 * x.pair0) * s.row_bytes;
        if (!valid) w_j0 = stream_buf + stage * stage_bytes + x.lead;
        row_tiles<NR, 2>(s, w_j0, j0, count, valid, a, lane, part, split, partial, block_best);
        if (a.glu_count && valid && part == 0)
            glu_group_done(a.seg[0].y, a.seg[1].y, a.seg[0].ldy, a.n, a.glu_count, a.glu_q, a.glu_s, j0, lane, 2);
        __syncthreads();  // every warp is done with this stage's bytes
        int next = t + stages * gridDim.x;
        if (threadIdx.x == 0 && next < total) {
            StreamTile y = stream_tile(a, next, ppt);
            stream_fetch(full + stage, stream_buf + stage * stage_bytes, y.src, y.bytes);
        }
    }
    if (a.norm_count)
        norm_tail(a.norm_count, a.seg[0].y, a.seg[0].rows, a.n, a.norm_w, a.norm_eps, a.norm_y, a.norm_q, a.norm_s);
    if (best) {
        __syncthreads();
        for (int r = threadIdx.x; r < a.n; r += blockDim.x)
            if (block_best[r]) atomicMax(a.seg[0].best + r, block_best[r]);
    }
#endif
}
#endif

// A product kernel's entry: streamed (when the launcher asked for it; pairs of rows only) or
// matvec_body.
template <int NR, int NW>
__device__ __forceinline__ void matvec_entry(const MatArgs& a) {
#ifdef KASOKU_MATVEC_STREAM
    if (NW == 2 && a.stream_stages > 0) {
        matvec_stream<NR>(a);
        return;
    }
#endif
    for (int i = 0; i < 3; i++) if (a.pre[i]) prefetch_l2(a.pre[i], a.pre_len[i]);
    prefetch_own_rows<NW>(a);
    wait_for_predecessor();
    matvec_body<NR, NW>(a);
}

// The 8-row kernel (5 or more activation rows: verification of trees) takes four weight rows a
// warp, so each activation load serves four (on an H200, 1.5B Q4_K_M shape: a 16-row pass
// 4.55 -> 4.33x a 1-row pass, 64 rows 15.8 -> 15.0x); the others take pairs (four made the
// 4-row kernel slower: 1.50 -> 1.63x). `kernels::matvec_rows_per_warp` says the same.
// KASOKU_MATVEC_MIN_BLOCKS (KASOKU_CUDA_MATVEC_BLOCKS=N, for measuring) asks ptxas to fit N
// blocks a multiprocessor in the 2- and 4-row kernels: left alone they take 123 and 128
// registers (4 blocks, 16 warps: the multi-row products are latency-bound with too few
// warps), at N = 5 96 registers with a few bytes of spills.
#ifdef KASOKU_MATVEC_MIN_BLOCKS
#define MATVEC_TILE_BOUNDS __launch_bounds__(128, KASOKU_MATVEC_MIN_BLOCKS)
#else
#define MATVEC_TILE_BOUNDS __launch_bounds__(128)
#endif
extern "C" __global__ void __launch_bounds__(128, 7) matvec_1(MatArgs a) { matvec_entry<1, 2>(a); }
extern "C" __global__ void MATVEC_TILE_BOUNDS matvec_2(MatArgs a) { matvec_entry<2, 2>(a); }
extern "C" __global__ void MATVEC_TILE_BOUNDS matvec_4(MatArgs a) { matvec_entry<4, 2>(a); }
extern "C" __global__ void __launch_bounds__(128) matvec_8(MatArgs a) { matvec_entry<8, 4>(a); }
