// Matrix products on the block formats with int8 tensor cores (mma.sync, compute capability 8.0
// and later): y = x · Wᵀ for 1..N activation rows, one read of each weight serving them all.
//
// Arithmetic (unchanged from the first versions). A warp takes a tile of 16 weight rows and a
// fixed range of the rows' 32-value sub-blocks. Per sub-block one tensor-core product
// (m16n8k32; Q6_K, whose scales cover 16 values: two m16n8k16) gives the exact integer dot
// products of the 16 weight rows with 8 activation rows of int8 blocks; the thread holding a
// (weight row, activation row) entry then adds it, scaled, to its running sum, sub-block after
// sub-block in order. The `split` warps of a tile (fixed by the matrix width alone) take
// consecutive ranges of the row, and their sums are added in warp order. Integer sums are exact
// and the float steps run in one fixed order, so a row's result has the same bits whatever the
// number of activation rows and wherever it sits among them: batch invariance, as in matvec.cu.
//
// Inside a sub-block the 32 values are taken in a permuted order (integer sums do not depend on
// it): thread t of a group of four holds values 8t..8t+7 of its weight rows and of its
// activation row, so its bytes are contiguous in memory. Quants enter the product as signed
// bytes (Q4_0 q − 8, Q5_0 q − 16, Q6_K q − 32; the others as stored); a sub-block's term is
// d_w·d_a·Σq_w q_a, plus m_w·(d_a·Σq_a) for the formats with an offset (Q4_1, Q5_1, and
// Q4_K/Q5_K's −dmin·m).
//
// Memory (this version). The first versions gave one row 1.8x the dp4a kernel's time (gate|up
// 28.6 us against 9.6 on an H100): blocks of 12 warps with their 16-row tile's weights loaded
// into registers a few sub-blocks ahead left about one block per SM, each block's bytes
// arriving in one round, then a reduction, then the next block. Two designs were open: a
// load-time repack of every block-format matrix into fragment order, or streaming the GGUF
// bytes through shared memory. This one streams, because
//   - a product's time at 1–16 rows is the time to bring its weights in: what matters is how
//     many bytes are in flight per SM, not how a thread's bytes are laid out (a fragment-ordered
//     layout saves a few shared-memory instructions, not DRAM bytes, since the GGUF bytes are
//     read once either way and nibbles must stay nibbles);
//   - a copy engine request (cp.async, 16 bytes a lane) holds no register until the data is
//     used, so a warp can have its whole range in flight at once whatever the kernel's register
//     use; and the copies of a warp's first chunks are issued before the wait for the previous
//     kernel (weights are never written), so with programmatic dependent launch the weights
//     stream in while the kernels before this one finish (as matvec_stream does);
//   - the matrices stay in their GGUF layout: one copy on the device, read by the dp4a kernel,
//     the prefill GEMM's expansion, embeddings and the CPU-side checks alike.
// Layout of the work: the row is cut into super-blocks of 256 values (8 sub-blocks: one K-quant
// super-block, or 8 legacy blocks; a legacy row's last one may be partial). A block is the
// `split` warps of one 16-row tile (split = ceil(super-blocks / units) clamped to 1..16, units
// = 1 by default: on the 1.5B shape 6 warps a tile at width 1536, 16 at 8960), and warp w
// takes super-blocks [w·nsup/split, (w+1)·nsup/split): small blocks, one round of a few KiB per
// warp, and for gate|up every block of the grid resident at once on an H100. A warp copies a
// super-block of its 16 rows into one stage of its ring in shared memory (each row's bytes
// widened to 16-byte bounds; a stage row every `stride` bytes, an odd number of 16-byte lines
// so the 8 rows a load instruction touches fall in different banks), keeps up to `stages`
// super-blocks in flight (the launcher's choice, from a shared-memory budget: it never changes
// a result), and computes each one from shared memory once it has landed (cp.async.wait_group,
// then __syncwarp for the other lanes' copies). The reduction across the tile's warps goes
// through the same shared memory, once every warp is done with its ring.
//
// The kernel parameters are matvec.cu's MatArgs; `split` is the warps per tile, and the two
// streaming fields, unused by this kernel otherwise, carry the ring: stream_stages = stages
// per warp, stream_stage_bytes = the stage's row stride (16 rows a stage).

// Most warps per 16-row tile (MMA_MAX_SPLIT in kernels/mod.rs).
#define MMA_MAX_SPLIT 16
// Sub-blocks of 32 values per super-block (a warp's unit of work and of copying).
#define MMA_SUBS 8

// ---- PTX wrappers (tools/mma_emulate replaces this part with host emulations)
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

// 16 bytes from global memory (16-byte aligned) into shared memory (16-byte aligned), by the
// copy engine: the thread goes on at once.
__device__ __forceinline__ void mma_cp16(u8* dst, const u8* src) {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((u32)__cvta_generic_to_shared(dst)), "l"(src)
                 : "memory");
#else
    __trap();
#endif
}

// Closes this thread's group of copies issued since the last commit (possibly none).
__device__ __forceinline__ void mma_cp_commit() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

// Waits until at most `pending` (0..3) of this thread's most recent groups are incomplete.
__device__ __forceinline__ void mma_cp_wait(int pending) {
#if __CUDA_ARCH__ >= 800
    switch (pending) {
    case 0: asm volatile("cp.async.wait_group 0;" ::: "memory"); break;
    case 1: asm volatile("cp.async.wait_group 1;" ::: "memory"); break;
    case 2: asm volatile("cp.async.wait_group 2;" ::: "memory"); break;
    default: asm volatile("cp.async.wait_group 3;" ::: "memory"); break;
    }
#endif
}
// ---- end of PTX wrappers

// A 32-bit word of shared memory at a 2-byte-aligned address: one aligned load when it is
// 4-aligned, else two and a funnel shift (both inside the row's copied 16-byte lines).
__device__ __forceinline__ u32 lds32(const u8* p) {
    size_t at = (size_t)p;
    const u32* b = (const u32*)(at & ~(size_t)3);
    if ((at & 3) == 0) return b[0];
    return __funnelshift_r(b[0], b[1], 16);
}

// Bytes of 256 values (a super-block) of each block format.
__device__ __forceinline__ int mma_sup_bytes(int fmt) {
    switch (fmt) {
    case FMT_Q4_0: return 8 * 18;
    case FMT_Q4_1: return 8 * 20;
    case FMT_Q5_0: return 8 * 22;
    case FMT_Q5_1: return 8 * 24;
    case FMT_Q8_0: return 8 * 34;
    case FMT_Q4_K: return 144;
    case FMT_Q5_K: return 176;
    default: return 210;  // Q6_K
    }
}

// Copies super-block k of the 16 rows of `tile` (rows past the matrix repeat its last) into
// `stage`: row i's bytes [k·sup, min((k+1)·sup, row_bytes)), widened to 16-byte bounds, at
// stage + i·stride. Every lane of the warp calls it; each issues its share of 16-byte copies.
__device__ __forceinline__ void mma_fetch(u8* stage, const MatSeg& s, int tile, int k, int stride, int lane) {
    const long long sup = mma_sup_bytes(s.fmt);
    const long long from = k * sup, to = min(from + sup, s.row_bytes);
    const int lines = stride >> 4;
    for (int p = lane; p < 16 * lines; p += 32) {
        const int i = p / lines, line = p - i * lines;
        const u8* row = s.w + (size_t)min(16 * tile + i, s.rows - 1) * s.row_bytes;
        size_t a0 = (size_t)(row + from) & ~(size_t)15, a1 = ((size_t)(row + to) + 15) & ~(size_t)15;
        size_t src = a0 + 16 * (size_t)line;
        if (src < a1) mma_cp16(stage + i * stride + 16 * line, (const u8*)src);
    }
}

// Where super-block k of row `row` of segment s starts inside its stage row (its offset from
// the 16-byte line the copy began at).
__device__ __forceinline__ int mma_lead(const MatSeg& s, int row, int k) {
    const u8* p = s.w + (size_t)min(row, s.rows - 1) * s.row_bytes + (size_t)k * mma_sup_bytes(s.fmt);
    return (int)((size_t)p & 15);
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

// The legacy formats (blocks of 32 with their own scale): Q4_0, Q4_1, Q5_0, Q5_1, Q8_0; block
// u of a stage row starting at `row` (shared memory).
template <int FMT>
__device__ __forceinline__ WSub load_sub(const u8* row, int u, int t) {
    WSub w;
    w.m = 0.0f;
    w.d2 = 0.0f;
    if (FMT == FMT_Q8_0) {
        const u8* b = row + u * 34;
        w.d = h2f(ld16(b));
        w.lo = lds32(b + 2 + 8 * t);
        w.hi = lds32(b + 6 + 8 * t);
    } else {
        const int bb = FMT == FMT_Q4_0 ? 18 : FMT == FMT_Q4_1 ? 20 : FMT == FMT_Q5_0 ? 22 : 24;
        const int qo = FMT == FMT_Q4_0 ? 2 : FMT == FMT_Q4_1 ? 4 : FMT == FMT_Q5_0 ? 6 : 8;
        const u8* b = row + u * bb;
        w.d = h2f(ld16(b));
        if (FMT == FMT_Q4_1 || FMT == FMT_Q5_1) w.m = h2f(ld16(b + 2));
        // Values 0..15 are the low nibbles of the 16 quant bytes, 16..31 the high ones.
        const u8* q = b + qo + 8 * (t & 1);
        int sh = 4 * (t >> 1);
        w.lo = (lds32(q) >> sh) & 0x0F0F0F0Fu;
        w.hi = (lds32(q + 4) >> sh) & 0x0F0F0F0Fu;
        if (FMT == FMT_Q5_0 || FMT == FMT_Q5_1) {
            u32 qh = lds32(b + (FMT == FMT_Q5_0 ? 2 : 4));
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

// Sub-block `sub` of a Q4_K / Q5_K super-block from its header h, this thread's 8 quant bytes
// of the sub-block's 64-value group q (low nibbles: even sub-blocks, high: odd) and, for Q5_K,
// its 8 bytes of high bits e.
// The 6-bit scale and min of sub-block j (0..7) of a K-quant super-block with header h.
__device__ __forceinline__ void kquant_scale_min(const uint4& h, int j, u32* sc, u32* mn) {
    if (j < 4) {
        *sc = kscale_byte(h, j) & 63;
        *mn = kscale_byte(h, j + 4) & 63;
    } else {
        *sc = (kscale_byte(h, j + 4) & 0xF) | ((kscale_byte(h, j - 4) >> 6) << 4);
        *mn = (kscale_byte(h, j + 4) >> 4) | ((kscale_byte(h, j) >> 6) << 4);
    }
}

template <int FMT>
__device__ __forceinline__ WSub kquant_sub(const uint4& h, uint2 q, uint2 e, int sub) {
    WSub w;
    u32 sc, mn;
    kquant_scale_min(h, sub, &sc, &mn);
    w.d = h2f((u16)(h.x & 0xFFFF)) * (float)sc;
    w.m = -(h2f((u16)(h.x >> 16)) * (float)mn);
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

// One super-block (k) of the tile's rows from their stage rows ra (row g) and rb (row g + 8),
// against NT tiles of 8 activation rows from r0, into acc[tile][(row g, act 2t), (g, 2t+1),
// (g+8, 2t), (g+8, 2t+1)]. `subs`: its sub-blocks (8, or fewer at a legacy row's end).
// The loops over a super-block's sub-blocks (and a K-quant's 64-value groups) stay rolled:
// unrolled (KASOKU_MMA_UNROLLED, from KASOKU_CUDA_MMA_ROLLED=0), with every format's path in
// one kernel, the kernels held to 64 registers spill 308 (mma_1) and 1,240 (mma_2) bytes a
// thread (ptxas, sm_90, NVRTC 13.0), rolled 20 and 136; each sub-block's activation loads
// then wait for the one before, and still rolled was faster on an H100 (2026-12-07c: the
// 1.5B shape all on tensor cores decoded 438 tokens/s against 433, a 16-row pass 1.80 single
// ones against 2.10). The arithmetic and its order are the same either way.
#ifdef KASOKU_MMA_UNROLLED
#define MMA_SUB_LOOP _Pragma("unroll")
#else
#define MMA_SUB_LOOP _Pragma("unroll 1")
#endif
template <int NT, int FMT>
__device__ __forceinline__ void mma_sup_legacy(const u8* ra, const u8* rb, const MatArgs& a, int r0, int k, int subs,
                                               int g, int t, float (*acc)[4]) {
MMA_SUB_LOOP
    for (int u = 0; u < MMA_SUBS; u++) {
        if (u >= subs) break;
        WSub wa = load_sub<FMT>(ra, u, t), wb = load_sub<FMT>(rb, u, t);
#pragma unroll
        for (int ti = 0; ti < NT; ti++) mma_tile_step<FMT>(wa, wb, a, r0 + 8 * ti, MMA_SUBS * k + u, g, t, acc[ti]);
    }
}

template <int NT, int FMT>
__device__ __forceinline__ void mma_sup_kquant(const u8* ra, const u8* rb, const MatArgs& a, int r0, int k, int g,
                                               int t, float (*acc)[4]) {
    const int qo = FMT == FMT_Q5_K ? 48 : 16;
    const uint4 ha = make_uint4(lds32(ra), lds32(ra + 4), lds32(ra + 8), lds32(ra + 12));
    const uint4 hb = make_uint4(lds32(rb), lds32(rb + 4), lds32(rb + 8), lds32(rb + 12));
    uint2 ea = make_uint2(0, 0), eb = make_uint2(0, 0);
    if (FMT == FMT_Q5_K) {
        ea = make_uint2(lds32(ra + 16 + 8 * t), lds32(ra + 20 + 8 * t));
        eb = make_uint2(lds32(rb + 16 + 8 * t), lds32(rb + 20 + 8 * t));
    }
MMA_SUB_LOOP
    for (int j = 0; j < 4; j++) {
        const uint2 qa = make_uint2(lds32(ra + qo + 32 * j + 8 * t), lds32(ra + qo + 32 * j + 4 + 8 * t));
        const uint2 qb = make_uint2(lds32(rb + qo + 32 * j + 8 * t), lds32(rb + qo + 32 * j + 4 + 8 * t));
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int sub = 2 * j + h;
            WSub wa = kquant_sub<FMT>(ha, qa, ea, sub), wb = kquant_sub<FMT>(hb, qb, eb, sub);
#pragma unroll
            for (int ti = 0; ti < NT; ti++)
                mma_tile_step<FMT>(wa, wb, a, r0 + 8 * ti, MMA_SUBS * k + sub, g, t, acc[ti]);
        }
    }
}

// Sub-block u of a Q6_K super-block's stage row p: ql (low 4 bits, 128 bytes), qh (high 2
// bits, 64), 16 scales, d.
__device__ __forceinline__ WSub q6k_sub(const u8* p, int u, int t) {
    const int h = u >> 2, q = u & 3, sh = 4 * (q >> 1);
    const u8* ql = p + 64 * h + 32 * (q & 1) + 4 * t;
    const u8* qh = p + 128 + 32 * h + 4 * t;
    u32 l0 = (lds32(ql) >> sh) & 0x0F0F0F0Fu, l1 = (lds32(ql + 16) >> sh) & 0x0F0F0F0Fu;
    u32 h0 = (lds32(qh) >> (2 * q)) & 0x03030303u, h1 = (lds32(qh + 16) >> (2 * q)) & 0x03030303u;
    WSub w;
    w.lo = __vsub4(l0 | (h0 << 4), 0x20202020u);
    w.hi = __vsub4(l1 | (h1 << 4), 0x20202020u);
    // Scales sc[8h + 2q] and sc[8h + 2q + 1]: bytes 2q, 2q + 1 of the half's 8.
    u32 word = lds32(p + 192 + 8 * h + 4 * (q >> 1));
    int b0 = (int)(i8)((word >> (16 * (q & 1))) & 0xFF), b1 = (int)(i8)((word >> (16 * (q & 1) + 8)) & 0xFF);
    float d = h2f(ld16(p + 208));
    w.d = d * (float)b0;
    w.d2 = d * (float)b1;
    w.m = 0.0f;
    return w;
}

template <int NT>
__device__ __forceinline__ void mma_sup_q6k(const u8* ra, const u8* rb, const MatArgs& a, int r0, int k, int g, int t,
                                            float (*acc)[4]) {
MMA_SUB_LOOP
    for (int u = 0; u < MMA_SUBS; u++) {
        WSub wa = q6k_sub(ra, u, t), wb = q6k_sub(rb, u, t);
#pragma unroll
        for (int ti = 0; ti < NT; ti++) mma_tile_step<FMT_Q6_K>(wa, wb, a, r0 + 8 * ti, MMA_SUBS * k + u, g, t, acc[ti]);
    }
}

template <int NT>
__device__ __forceinline__ void mma_sup_any(int fmt, const u8* ra, const u8* rb, const MatArgs& a, int r0, int k,
                                            int subs, int g, int t, float (*acc)[4]) {
    switch (fmt) {
    case FMT_Q4_0: mma_sup_legacy<NT, FMT_Q4_0>(ra, rb, a, r0, k, subs, g, t, acc); break;
    case FMT_Q4_1: mma_sup_legacy<NT, FMT_Q4_1>(ra, rb, a, r0, k, subs, g, t, acc); break;
    case FMT_Q5_0: mma_sup_legacy<NT, FMT_Q5_0>(ra, rb, a, r0, k, subs, g, t, acc); break;
    case FMT_Q5_1: mma_sup_legacy<NT, FMT_Q5_1>(ra, rb, a, r0, k, subs, g, t, acc); break;
    case FMT_Q8_0: mma_sup_legacy<NT, FMT_Q8_0>(ra, rb, a, r0, k, subs, g, t, acc); break;
    case FMT_Q4_K: mma_sup_kquant<NT, FMT_Q4_K>(ra, rb, a, r0, k, g, t, acc); break;
    case FMT_Q5_K: mma_sup_kquant<NT, FMT_Q5_K>(ra, rb, a, r0, k, g, t, acc); break;
    default: mma_sup_q6k<NT>(ra, rb, a, r0, k, g, t, acc); break;
    }
}

// The warps' sums of a tile added in warp order (ranges in order along the row) through
// `part` (split · 4 · 32 floats of shared memory no copy writes any more: each warp waited for
// its last super-block, and the first barrier keeps it until every warp is done with it), then
// warp 0 writes each (weight row, activation row) entry: bias, residual, the fused argmax into
// `block_best` (or null).
template <int NT>
__device__ __forceinline__ void mma_store(float (*acc)[4], float* part, const MatArgs& a, const MatSeg& s, int r0,
                                          int row0, int row1, u64* block_best) {
    const int split = a.split, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, t = lane & 3;
#pragma unroll
    for (int ti = 0; ti < NT; ti++) {
        float v[4] = {acc[ti][0], acc[ti][1], acc[ti][2], acc[ti][3]};
        if (split > 1) {
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
                    if (block_best) atomicMax(block_best + r, argmax_key(y, j));
                }
            }
        }
    }
}

// Grid: one block per tile of 16 weight rows (over the segments, in order), `split` warps a
// block, warp w taking super-blocks [w·nsup/split, (w+1)·nsup/split) of the rows through its
// ring of `stages` stages (dynamic shared memory: split · stages · 16 · stride bytes).
// Activation rows go in groups of 8·NT (one pass over the weights each; a decode or
// verification pass is one group).
template <int NT>
__device__ __forceinline__ void mma_body(const MatArgs& a) {
    extern __shared__ __align__(16) u8 mma_smem[];
    __shared__ u64 block_best[MATVEC_MAX_ROWS];
    const int split = a.split, stages = a.stream_stages, stride = a.stream_stage_bytes;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    int tile = blockIdx.x, si = 0;
    while (si < a.nseg - 1 && tile >= (a.seg[si].rows + 15) / 16) { tile -= (a.seg[si].rows + 15) / 16; si++; }
    const MatSeg& s = a.seg[si];
    const int nsb = a.cols / 32, nsup = (nsb + MMA_SUBS - 1) / MMA_SUBS;
    const int k0 = warp * nsup / split, k1 = (warp + 1) * nsup / split;
    const int stage_bytes = 16 * stride;
    u8* ring = mma_smem + (size_t)warp * stages * stage_bytes;
    // The first super-blocks are asked for before the wait: weights are never written.
    for (int c = 0; c < stages; c++) {
        if (k0 + c < k1) mma_fetch(ring + c * stage_bytes, s, tile, k0 + c, stride, lane);
        mma_cp_commit();
    }
    wait_for_predecessor();
    const bool best = a.nseg == 1 && a.seg[0].best;
    if (best) {
        for (int r = threadIdx.x; r < a.n; r += blockDim.x) block_best[r] = 0;
        __syncthreads();
    }
    const int row0 = 16 * tile + g, row1 = row0 + 8;
    for (int r0 = 0;;) {
        float acc[NT][4];
#pragma unroll
        for (int ti = 0; ti < NT; ti++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[ti][i] = 0.0f;
        for (int k = k0; k < k1; k++) {
            // Groups committed so far: stages + (k - k0); super-block k's is complete once at
            // most stages - 1 are pending. Then every lane's copies are visible (__syncwarp).
            mma_cp_wait(stages - 1);
            __syncwarp();
            const u8* st = ring + ((k - k0) % stages) * stage_bytes;
            const u8* ra = st + g * stride + mma_lead(s, row0, k);
            const u8* rb = st + (g + 8) * stride + mma_lead(s, row1, k);
            mma_sup_any<NT>(s.fmt, ra, rb, a, r0, k, min(MMA_SUBS, nsb - MMA_SUBS * k), g, t, acc);
            __syncwarp();  // every lane is done with the stage before it is refilled
            if (k + stages < k1) mma_fetch(ring + ((k - k0) % stages) * stage_bytes, s, tile, k + stages, stride, lane);
            mma_cp_commit();
        }
        mma_store<NT>(acc, (float*)mma_smem, a, s, r0, row0, row1, best ? block_best : nullptr);
        r0 += 8 * NT;
        if (r0 >= a.n) break;
        // More than 8·NT rows: the weights again, once warp 0 is done with `part`.
        __syncthreads();
        for (int c = 0; c < stages; c++) {
            if (k0 + c < k1) mma_fetch(ring + c * stage_bytes, s, tile, k0 + c, stride, lane);
            mma_cp_commit();
        }
    }
    if (best) {
        __syncthreads();
        for (int r = threadIdx.x; r < a.n; r += blockDim.x)
            if (block_best[r]) atomicMax(a.seg[0].best + r, block_best[r]);
    }
}

// Blocks of up to MMA_MAX_SPLIT warps; the one- and two-tile kernels (decode and verification
// up to 16 rows) are held to 64 registers a thread so two 16-warp blocks (or many small ones)
// fit an SM.
extern "C" __global__ void __launch_bounds__(512, 2) mma_1(MatArgs a) { mma_body<1>(a); }
extern "C" __global__ void __launch_bounds__(512, 2) mma_2(MatArgs a) { mma_body<2>(a); }
extern "C" __global__ void __launch_bounds__(512) mma_4(MatArgs a) { mma_body<4>(a); }
extern "C" __global__ void __launch_bounds__(512) mma_8(MatArgs a) { mma_body<8>(a); }
