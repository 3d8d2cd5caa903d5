// Matrix products y = x · Wᵀ for 1..N activation rows, straight on the GGUF block layouts.
//
// One warp computes one weight row against every activation row: the row's bytes come from
// device memory once and serve all of them (tiles of up to MAXR activation rows share each
// load; a second tile re-reads the row from L1/L2, not from DRAM). A lane takes fixed units of
// the row (16 to 64 values) in a fixed order and keeps one partial sum per activation row;
// the warp then adds its lanes' sums in a fixed butterfly. So a row's result does not depend
// on how many rows came with it. Weights are dequantized to f32, activations stay f32.

#define MAXR 8

struct MatSeg {
    const u8* w;        // rows × row_bytes, GGUF layout
    float* y;           // output: y[r * ldy + j]
    const float* bias;  // or null
    long long row_bytes;
    int fmt;
    int rows;
    int ldy;
    int accumulate;     // 1: y += result (residual epilogue)
};

struct MatArgs {
    MatSeg seg[3];
    const float* x;  // x[r * ldx + c]
    int nseg;
    int cols;
    int n;
    int ldx;
};

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

// Legacy blocks of 32 values. Q4_0/Q5_0/Q8_0 are d·q; Q4_1/Q5_1 are d·q + m.
template <int NR>
__device__ __forceinline__ void dot_legacy(const u8* row, int fmt, int cols, int lane, const float* x, int ldx, int nr, float* acc) {
    int bb = fmt == FMT_Q4_0 ? 18 : fmt == FMT_Q4_1 ? 20 : fmt == FMT_Q5_0 ? 22 : fmt == FMT_Q5_1 ? 24 : 34;
    for (int b = lane; b < cols / 32; b += 32) {
        const u8* blk = row + (size_t)b * bb;
        float d = h2f(ld16(blk)), m = 0.0f;
        float q[32];
        if (fmt == FMT_Q8_0) {
#pragma unroll
            for (int i = 0; i < 16; i++) {
                u16 v = ld16(blk + 2 + 2 * i);
                q[2 * i] = (float)(i8)(v & 0xff);
                q[2 * i + 1] = (float)(i8)(v >> 8);
            }
        } else {
            const u8* qs; u32 qh = 0; int off;
            if (fmt == FMT_Q4_0) { qs = blk + 2; off = 8; }
            else if (fmt == FMT_Q4_1) { m = h2f(ld16(blk + 2)); qs = blk + 4; off = 0; }
            else if (fmt == FMT_Q5_0) { qh = (u32)ld16(blk + 2) | ((u32)ld16(blk + 4) << 16); qs = blk + 6; off = 16; }
            else { m = h2f(ld16(blk + 2)); qh = (u32)ld16(blk + 4) | ((u32)ld16(blk + 6) << 16); qs = blk + 8; off = 0; }
#pragma unroll
            for (int i = 0; i < 8; i++) {
                u16 v = ld16(qs + 2 * i);
                int b0 = v & 0xff, b1 = v >> 8;
                int j = 2 * i;
                q[j] = (float)(((b0 & 15) | (((qh >> j) & 1) << 4)) - off);
                q[j + 1] = (float)(((b1 & 15) | (((qh >> (j + 1)) & 1) << 4)) - off);
                q[j + 16] = (float)(((b0 >> 4) | (((qh >> (j + 16)) & 1) << 4)) - off);
                q[j + 17] = (float)(((b1 >> 4) | (((qh >> (j + 17)) & 1) << 4)) - off);
            }
        }
#pragma unroll
        for (int r = 0; r < NR; r++) {
            const float4* xv = (const float4*)(x + (size_t)min(r, nr - 1) * ldx + 32 * b);
            float s = 0.0f, sx = 0.0f;
#pragma unroll
            for (int i = 0; i < 8; i++) {
                float4 t = xv[i];
                s = fmaf(q[4 * i], t.x, s);
                s = fmaf(q[4 * i + 1], t.y, s);
                s = fmaf(q[4 * i + 2], t.z, s);
                s = fmaf(q[4 * i + 3], t.w, s);
                sx = sx + t.x + t.y + t.z + t.w;
            }
            acc[r] = fmaf(d, s, acc[r]);
            if (fmt == FMT_Q4_1 || fmt == FMT_Q5_1) acc[r] = fmaf(m, sx, acc[r]);
        }
    }
}

// Q4_K and Q5_K: a unit is 16 bytes of quants of one 64-value group j of a super-block:
// 16 low nibbles (values 64j + l0 + i, sub-block 2j) and 16 high ones (64j + 32 + l0 + i,
// sub-block 2j + 1), l0 = 0 or 16. 8 units per super-block.
template <int NR, bool Q5>
__device__ __forceinline__ void dot_q45k(const u8* row, int cols, int lane, const float* x, int ldx, int nr, float* acc) {
    const int bb = Q5 ? 176 : 144, qoff = Q5 ? 48 : 16;
    for (int u = lane; u < cols / 32; u += 32) {
        int sb = u >> 3, j = (u >> 1) & 3, l0 = (u & 1) * 16;
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
        float lo[16], hi[16];
#pragma unroll
        for (int i = 0; i < 16; i++) {
            int byte = (words[i / 4] >> (8 * (i % 4))) & 0xff;
            int hb = (hw[i / 4] >> (8 * (i % 4))) & 0xff;
            lo[i] = (float)((byte & 15) + (Q5 ? (((hb >> (2 * j)) & 1) << 4) : 0));
            hi[i] = (float)((byte >> 4) + (Q5 ? (((hb >> (2 * j + 1)) & 1) << 4) : 0));
        }
        float dl = d * sc0, ml = dmin * m0, dh = d * sc1, mh = dmin * m1;
        int base = 256 * sb + 64 * j + l0;
#pragma unroll
        for (int r = 0; r < NR; r++) {
            const float4* xl = (const float4*)(x + (size_t)min(r, nr - 1) * ldx + base);
            const float4* xh = xl + 8;
            float s0 = 0.0f, x0 = 0.0f, s1 = 0.0f, x1 = 0.0f;
#pragma unroll
            for (int i = 0; i < 4; i++) {
                float4 a = xl[i], b = xh[i];
                s0 = fmaf(lo[4 * i], a.x, s0); s0 = fmaf(lo[4 * i + 1], a.y, s0);
                s0 = fmaf(lo[4 * i + 2], a.z, s0); s0 = fmaf(lo[4 * i + 3], a.w, s0);
                x0 = x0 + a.x + a.y + a.z + a.w;
                s1 = fmaf(hi[4 * i], b.x, s1); s1 = fmaf(hi[4 * i + 1], b.y, s1);
                s1 = fmaf(hi[4 * i + 2], b.z, s1); s1 = fmaf(hi[4 * i + 3], b.w, s1);
                x1 = x1 + b.x + b.y + b.z + b.w;
            }
            float a = acc[r];
            a = fmaf(dl, s0, a); a = fmaf(-ml, x0, a);
            a = fmaf(dh, s1, a); a = fmaf(-mh, x1, a);
            acc[r] = a;
        }
    }
}

// Q6_K: a unit is half h of a super-block and l0 (0 or 16): 16 values in each quarter,
// values 128h + 32·quarter + l0 + i.
template <int NR>
__device__ __forceinline__ void dot_q6k(const u8* row, int cols, int lane, const float* x, int ldx, int nr, float* acc) {
    for (int u = lane; u < cols / 64; u += 32) {
        int sb = u >> 2, h = (u >> 1) & 1, l0 = (u & 1) * 16;
        const u8* blk = row + (size_t)sb * 210;
        float d = h2f(ld16(blk + 208));
        const u8* ql = blk + 64 * h + l0;
        const u8* qh = blk + 128 + 32 * h + l0;
        const i8* sc = (const i8*)(blk + 192 + 8 * h + l0 / 16);
        float q[4][16];
#pragma unroll
        for (int i = 0; i < 8; i++) {
            u16 a = ld16(ql + 2 * i), b = ld16(ql + 32 + 2 * i), c = ld16(qh + 2 * i);
#pragma unroll
            for (int k = 0; k < 2; k++) {
                int la = (a >> (8 * k)) & 0xff, lb = (b >> (8 * k)) & 0xff, hc = (c >> (8 * k)) & 0xff;
                int e = 2 * i + k;
                q[0][e] = (float)(((la & 15) | (((hc >> 0) & 3) << 4)) - 32);
                q[1][e] = (float)(((lb & 15) | (((hc >> 2) & 3) << 4)) - 32);
                q[2][e] = (float)(((la >> 4) | (((hc >> 4) & 3) << 4)) - 32);
                q[3][e] = (float)(((lb >> 4) | (((hc >> 6) & 3) << 4)) - 32);
            }
        }
        float ds[4];
#pragma unroll
        for (int k = 0; k < 4; k++) ds[k] = d * (float)sc[2 * k];
        int base = 256 * sb + 128 * h + l0;
#pragma unroll
        for (int r = 0; r < NR; r++) {
            const float* xr = x + (size_t)min(r, nr - 1) * ldx + base;
            float a = acc[r];
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const float4* xv = (const float4*)(xr + 32 * k);
                float s = 0.0f;
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    float4 t = xv[i];
                    s = fmaf(q[k][4 * i], t.x, s); s = fmaf(q[k][4 * i + 1], t.y, s);
                    s = fmaf(q[k][4 * i + 2], t.z, s); s = fmaf(q[k][4 * i + 3], t.w, s);
                }
                a = fmaf(ds[k], s, a);
            }
            acc[r] = a;
        }
    }
}

template <int NR>
__device__ __forceinline__ void row_dot(const u8* row, int fmt, int cols, int lane, const float* x, int ldx, int nr, float* acc) {
    switch (fmt) {
    case FMT_F32: dot_f32<NR>(row, cols, lane, x, ldx, nr, acc); break;
    case FMT_F16: dot_f16<NR, false>(row, cols, lane, x, ldx, nr, acc); break;
    case FMT_BF16: dot_f16<NR, true>(row, cols, lane, x, ldx, nr, acc); break;
    case FMT_Q4_K: dot_q45k<NR, false>(row, cols, lane, x, ldx, nr, acc); break;
    case FMT_Q5_K: dot_q45k<NR, true>(row, cols, lane, x, ldx, nr, acc); break;
    case FMT_Q6_K: dot_q6k<NR>(row, cols, lane, x, ldx, nr, acc); break;
    default: dot_legacy<NR>(row, fmt, cols, lane, x, ldx, nr, acc); break;
    }
}

template <int NR>
__device__ __forceinline__ void row_tile(const MatSeg& s, int j, const MatArgs& a, int r0, int nr, int lane) {
    float acc[NR];
#pragma unroll
    for (int r = 0; r < NR; r++) acc[r] = 0.0f;
    row_dot<NR>(s.w + (size_t)j * s.row_bytes, s.fmt, a.cols, lane, a.x + (size_t)r0 * a.ldx, a.ldx, nr, acc);
#pragma unroll
    for (int r = 0; r < NR; r++) acc[r] = warp_sum(acc[r]);
    if (lane == 0) {
        float b = s.bias ? s.bias[j] : 0.0f;
#pragma unroll
        for (int r = 0; r < NR; r++) {
            if (r < nr) {
                float* out = s.y + (size_t)(r0 + r) * s.ldy + j;
                float v = acc[r] + b;
                *out = s.accumulate ? *out + v : v;
            }
        }
    }
}

// Grid: one warp per weight row over the segments' rows, 4 warps a block.
extern "C" __global__ void __launch_bounds__(128) matvec(MatArgs a) {
    int lane = threadIdx.x & 31;
    int g = blockIdx.x * 4 + (threadIdx.x >> 5);
    int si = 0;
    while (si < a.nseg && g >= a.seg[si].rows) { g -= a.seg[si].rows; si++; }
    if (si >= a.nseg) return;
    const MatSeg& s = a.seg[si];
    for (int r0 = 0; r0 < a.n; r0 += MAXR) {
        int nr = min(MAXR, a.n - r0);
        if (nr == 1) row_tile<1>(s, g, a, r0, nr, lane);
        else if (nr == 2) row_tile<2>(s, g, a, r0, nr, lane);
        else if (nr <= 4) row_tile<4>(s, g, a, r0, nr, lane);
        else row_tile<8>(s, g, a, r0, nr, lane);
    }
}
