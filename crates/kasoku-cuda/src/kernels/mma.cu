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

template <int FMT>
__device__ __forceinline__ WSub load_sub(const u8* row, int s, int t) {
    WSub w;
    w.m = 0.0f;
    w.d2 = 0.0f;
    if (FMT == FMT_Q8_0) {
        const u8* b = row + (size_t)s * 34;
        w.d = h2f(ld16(b));
        w.lo = ld32u(b + 2 + 8 * t);
        w.hi = ld32u(b + 6 + 8 * t);
    } else if (FMT == FMT_Q4_0 || FMT == FMT_Q4_1 || FMT == FMT_Q5_0 || FMT == FMT_Q5_1) {
        const int bb = FMT == FMT_Q4_0 ? 18 : FMT == FMT_Q4_1 ? 20 : FMT == FMT_Q5_0 ? 22 : 24;
        const int qo = FMT == FMT_Q4_0 ? 2 : FMT == FMT_Q4_1 ? 4 : FMT == FMT_Q5_0 ? 6 : 8;
        const u8* b = row + (size_t)s * bb;
        w.d = h2f(ld16(b));
        if (FMT == FMT_Q4_1 || FMT == FMT_Q5_1) w.m = h2f(ld16(b + 2));
        // Values 0..15 are the low nibbles of the 16 quant bytes, 16..31 the high ones.
        const u8* q = b + qo + 8 * (t & 1);
        int sh = 4 * (t >> 1);
        w.lo = (ld32u(q) >> sh) & 0x0F0F0F0Fu;
        w.hi = (ld32u(q + 4) >> sh) & 0x0F0F0F0Fu;
        if (FMT == FMT_Q5_0 || FMT == FMT_Q5_1) {
            u32 qh = ld32u(b + (FMT == FMT_Q5_0 ? 2 : 4));
            u32 hl, hh;
            high_bits(qh >> (8 * t), &hl, &hh);
            w.lo |= hl;
            w.hi |= hh;
        }
        if (FMT == FMT_Q4_0) { w.lo = __vsub4(w.lo, 0x08080808u); w.hi = __vsub4(w.hi, 0x08080808u); }
        if (FMT == FMT_Q5_0) { w.lo = __vsub4(w.lo, 0x10101010u); w.hi = __vsub4(w.hi, 0x10101010u); }
    } else if (FMT == FMT_Q4_K || FMT == FMT_Q5_K) {
        // Sub-block s % 8 of super-block s / 8: the low (even) or high (odd) nibbles of the
        // 32 bytes of its 64-value group; Q5_K's fifth bit is bit (s % 8) of qh[value].
        const bool q5 = FMT == FMT_Q5_K;
        const u8* b = row + (size_t)(s >> 3) * (q5 ? 176 : 144);
        int sub = s & 7, j = sub >> 1;
        float sc, mn;
        scale_min_k4(sub, b + 4, &sc, &mn);
        w.d = h2f(ld16(b)) * sc;
        w.m = -(h2f(ld16(b + 2)) * mn);
        uint2 q = __ldg((const uint2*)(b + (q5 ? 48 : 16) + 32 * j + 8 * t));
        int sh = 4 * (sub & 1);
        w.lo = (q.x >> sh) & 0x0F0F0F0Fu;
        w.hi = (q.y >> sh) & 0x0F0F0F0Fu;
        if (q5) {
            uint2 h = __ldg((const uint2*)(b + 16 + 8 * t));
            w.lo |= ((h.x >> sub) & 0x01010101u) << 4;
            w.hi |= ((h.y >> sub) & 0x01010101u) << 4;
        }
    } else {  // FMT_Q6_K
        // Sub-block s % 8 = quarter k of half h: ql byte 64h + 32(k & 1) + l (nibble k >> 1),
        // qh byte 32h + l (bits 2k, 2k + 1); scales per 16 values.
        const u8* b = row + (size_t)(s >> 3) * 210;
        int sub = s & 7, h = sub >> 2, k = sub & 3;
        float d = h2f(ld16(b + 208));
        const i8* sc = (const i8*)(b + 192 + 8 * h + 2 * k);
        w.d = d * (float)sc[0];
        w.d2 = d * (float)sc[1];
        const u8* ql = b + 64 * h + 32 * (k & 1) + 4 * t;
        const u8* qh = b + 128 + 32 * h + 4 * t;
        int sh = 4 * (k >> 1);
        u32 l0 = (ld32u(ql) >> sh) & 0x0F0F0F0Fu, l1 = (ld32u(ql + 16) >> sh) & 0x0F0F0F0Fu;
        u32 h0 = (ld32u(qh) >> (2 * k)) & 0x03030303u, h1 = (ld32u(qh + 16) >> (2 * k)) & 0x03030303u;
        w.lo = __vsub4(l0 | (h0 << 4), 0x20202020u);
        w.hi = __vsub4(l1 | (h1 << 4), 0x20202020u);
    }
    return w;
}

// Sub-blocks [sb0, sb1) of weight rows w0 (row g of the tile) and w1 (row g + 8) against
// activation rows r0.. (NT tiles of 8), into acc[tile][(row g, act 2t), (g, 2t+1), (g+8, 2t),
// (g+8, 2t+1)].
template <int NT, int FMT>
__device__ __forceinline__ void mma_range(const u8* w0, const u8* w1, const MatArgs& a, int r0, int sb0, int sb1,
                                          int g, int t, float (*acc)[4]) {
    const bool has_m = FMT == FMT_Q4_1 || FMT == FMT_Q5_1 || FMT == FMT_Q4_K || FMT == FMT_Q5_K;
    const int xs_ld = a.ldx / 32;
    const int last = a.n - 1;
    // Up to four sub-blocks' weights are loaded before any is used (loads in flight).
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
            int sb = s + u;
#pragma unroll
            for (int ti = 0; ti < NT; ti++) {
                int base = r0 + 8 * ti;
                const i8* xb = a.xq + (size_t)min(base + g, last) * a.ldx + 32 * sb;
                int c[4], c2[4];
                if (FMT == FMT_Q6_K) {
                    mma_k16(c, wa[u].lo, wb[u].lo, *(const u32*)(xb + 4 * t));
                    mma_k16(c2, wa[u].hi, wb[u].hi, *(const u32*)(xb + 16 + 4 * t));
                } else {
                    uint2 xv = *(const uint2*)(xb + 8 * t);
                    mma_k32(c, wa[u].lo, wb[u].lo, wa[u].hi, wb[u].hi, xv.x, xv.y);
                }
                float4 s0 = a.xs[(size_t)min(base + 2 * t, last) * xs_ld + sb];
                float4 s1 = a.xs[(size_t)min(base + 2 * t + 1, last) * xs_ld + sb];
                float da[2] = {s0.x, s1.x};
                float sx[2] = {s0.y + s0.z, s1.y + s1.z};
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const WSub& w = i < 2 ? wa[u] : wb[u];
                    int e = i & 1;
                    float v = fmaf(w.d * da[e], (float)c[i], acc[ti][i]);
                    if (FMT == FMT_Q6_K) v = fmaf(w.d2 * da[e], (float)c2[i], v);
                    if (has_m) v = fmaf(w.m, sx[e], v);
                    acc[ti][i] = v;
                }
            }
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
    case FMT_Q4_K: mma_range<NT, FMT_Q4_K>(w0, w1, a, r0, sb0, sb1, g, t, acc); break;
    case FMT_Q5_K: mma_range<NT, FMT_Q5_K>(w0, w1, a, r0, sb0, sb1, g, t, acc); break;
    default: mma_range<NT, FMT_Q6_K>(w0, w1, a, r0, sb0, sb1, g, t, acc); break;
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
