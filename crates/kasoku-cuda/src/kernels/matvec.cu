// Matrix products y = x · Wᵀ for 1..N activation rows, straight on the GGUF block layouts.
//
// One warp computes one weight row against every activation row: the row's bytes come from
// device memory once and serve all of them (tiles of up to 8 activation rows share each load;
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
};

// Quantizes 32 values to int8 with d = max|v| / 127 (q = round-half-even(v / d)); writes the
// quants and (d, d·Σq[0..16), d·Σq[16..32), 0). The one definition every producer uses.
__device__ __forceinline__ void quant_block32(const float* v, i8* q, float4* s) {
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(v[i]));
    float d = amax / 127.0f;
    int s0 = 0, s1 = 0;
    u32 words[8];
#pragma unroll
    for (int k = 0; k < 8; k++) {
        u32 w = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int qi = d == 0.0f ? 0 : (int)rintf(v[4 * k + i] / d);
            if (k < 4) s0 += qi; else s1 += qi;
            w |= ((u32)(qi & 0xff)) << (8 * i);
        }
        words[k] = w;
    }
    uint4* dst = (uint4*)q;
    dst[0] = make_uint4(words[0], words[1], words[2], words[3]);
    dst[1] = make_uint4(words[4], words[5], words[6], words[7]);
    *s = make_float4(d, d * (float)s0, d * (float)s1, 0.0f);
}

// Quantizes rows of f32 activations (len values, a multiple of 32) for the block formats.
extern "C" __global__ void quantize_acts(const float* x, long long blocks, i8* xq, float4* xs) {
    long long b = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= blocks) return;
    float v[32];
    const float4* src = (const float4*)(x + 32 * b);
#pragma unroll
    for (int i = 0; i < 8; i++) {
        float4 t = src[i];
        v[4 * i] = t.x; v[4 * i + 1] = t.y; v[4 * i + 2] = t.z; v[4 * i + 3] = t.w;
    }
    quant_block32(v, xq + 32 * b, xs + b);
}

__device__ __forceinline__ u32 ld32u(const u8* p) { return (u32)ld16(p) | ((u32)ld16(p + 2) << 16); }

template <int NR>
__device__ __forceinline__ void dot_f32(const u8* row, int cols, int lane, const float* x, int ldx, int nr, float* acc) {
    const float* w = (const float*)row;
    for (int u = lane; u < cols / 8; u += 32) {
        float4 a = __ldg((const float4*)(w + 8 * u));
        float4 b = __ldg((const float4*)(w + 8 * u + 4));
        float wv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
        for (int r = 0; r < NR; r++) {
            const float4* xv = (const float4*)(x + (size_t)min(r, nr - 1) * ldx + 8 * u);
            float4 p = xv[0], q = xv[1];
            float xs[8] = {p.x, p.y, p.z, p.w, q.x, q.y, q.z, q.w};
#pragma unroll
            for (int i = 0; i < 8; i++) acc[r] = fmaf(wv[i], xs[i], acc[r]);
        }
    }
}

template <int NR, bool BF>
__device__ __forceinline__ void dot_f16(const u8* row, int cols, int lane, const float* x, int ldx, int nr, float* acc) {
    for (int u = lane; u < cols / 8; u += 32) {
        uint4 raw = __ldg((const uint4*)(row + 16 * u));
        u32 words[4] = {raw.x, raw.y, raw.z, raw.w};
        float wv[8];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            u16 lo = (u16)(words[i] & 0xffff), hi = (u16)(words[i] >> 16);
            wv[2 * i] = BF ? bf2f(lo) : h2f(lo);
            wv[2 * i + 1] = BF ? bf2f(hi) : h2f(hi);
        }
#pragma unroll
        for (int r = 0; r < NR; r++) {
            const float4* xv = (const float4*)(x + (size_t)min(r, nr - 1) * ldx + 8 * u);
            float4 p = xv[0], q = xv[1];
            float xs[8] = {p.x, p.y, p.z, p.w, q.x, q.y, q.z, q.w};
#pragma unroll
            for (int i = 0; i < 8; i++) acc[r] = fmaf(wv[i], xs[i], acc[r]);
        }
    }
}

// Legacy blocks of 32 values, one block per unit. Q4_0/Q5_0/Q8_0 are d·q (q with its offset
// 8 / 16 / 0), Q4_1/Q5_1 are d·q + m.
template <int NR>
__device__ __forceinline__ void dot_legacy(const u8* row, int fmt, int cols, int lane, const MatArgs& a, int r0, int nr, float* acc) {
    int bb = fmt == FMT_Q4_0 ? 18 : fmt == FMT_Q4_1 ? 20 : fmt == FMT_Q5_0 ? 22 : fmt == FMT_Q5_1 ? 24 : 34;
    for (int b = lane; b < cols / 32; b += 32) {
        const u8* blk = row + (size_t)b * bb;
        float d = h2f(ld16(blk)), m = 0.0f, off = 0.0f;
        int w[8];
        if (fmt == FMT_Q8_0) {
#pragma unroll
            for (int k = 0; k < 8; k++) w[k] = (int)ld32u(blk + 2 + 4 * k);
        } else {
            const u8* qs; u32 qh = 0;
            if (fmt == FMT_Q4_0) { qs = blk + 2; off = 8.0f; }
            else if (fmt == FMT_Q4_1) { m = h2f(ld16(blk + 2)); qs = blk + 4; }
            else if (fmt == FMT_Q5_0) { qh = ld32u(blk + 2); qs = blk + 6; off = 16.0f; }
            else { m = h2f(ld16(blk + 2)); qh = ld32u(blk + 4); qs = blk + 8; }
#pragma unroll
            for (int k = 0; k < 4; k++) {
                u32 v = ld32u(qs + 4 * k);
                u32 lo = v & 0x0F0F0F0Fu, hi = (v >> 4) & 0x0F0F0F0Fu;
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    lo |= ((qh >> (4 * k + i)) & 1u) << (8 * i + 4);
                    hi |= ((qh >> (16 + 4 * k + i)) & 1u) << (8 * i + 4);
                }
                w[k] = (int)lo;
                w[k + 4] = (int)hi;
            }
        }
#pragma unroll
        for (int r = 0; r < NR; r++) {
            size_t row_a = (size_t)(r0 + min(r, nr - 1)) * a.ldx;
            const int4* xv = (const int4*)(a.xq + row_a + 32 * b);
            float4 xs = a.xs[row_a / 32 + b];
            int4 p = xv[0], q = xv[1];
            int sumi = 0;
            sumi = __dp4a(w[0], p.x, sumi); sumi = __dp4a(w[1], p.y, sumi);
            sumi = __dp4a(w[2], p.z, sumi); sumi = __dp4a(w[3], p.w, sumi);
            sumi = __dp4a(w[4], q.x, sumi); sumi = __dp4a(w[5], q.y, sumi);
            sumi = __dp4a(w[6], q.z, sumi); sumi = __dp4a(w[7], q.w, sumi);
            float sx = xs.y + xs.z;
            // d·(d_a·Σ q·a − off·Σa) (+ m·Σa)
            float t = fmaf(xs.x, (float)sumi, -off * sx);
            acc[r] = fmaf(d, t, acc[r]);
            acc[r] = fmaf(m, sx, acc[r]);
        }
    }
}

// Q4_K and Q5_K: a unit is 16 bytes of quants of one 64-value group j of a super-block:
// 16 low nibbles (values 64j + l0 + i, sub-block 2j) and 16 high ones (64j + 32 + l0 + i,
// sub-block 2j + 1), l0 = 0 or 16: half l0/16 of activation blocks 8sb + 2j and 8sb + 2j + 1.
template <int NR, bool Q5>
__device__ __forceinline__ void dot_q45k(const u8* row, int cols, int lane, const MatArgs& a, int r0, int nr, float* acc) {
    const int bb = Q5 ? 176 : 144, qoff = Q5 ? 48 : 16;
    for (int u = lane; u < cols / 32; u += 32) {
        int sb = u >> 3, j = (u >> 1) & 3, half = u & 1, l0 = half * 16;
        const u8* blk = row + (size_t)sb * bb;
        float d = h2f(ld16(blk)), dmin = h2f(ld16(blk + 2));
        float sc0, m0, sc1, m1;
        scale_min_k4(2 * j, blk + 4, &sc0, &m0);
        scale_min_k4(2 * j + 1, blk + 4, &sc1, &m1);
        uint4 raw = __ldg((const uint4*)(blk + qoff + 32 * j + l0));
        u32 words[4] = {raw.x, raw.y, raw.z, raw.w};
        u32 hw[4] = {0, 0, 0, 0};
        if (Q5) {
            uint4 h = __ldg((const uint4*)(blk + 16 + l0));
            hw[0] = h.x; hw[1] = h.y; hw[2] = h.z; hw[3] = h.w;
        }
        int lo[4], hi[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            lo[k] = (int)((words[k] & 0x0F0F0F0Fu) | (Q5 ? ((hw[k] >> (2 * j)) & 0x01010101u) << 4 : 0u));
            hi[k] = (int)(((words[k] >> 4) & 0x0F0F0F0Fu) | (Q5 ? ((hw[k] >> (2 * j + 1)) & 0x01010101u) << 4 : 0u));
        }
        float dl = d * sc0, ml = dmin * m0, dh = d * sc1, mh = dmin * m1;
        int blo = 8 * sb + 2 * j;
#pragma unroll
        for (int r = 0; r < NR; r++) {
            size_t row_a = (size_t)(r0 + min(r, nr - 1)) * a.ldx;
            int4 pl = *(const int4*)(a.xq + row_a + 32 * blo + l0);
            int4 ph = *(const int4*)(a.xq + row_a + 32 * (blo + 1) + l0);
            float4 sl = a.xs[row_a / 32 + blo], sh = a.xs[row_a / 32 + blo + 1];
            int s0 = 0, s1 = 0;
            s0 = __dp4a(lo[0], pl.x, s0); s0 = __dp4a(lo[1], pl.y, s0);
            s0 = __dp4a(lo[2], pl.z, s0); s0 = __dp4a(lo[3], pl.w, s0);
            s1 = __dp4a(hi[0], ph.x, s1); s1 = __dp4a(hi[1], ph.y, s1);
            s1 = __dp4a(hi[2], ph.z, s1); s1 = __dp4a(hi[3], ph.w, s1);
            float xl = half ? sl.z : sl.y, xh = half ? sh.z : sh.y;
            float t = acc[r];
            t = fmaf(dl * sl.x, (float)s0, t); t = fmaf(-ml, xl, t);
            t = fmaf(dh * sh.x, (float)s1, t); t = fmaf(-mh, xh, t);
            acc[r] = t;
        }
    }
}

// Q6_K: a unit is half h of a super-block and l0 (0 or 16): 16 values in each quarter k,
// values 128h + 32k + l0 + i (half l0/16 of activation block 8sb + 4h + k), scale
// sc[8h + l0/16 + 2k]; quants minus 32 as signed bytes.
template <int NR>
__device__ __forceinline__ void dot_q6k(const u8* row, int cols, int lane, const MatArgs& a, int r0, int nr, float* acc) {
    for (int u = lane; u < cols / 64; u += 32) {
        int sb = u >> 2, h = (u >> 1) & 1, l0 = (u & 1) * 16;
        const u8* blk = row + (size_t)sb * 210;
        float d = h2f(ld16(blk + 208));
        const u8* ql = blk + 64 * h + l0;
        const u8* qh = blk + 128 + 32 * h + l0;
        const i8* sc = (const i8*)(blk + 192 + 8 * h + l0 / 16);
        int q[4][4];
#pragma unroll
        for (int k = 0; k < 4; k++) {
            u32 A = ld32u(ql + 4 * k), B = ld32u(ql + 32 + 4 * k), H = ld32u(qh + 4 * k);
            q[0][k] = __vsubss4((int)((A & 0x0F0F0F0Fu) | ((H & 0x03030303u) << 4)), 0x20202020);
            q[1][k] = __vsubss4((int)((B & 0x0F0F0F0Fu) | (((H >> 2) & 0x03030303u) << 4)), 0x20202020);
            q[2][k] = __vsubss4((int)(((A >> 4) & 0x0F0F0F0Fu) | (((H >> 4) & 0x03030303u) << 4)), 0x20202020);
            q[3][k] = __vsubss4((int)(((B >> 4) & 0x0F0F0F0Fu) | (((H >> 6) & 0x03030303u) << 4)), 0x20202020);
        }
        float ds[4];
#pragma unroll
        for (int k = 0; k < 4; k++) ds[k] = d * (float)sc[2 * k];
        int blk_a = 8 * sb + 4 * h;
#pragma unroll
        for (int r = 0; r < NR; r++) {
            size_t row_a = (size_t)(r0 + min(r, nr - 1)) * a.ldx;
            float t = acc[r];
#pragma unroll
            for (int k = 0; k < 4; k++) {
                int4 p = *(const int4*)(a.xq + row_a + 32 * (blk_a + k) + l0);
                float da = a.xs[row_a / 32 + blk_a + k].x;
                int si = 0;
                si = __dp4a(q[k][0], p.x, si); si = __dp4a(q[k][1], p.y, si);
                si = __dp4a(q[k][2], p.z, si); si = __dp4a(q[k][3], p.w, si);
                t = fmaf(ds[k] * da, (float)si, t);
            }
            acc[r] = t;
        }
    }
}

template <int NR>
__device__ __forceinline__ void row_dot(const u8* row, int fmt, const MatArgs& a, int r0, int nr, int lane, float* acc) {
    const float* x = a.x + (size_t)r0 * a.ldx;
    switch (fmt) {
    case FMT_F32: dot_f32<NR>(row, a.cols, lane, x, a.ldx, nr, acc); break;
    case FMT_F16: dot_f16<NR, false>(row, a.cols, lane, x, a.ldx, nr, acc); break;
    case FMT_BF16: dot_f16<NR, true>(row, a.cols, lane, x, a.ldx, nr, acc); break;
    case FMT_Q4_K: dot_q45k<NR, false>(row, a.cols, lane, a, r0, nr, acc); break;
    case FMT_Q5_K: dot_q45k<NR, true>(row, a.cols, lane, a, r0, nr, acc); break;
    case FMT_Q6_K: dot_q6k<NR>(row, a.cols, lane, a, r0, nr, acc); break;
    default: dot_legacy<NR>(row, fmt, a.cols, lane, a, r0, nr, acc); break;
    }
}

// The ordered key of a value for a maximum by atomicMax on u64: larger values give larger
// keys, and on equal values the smaller index wins.
__device__ __forceinline__ u64 argmax_key(float v, int j) {
    u32 b = __float_as_uint(v);
    b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    return ((u64)b << 32) | (u64)(0xFFFFFFFFu - (u32)j);
}

template <int NR>
__device__ __forceinline__ void row_tile(const MatSeg& s, int j, const MatArgs& a, int r0, int nr, int lane) {
    float acc[NR];
#pragma unroll
    for (int r = 0; r < NR; r++) acc[r] = 0.0f;
    row_dot<NR>(s.w + (size_t)j * s.row_bytes, s.fmt, a, r0, nr, lane, acc);
#pragma unroll
    for (int r = 0; r < NR; r++) acc[r] = warp_sum(acc[r]);
    if (lane == 0) {
        float b = s.bias ? s.bias[j] : 0.0f;
#pragma unroll
        for (int r = 0; r < NR; r++) {
            if (r < nr) {
                float* out = s.y + (size_t)(r0 + r) * s.ldy + j;
                float v = acc[r] + b;
                v = s.accumulate ? *out + v : v;
                *out = v;
                if (s.best) atomicMax(s.best + r0 + r, argmax_key(v, j));
            }
        }
    }
}
// Grid: one warp per weight row over the segments' rows, 4 warps a block. One kernel per tile
// height NR (each compiled with the registers its own tile needs: a decode step's NR = 1
// kernel keeps a high occupancy); rows past NR loop over further tiles, and a last partial
// tile repeats its final row in the unused slots. A row's arithmetic is the same source code
// at every NR, so its bits do not depend on the kernel or the tile it lands in.
template <int NR>
__device__ __forceinline__ void matvec_body(const MatArgs& a) {
    int lane = threadIdx.x & 31;
    int g = blockIdx.x * 4 + (threadIdx.x >> 5);
    int si = 0;
    while (si < a.nseg && g >= a.seg[si].rows) { g -= a.seg[si].rows; si++; }
    if (si >= a.nseg) return;
    const MatSeg& s = a.seg[si];
    for (int r0 = 0; r0 < a.n; r0 += NR) row_tile<NR>(s, g, a, r0, min(NR, a.n - r0), lane);
}

extern "C" __global__ void __launch_bounds__(128) matvec_1(MatArgs a) { matvec_body<1>(a); }
extern "C" __global__ void __launch_bounds__(128) matvec_2(MatArgs a) { matvec_body<2>(a); }
extern "C" __global__ void __launch_bounds__(128) matvec_4(MatArgs a) { matvec_body<4>(a); }
extern "C" __global__ void __launch_bounds__(128) matvec_8(MatArgs a) { matvec_body<8>(a); }
