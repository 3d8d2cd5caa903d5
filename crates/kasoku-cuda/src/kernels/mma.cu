// Matrix products on the block formats with int8 tensor cores (mma.sync, compute capability 8.0
// and later): y = x · Wᵀ for 1..N activation rows, one read of each weight serving them all.
//
// A warp takes a tile of 16 weight rows and a fixed range of the rows' 32-value sub-blocks.
// Per sub-block one tensor-core product (m16n8k32; Q6_K, whose scales cover 16 values: two
// m16n8k16) gives the exact integer dot products of the 16 weight rows with 8 activation rows
// of int8 blocks; the thread holding a (weight row, activation row) entry then adds it, scaled,
// to its running sum, sub-block after sub-block in order. The `split` warps of a tile (fixed by
// the matrix width alone) take consecutive ranges of sub-blocks, and their sums are added in
// warp order. Integer sums are exact and the float steps run in one fixed order, so a row's
// result has the same bits whatever the number of activation rows and wherever it sits among
// them: batch invariance, as in matvec.cu.
//
// Inside a sub-block the 32 values are taken in a permuted order (integer sums do not depend on
// it): thread t of a group of four holds values 8t..8t+7 of its weight rows and of its
// activation row, so its bytes are contiguous in memory. Quants enter the product as signed
// bytes (Q4_0 q − 8, Q5_0 q − 16, Q6_K q − 32; the others as stored); a sub-block's term is
// d_w·d_a·Σq_w q_a, plus m_w·(d_a·Σq_a) for the formats with an offset (Q4_1, Q5_1, and
// Q4_K/Q5_K's −dmin·m).

// Activation tiles of 8 rows per pass over the weights (1, 2, 4, 8: up to 64 rows).
#define MMA_MAX_SPLIT 16

__device__ __forceinline__ void mma_k32(int* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
#if __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(0));
#else
    __trap();
#endif
}

__device__ __forceinline__ void mma_k16(int* c, u32 a0, u32 a1, u32 b0) {
#if __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%7,%7,%7};"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a0), "r"(a1), "r"(b0), "r"(0));
#else
    __trap();
#endif
}

// One weight row's share of a sub-block for thread t: its 8 values as two words of signed
// bytes (lo: values 8t..8t+3, hi: 8t+4..8t+7; Q6_K: lo values 4t..4t+3 of the first 16, hi the
// same of the second 16), the scale d (Q6_K: d of the first 16, d2 of the second) and the
// offset coefficient m.
struct WSub {
    u32 lo, hi;
    float d, m, d2;
};

// Bits 0..7 of `bits` moved to bit 4 of bytes 0..3 (lo) and 4..7 (hi).
__device__ __forceinline__ void high_bits(u32 bits, u32* lo, u32* hi) {
    u32 l = 0, h = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        l |= ((bits >> i) & 1u) << (8 * i + 4);
        h |= ((bits >> (4 + i)) & 1u) << (8 * i + 4);
    }
    *lo = l;
    *hi = h;
}

// A 32-bit word at a 2-byte-aligned address: one aligned load when it is 4-aligned, else
// two and a funnel shift (matrix buffers carry slack past their end).
__device__ __forceinline__ u32 ld32a(const u8* p) {
    size_t at = (size_t)p;
    const u32* b = (const u32*)(at & ~(size_t)3);
    if ((at & 3) == 0) return __ldg(b);
    return __funnelshift_r(__ldg(b), __ldg(b + 1), 16);
}

// The legacy formats (blocks of 32 with their own scale): Q4_0, Q4_1, Q5_0, Q5_1, Q8_0.
template <int FMT>
__device__ __forceinline__ WSub load_sub(const u8* row, int s, int t) {
    WSub w;
    w.m = 0.0f;
    w.d2 = 0.0f;
    if (FMT == FMT_Q8_0) {
        const u8* b = row + (size_t)s * 34;
        w.d = h2f(ld16(b));
        w.lo = ld32a(b + 2 + 8 * t);
        w.hi = ld32a(b + 6 + 8 * t);
    } else if (FMT == FMT_Q4_0 || FMT == FMT_Q4_1 || FMT == FMT_Q5_0 || FMT == FMT_Q5_1) {
        const int bb = FMT == FMT_Q4_0 ? 18 : FMT == FMT_Q4_1 ? 20 : FMT == FMT_Q5_0 ? 22 : 24;
        const int qo = FMT == FMT_Q4_0 ? 2 : FMT == FMT_Q4_1 ? 4 : FMT == FMT_Q5_0 ? 6 : 8;
        const u8* b = row + (size_t)s * bb;
        w.d = h2f(ld16(b));
        if (FMT == FMT_Q4_1 || FMT == FMT_Q5_1) w.m = h2f(ld16(b + 2));
        // Values 0..15 are the low nibbles of the 16 quant bytes, 16..31 the high ones.
        const u8* q = b + qo + 8 * (t & 1);
        int sh = 4 * (t >> 1);
        w.lo = (ld32a(q) >> sh) & 0x0F0F0F0Fu;
        w.hi = (ld32a(q + 4) >> sh) & 0x0F0F0F0Fu;
        if (FMT == FMT_Q5_0 || FMT == FMT_Q5_1) {
            u32 qh = ld32a(b + (FMT == FMT_Q5_0 ? 2 : 4));
            u32 hl, hh;
            high_bits(qh >> (8 * t), &hl, &hh);
            w.lo |= hl;
            w.hi |= hh;
        }
        if (FMT == FMT_Q4_0) { w.lo = __vsub4(w.lo, 0x08080808u); w.hi = __vsub4(w.hi, 0x08080808u); }
        if (FMT == FMT_Q5_0) { w.lo = __vsub4(w.lo, 0x10101010u); w.hi = __vsub4(w.hi, 0x10101010u); }
    }
    return w;
}

// Byte i (0..11) of a K-quant super-block's packed scales, held in header words y, z, w.
__device__ __forceinline__ u32 kscale_byte(const uint4& h, int i) {
    u32 word = i < 4 ? h.y : i < 8 ? h.z : h.w;
    return (word >> (8 * (i & 3))) & 0xFFu;
}

// The activation side of sub-block sb for tile ti and its accumulation into acc[ti]: the
// product of the weight fragments (lo/hi words of rows g and g + 8) with activation row
// r0 + 8ti + g, then each entry's float step (see the file comment).
template <int FMT>
__device__ __forceinline__ void mma_tile_step(const WSub& wa, const WSub& wb, const MatArgs& a, int base, int sb,
                                              int g, int t, float* acc) {
    const bool has_m = FMT == FMT_Q4_1 || FMT == FMT_Q5_1 || FMT == FMT_Q4_K || FMT == FMT_Q5_K;
    const int last = a.n - 1;
    const i8* xb = a.xq + (size_t)min(base + g, last) * a.ldx + 32 * sb;
    int c[4], c2[4];
    if (FMT == FMT_Q6_K) {
        mma_k16(c, wa.lo, wb.lo, *(const u32*)(xb + 4 * t));
        mma_k16(c2, wa.hi, wb.hi, *(const u32*)(xb + 16 + 4 * t));
    } else {
        uint2 xv = *(const uint2*)(xb + 8 * t);
        mma_k32(c, wa.lo, wb.lo, wa.hi, wb.hi, xv.x, xv.y);
    }
    const int xs_ld = a.ldx / 32;
    float4 s0 = a.xs[(size_t)min(base + 2 * t, last) * xs_ld + sb];
    float4 s1 = a.xs[(size_t)min(base + 2 * t + 1, last) * xs_ld + sb];
    float da[2] = {s0.x, s1.x};
    float sx[2] = {s0.y + s0.z, s1.y + s1.z};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const WSub& w = i < 2 ? wa : wb;
        int e = i & 1;
        float v = fmaf(w.d * da[e], (float)c[i], acc[i]);
        if (FMT == FMT_Q6_K) v = fmaf(w.d2 * da[e], (float)c2[i], v);
        if (has_m) v = fmaf(w.m, sx[e], v);
        acc[i] = v;
    }
}

// Q4_K / Q5_K, one super-block at a time: its 16-byte header (d, dmin, packed scales) and the
// 8 bytes of each 64-value group this warp touches are loaded once, before any product (a
// group's bytes serve both of its sub-blocks: low and high nibbles).
template <int FMT>
__device__ __forceinline__ WSub kquant_sub(const uint4& h, uint2 q, uint2 e, int sub) {
    WSub w;
    float sc, mn;
    int j = sub;
    if (j < 4) {
        sc = (float)(kscale_byte(h, j) & 63);
        mn = (float)(kscale_byte(h, j + 4) & 63);
    } else {
        sc = (float)((kscale_byte(h, j + 4) & 0xF) | ((kscale_byte(h, j - 4) >> 6) << 4));
        mn = (float)((kscale_byte(h, j + 4) >> 4) | ((kscale_byte(h, j) >> 6) << 4));
    }
    w.d = h2f((u16)(h.x & 0xFFFF)) * sc;
    w.m = -(h2f((u16)(h.x >> 16)) * mn);
    w.d2 = 0.0f;
    int sh = 4 * (sub & 1);
    w.lo = (q.x >> sh) & 0x0F0F0F0Fu;
    w.hi = (q.y >> sh) & 0x0F0F0F0Fu;
    if (FMT == FMT_Q5_K) {
        w.lo |= ((e.x >> sub) & 0x01010101u) << 4;
        w.hi |= ((e.y >> sub) & 0x01010101u) << 4;
    }
    return w;
}

template <int NT, int FMT>
__device__ __forceinline__ void mma_range_kquant(const u8* w0, const u8* w1, const MatArgs& a, int r0, int sb0, int sb1,
                                                 int g, int t, float (*acc)[4]) {
    const bool q5 = FMT == FMT_Q5_K;
    const int bb = q5 ? 176 : 144, qo = q5 ? 48 : 16;
    for (int s = sb0; s < sb1;) {
        const int k = s >> 3, lo = s & 7, hi = min(sb1 - 8 * k, 8);
        const u8* b0 = w0 + (size_t)k * bb;
        const u8* b1 = w1 + (size_t)k * bb;
        uint4 h0 = __ldg((const uint4*)b0), h1 = __ldg((const uint4*)b1);
        uint2 q0[4], q1[4], e0 = make_uint2(0, 0), e1 = make_uint2(0, 0);
#pragma unroll
        for (int j = 0; j < 4; j++) {
            if (2 * j + 1 >= lo && 2 * j < hi) {
                q0[j] = __ldg((const uint2*)(b0 + qo + 32 * j + 8 * t));
                q1[j] = __ldg((const uint2*)(b1 + qo + 32 * j + 8 * t));
            }
        }
        if (q5) {
            e0 = __ldg((const uint2*)(b0 + 16 + 8 * t));
            e1 = __ldg((const uint2*)(b1 + 16 + 8 * t));
        }
#pragma unroll
        for (int sub = 0; sub < 8; sub++) {
            if (sub < lo || sub >= hi) continue;
            WSub wa = kquant_sub<FMT>(h0, q0[sub >> 1], e0, sub);
            WSub wb = kquant_sub<FMT>(h1, q1[sub >> 1], e1, sub);
#pragma unroll
            for (int ti = 0; ti < NT; ti++) mma_tile_step<FMT>(wa, wb, a, r0 + 8 * ti, 8 * k + sub, g, t, acc[ti]);
        }
        s = 8 * k + hi;
    }
}

// Q6_K, one super-block at a time: for each half it touches, the 16 ql bytes, 8 qh bytes and 8
// scales this thread needs are loaded once (as words), before any product.
template <int NT>
__device__ __forceinline__ void mma_range_q6k(const u8* w0, const u8* w1, const MatArgs& a, int r0, int sb0, int sb1,
                                              int g, int t, float (*acc)[4]) {
    for (int s = sb0; s < sb1;) {
        const int k = s >> 3, lo = s & 7, hi = min(sb1 - 8 * k, 8);
        const u8* rows[2] = {w0 + (size_t)k * 210, w1 + (size_t)k * 210};
        // Per row and half: ql words [(k & 1) * 2 + {0: +0, 1: +16}], qh words, scale words.
        u32 ql[2][2][4], qh[2][2][2], sc[2][2][2];
        float d[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            const u8* b = rows[r];
            d[r] = h2f(ld16(b + 208));
#pragma unroll
            for (int h = 0; h < 2; h++) {
                if (4 * h + 3 >= lo && 4 * h < hi) {
#pragma unroll
                    for (int i = 0; i < 4; i++) ql[r][h][i] = ld32a(b + 64 * h + 32 * (i >> 1) + 16 * (i & 1) + 4 * t);
                    qh[r][h][0] = ld32a(b + 128 + 32 * h + 4 * t);
                    qh[r][h][1] = ld32a(b + 128 + 32 * h + 16 + 4 * t);
                    sc[r][h][0] = ld32a(b + 192 + 8 * h);
                    sc[r][h][1] = ld32a(b + 196 + 8 * h);
                }
            }
        }
#pragma unroll
        for (int sub = 0; sub < 8; sub++) {
            if (sub < lo || sub >= hi) continue;
            const int h = sub >> 2, q = sub & 3;
            WSub w[2];
#pragma unroll
            for (int r = 0; r < 2; r++) {
                int sh = 4 * (q >> 1);
                u32 l0 = (ql[r][h][2 * (q & 1)] >> sh) & 0x0F0F0F0Fu;
                u32 l1 = (ql[r][h][2 * (q & 1) + 1] >> sh) & 0x0F0F0F0Fu;
                u32 h0 = (qh[r][h][0] >> (2 * q)) & 0x03030303u, h1 = (qh[r][h][1] >> (2 * q)) & 0x03030303u;
                w[r].lo = __vsub4(l0 | (h0 << 4), 0x20202020u);
                w[r].hi = __vsub4(l1 | (h1 << 4), 0x20202020u);
                // Scales sc[8h + 2q] and sc[8h + 2q + 1]: bytes 2q, 2q + 1 of the half's 8.
                u32 word = sc[r][h][q >> 1];
                int b0 = (int)(i8)((word >> (16 * (q & 1))) & 0xFF), b1 = (int)(i8)((word >> (16 * (q & 1) + 8)) & 0xFF);
                w[r].d = d[r] * (float)b0;
                w[r].d2 = d[r] * (float)b1;
                w[r].m = 0.0f;
            }
#pragma unroll
            for (int ti = 0; ti < NT; ti++) mma_tile_step<FMT_Q6_K>(w[0], w[1], a, r0 + 8 * ti, 8 * k + sub, g, t, acc[ti]);
        }
        s = 8 * k + hi;
    }
}

// Sub-blocks [sb0, sb1) of weight rows w0 (row g of the tile) and w1 (row g + 8) of a legacy
// format against activation rows r0.. (NT tiles of 8), into acc[tile][(row g, act 2t),
// (g, 2t+1), (g+8, 2t), (g+8, 2t+1)]. Up to four sub-blocks' weights are loaded before any is
// used (loads in flight).
template <int NT, int FMT>
__device__ __forceinline__ void mma_range(const u8* w0, const u8* w1, const MatArgs& a, int r0, int sb0, int sb1,
                                          int g, int t, float (*acc)[4]) {
    for (int s = sb0; s < sb1; s += 4) {
        WSub wa[4], wb[4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            if (s + u < sb1) {
                wa[u] = load_sub<FMT>(w0, s + u, t);
                wb[u] = load_sub<FMT>(w1, s + u, t);
            }
        }
#pragma unroll
        for (int u = 0; u < 4; u++) {
            if (s + u >= sb1) break;
#pragma unroll
            for (int ti = 0; ti < NT; ti++) mma_tile_step<FMT>(wa[u], wb[u], a, r0 + 8 * ti, s + u, g, t, acc[ti]);
        }
    }
}

template <int NT>
__device__ __forceinline__ void mma_range_any(int fmt, const u8* w0, const u8* w1, const MatArgs& a, int r0, int sb0,
                                              int sb1, int g, int t, float (*acc)[4]) {
    switch (fmt) {
    case FMT_Q4_0: mma_range<NT, FMT_Q4_0>(w0, w1, a, r0, sb0, sb1, g, t, acc); break;
    case FMT_Q4_1: mma_range<NT, FMT_Q4_1>(w0, w1, a, r0, sb0, sb1, g, t, acc); break;
    case FMT_Q5_0: mma_range<NT, FMT_Q5_0>(w0, w1, a, r0, sb0, sb1, g, t, acc); break;
    case FMT_Q5_1: mma_range<NT, FMT_Q5_1>(w0, w1, a, r0, sb0, sb1, g, t, acc); break;
    case FMT_Q8_0: mma_range<NT, FMT_Q8_0>(w0, w1, a, r0, sb0, sb1, g, t, acc); break;
    case FMT_Q4_K: mma_range_kquant<NT, FMT_Q4_K>(w0, w1, a, r0, sb0, sb1, g, t, acc); break;
    case FMT_Q5_K: mma_range_kquant<NT, FMT_Q5_K>(w0, w1, a, r0, sb0, sb1, g, t, acc); break;
    default: mma_range_q6k<NT>(w0, w1, a, r0, sb0, sb1, g, t, acc); break;
    }
}

// Grid: one block per tile of 16 weight rows (over the segments, in order), `split` warps a
// block. Activation rows go in groups of 8·NT (one pass over the weights each).
template <int NT>
__device__ __forceinline__ void mma_body(const MatArgs& a) {
    __shared__ u64 block_best[MATVEC_MAX_ROWS];
    __shared__ float part[MMA_MAX_SPLIT * 4 * 32];
    const bool best = a.nseg == 1 && a.seg[0].best;
    if (best) {
        for (int r = threadIdx.x; r < a.n; r += blockDim.x) block_best[r] = 0;
        __syncthreads();
    }
    const int split = a.split;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    int tile = blockIdx.x, si = 0;
    while (si < a.nseg - 1 && tile >= (a.seg[si].rows + 15) / 16) { tile -= (a.seg[si].rows + 15) / 16; si++; }
    const MatSeg& s = a.seg[si];
    const int row0 = 16 * tile + g, row1 = row0 + 8;
    const u8* w0 = s.w + (size_t)min(row0, s.rows - 1) * s.row_bytes;
    const u8* w1 = s.w + (size_t)min(row1, s.rows - 1) * s.row_bytes;
    const int nsb = a.cols / 32;
    const int sb0 = warp * nsb / split, sb1 = (warp + 1) * nsb / split;
    for (int r0 = 0; r0 < a.n; r0 += 8 * NT) {
        float acc[NT][4];
#pragma unroll
        for (int ti = 0; ti < NT; ti++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[ti][i] = 0.0f;
        mma_range_any<NT>(s.fmt, w0, w1, a, r0, sb0, sb1, g, t, acc);
#pragma unroll
        for (int ti = 0; ti < NT; ti++) {
            float v[4] = {acc[ti][0], acc[ti][1], acc[ti][2], acc[ti][3]};
            if (split > 1) {
                // The warps' sums added in warp order (ranges in order along the row).
                __syncthreads();
#pragma unroll
                for (int i = 0; i < 4; i++) part[(warp * 4 + i) * 32 + lane] = v[i];
                __syncthreads();
                if (warp == 0)
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        float x = part[i * 32 + lane];
                        for (int p = 1; p < split; p++) x += part[(p * 4 + i) * 32 + lane];
                        v[i] = x;
                    }
            }
            if (warp == 0) {
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    int j = i < 2 ? row0 : row1;
                    int r = r0 + 8 * ti + 2 * t + (i & 1);
                    if (j < s.rows && r < a.n) {
                        float* out = s.y + (size_t)r * s.ldy + j;
                        float y = v[i] + (s.bias ? s.bias[j] : 0.0f);
                        y = s.accumulate ? *out + y : y;
                        *out = y;
                        if (best) atomicMax(block_best + r, argmax_key(y, j));
                    }
                }
            }
        }
    }
    if (best) {
        __syncthreads();
        for (int r = threadIdx.x; r < a.n; r += blockDim.x)
            if (block_best[r]) atomicMax(a.seg[0].best + r, block_best[r]);
    }
}

extern "C" __global__ void __launch_bounds__(512) mma_1(MatArgs a) {
    wait_for_predecessor();
    mma_body<1>(a);
}
extern "C" __global__ void __launch_bounds__(512) mma_2(MatArgs a) {
    wait_for_predecessor();
    mma_body<2>(a);
}
extern "C" __global__ void __launch_bounds__(512) mma_4(MatArgs a) {
    wait_for_predecessor();
    mma_body<4>(a);
}
extern "C" __global__ void __launch_bounds__(512) mma_8(MatArgs a) {
    wait_for_predecessor();
    mma_body<8>(a);
}
