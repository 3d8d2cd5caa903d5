// The tensor-core products of mma.cu on a copy of a Q4_K or Q6_K matrix laid out at load in
// fragment order ("packed"): the same arithmetic in the same order, so every output has the
// bits mma.cu gives from the GGUF bytes, at a fraction of the instructions.
//
// Why. At one activation row mma.cu is bound by instructions, not memory (bench/results/gpu/
// 2026-12-07c): each lane rebuilds its fragments from GGUF bytes in shared memory, with
// unaligned loads, 6-bit scale unpacking and address arithmetic per sub-block. Here a lane's
// bytes for a whole super-block of its tile sit in a few 16-byte words of global memory, read
// with one load each straight into registers; scales are whole bytes. No ring, no copy engine:
// each warp asks L2 for its own chunks before the wait for the previous kernel (weights are
// never written) and loads them once it may start.
//
// Layout. A matrix of R rows × C values (C a multiple of 256) is cut into tiles of 16 rows
// (rows past R repeat row R − 1, as mma.cu's copies do) and each tile into super-blocks of
// 256 values; chunk (tile, k) sits at (tile · C/256 + k) · chunk bytes. Lane ℓ = 4g + t of a
// warp holds rows g and g + 8 of the tile and values 8t..8t+7 of each 32-value sub-block (Q6_K:
// values 4t..4t+3 of each half of 16), as mma.cu's WSub.
//   Q4_K (2,368 bytes, 16 × 148: the GGUF's 144 plus 4):
//     [0, 2048)     j = 0..3: 32 lanes × 16 bytes at 512j + 16ℓ: words (row g, sub 2j),
//                   (g + 8, 2j), (g, 2j + 1), (g + 8, 2j + 1); byte i of a word holds value i of
//                   WSub.lo in its low nibble and value i of WSub.hi in its high nibble.
//     [2048, 2112)  row r's d and dmin (f16, as stored) at 2048 + 4r.
//     [2112, 2368)  row r's 6-bit scale and min of sub-block u at 2112 + 16r + 2u (+1).
//   Q6_K (3,360 bytes, 16 × 210: the GGUF's size):
//     [0, 2048)     as Q4_K, of the values' low 4 bits (q = WSub byte + 32, 0..63).
//     [2048, 3072)  j = 0..1: 32 lanes × 16 bytes at 2048 + 512j + 16ℓ: word m for sub-block
//                   4j + m; its byte i holds the high 2 bits of value i of (row g lo, g hi,
//                   g + 8 lo, g + 8 hi) at bits 0, 2, 4, 6.
//     [3072, 3328)  row r's 16 int8 scales at 3072 + 16r; [3328, 3360) row r's d at 3328 + 2r.
// `mma_pack` writes a chunk per warp from the GGUF bytes with mma.cu's own decoders, so the
// packed kernel's fragments and scales are exactly those mma.cu builds.
//
// Work and order are mma.cu's: `split` warps a tile (kernels::mma_split, from the width alone),
// warp w taking super-blocks [w·nsup/split, (w+1)·nsup/split), each sub-block through
// mma_tile_step, the warps' sums added in warp order by mma_store. Rows in groups of 8·NT.

#define PK_Q4K_CHUNK 2368
#define PK_Q6K_CHUNK 3360

// ---- PTX wrappers (tools/mma_emulate replaces this part with host emulations)
__device__ __forceinline__ void mmap_prefetch(const u8* p) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}
// ---- end of PTX wrappers

__device__ __forceinline__ int packed_chunk_bytes(int fmt) { return fmt == FMT_Q4_K ? PK_Q4K_CHUNK : PK_Q6K_CHUNK; }

// Byte i of a word.
__device__ __forceinline__ u32 byte_of(u32 w, int i) { return (w >> (8 * i)) & 0xFFu; }

// A Q6_K WSub word (four signed bytes q − 32) back to its quants q (0..63).
__device__ __forceinline__ u32 q6_unsigned(u32 w) {
    u32 q = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) q |= ((byte_of(w, i) + 32u) & 63u) << (8 * i);
    return q;
}

// Signed bytes q − 32 from quants q (0..63) in every byte: q + 96 stays below 256 (no carry
// between bytes), and flipping bit 7 subtracts 128 modulo 256.
__device__ __forceinline__ u32 q6_signed(u32 q) { return (q + 0x60606060u) ^ 0x80808080u; }

// Packs chunk blockIdx.x (tile · nsup + super-block) of a Q4_K or Q6_K matrix `w` into `out`.
// One warp a block.
extern "C" __global__ void mma_pack(const u8* w, long long row_bytes, int rows, int cols, int fmt, u8* out) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int nsup = cols / 256;
    const long long chunk = blockIdx.x;
    const int tile = (int)(chunk / nsup), k = (int)(chunk % nsup);
    u8* o = out + chunk * packed_chunk_bytes(fmt);
    const long long sup = fmt == FMT_Q4_K ? 144 : 210;
    const u8* ra = w + (size_t)min(16 * tile + g, rows - 1) * row_bytes + k * sup;
    const u8* rb = w + (size_t)min(16 * tile + g + 8, rows - 1) * row_bytes + k * sup;
    if (fmt == FMT_Q4_K) {
        const uint4 ha = make_uint4(lds32(ra), lds32(ra + 4), lds32(ra + 8), lds32(ra + 12));
        const uint4 hb = make_uint4(lds32(rb), lds32(rb + 4), lds32(rb + 8), lds32(rb + 12));
        const uint2 none = make_uint2(0, 0);
        for (int j = 0; j < 4; j++) {
            const uint2 qa = make_uint2(lds32(ra + 16 + 32 * j + 8 * t), lds32(ra + 20 + 32 * j + 8 * t));
            const uint2 qb = make_uint2(lds32(rb + 16 + 32 * j + 8 * t), lds32(rb + 20 + 32 * j + 8 * t));
            u32 word[4];
            for (int h = 0; h < 2; h++) {
                WSub wa = kquant_sub<FMT_Q4_K>(ha, qa, none, 2 * j + h), wb = kquant_sub<FMT_Q4_K>(hb, qb, none, 2 * j + h);
                word[2 * h] = wa.lo | (wa.hi << 4);
                word[2 * h + 1] = wb.lo | (wb.hi << 4);
            }
            *(uint4*)(o + 512 * j + 16 * lane) = make_uint4(word[0], word[1], word[2], word[3]);
        }
        if (t == 0)
            for (int half = 0; half < 2; half++) {
                const int r = g + 8 * half;
                const uint4& h = half ? hb : ha;
                *(u32*)(o + 2048 + 4 * r) = h.x;
                for (int u = 0; u < 8; u++) {
                    u32 sc, mn;
                    kquant_scale_min(h, u, &sc, &mn);
                    o[2112 + 16 * r + 2 * u] = (u8)sc;
                    o[2112 + 16 * r + 2 * u + 1] = (u8)mn;
                }
            }
    } else {
        u32 high[8];
        for (int j = 0; j < 4; j++) {
            u32 word[4];
            for (int h = 0; h < 2; h++) {
                const int u = 2 * j + h;
                WSub wa = q6k_sub(ra, u, t), wb = q6k_sub(rb, u, t);
                const u32 al = q6_unsigned(wa.lo), ah = q6_unsigned(wa.hi);
                const u32 bl = q6_unsigned(wb.lo), bh = q6_unsigned(wb.hi);
                word[2 * h] = (al & 0x0F0F0F0Fu) | ((ah & 0x0F0F0F0Fu) << 4);
                word[2 * h + 1] = (bl & 0x0F0F0F0Fu) | ((bh & 0x0F0F0F0Fu) << 4);
                u32 hb = 0;
                for (int i = 0; i < 4; i++)
                    hb |= ((byte_of(al, i) >> 4) | ((byte_of(ah, i) >> 4) << 2) | ((byte_of(bl, i) >> 4) << 4) |
                           ((byte_of(bh, i) >> 4) << 6))
                          << (8 * i);
                high[u] = hb;
            }
            *(uint4*)(o + 512 * j + 16 * lane) = make_uint4(word[0], word[1], word[2], word[3]);
        }
        for (int j = 0; j < 2; j++)
            *(uint4*)(o + 2048 + 512 * j + 16 * lane) =
                make_uint4(high[4 * j], high[4 * j + 1], high[4 * j + 2], high[4 * j + 3]);
        if (t == 0)
            for (int half = 0; half < 2; half++) {
                const int r = g + 8 * half;
                const u8* row = half ? rb : ra;
                for (int i = 0; i < 16; i++) o[3072 + 16 * r + i] = row[192 + i];
                o[3328 + 2 * r] = row[208];
                o[3328 + 2 * r + 1] = row[209];
            }
    }
}

// One Q4_K super-block (chunk c) of the tile against NT tiles of 8 activation rows from r0.
template <int NT>
__device__ __forceinline__ void mmap_sup_q4k(const u8* c, const MatArgs& a, int r0, int k, int g, int t, int lane,
                                             float (*acc)[4]) {
    uint4 q[4];
#pragma unroll
    for (int j = 0; j < 4; j++) q[j] = __ldg((const uint4*)(c + 512 * j + 16 * lane));
    const u32 da = __ldg((const u32*)(c + 2048 + 4 * g)), db = __ldg((const u32*)(c + 2048 + 4 * (g + 8)));
    const uint4 sa = __ldg((const uint4*)(c + 2112 + 16 * g)), sb = __ldg((const uint4*)(c + 2112 + 16 * (g + 8)));
    const float ad = h2f((u16)(da & 0xFFFF)), am = h2f((u16)(da >> 16));
    const float bd = h2f((u16)(db & 0xFFFF)), bm = h2f((u16)(db >> 16));
#pragma unroll
    for (int u = 0; u < 8; u++) {
        const uint4& qj = q[u >> 1];
        const u32 wa = (u & 1) ? qj.z : qj.x, wb = (u & 1) ? qj.w : qj.y;
        const u32 sw_a = (u >> 1) == 0 ? sa.x : (u >> 1) == 1 ? sa.y : (u >> 1) == 2 ? sa.z : sa.w;
        const u32 sw_b = (u >> 1) == 0 ? sb.x : (u >> 1) == 1 ? sb.y : (u >> 1) == 2 ? sb.z : sb.w;
        const int sh = 16 * (u & 1);
        WSub A, B;
        A.lo = wa & 0x0F0F0F0Fu;
        A.hi = (wa >> 4) & 0x0F0F0F0Fu;
        A.d = ad * (float)((sw_a >> sh) & 0xFFu);
        A.m = -(am * (float)((sw_a >> (sh + 8)) & 0xFFu));
        A.d2 = 0.0f;
        B.lo = wb & 0x0F0F0F0Fu;
        B.hi = (wb >> 4) & 0x0F0F0F0Fu;
        B.d = bd * (float)((sw_b >> sh) & 0xFFu);
        B.m = -(bm * (float)((sw_b >> (sh + 8)) & 0xFFu));
        B.d2 = 0.0f;
#pragma unroll
        for (int ti = 0; ti < NT; ti++) mma_tile_step<FMT_Q4_K>(A, B, a, r0 + 8 * ti, MMA_SUBS * k + u, g, t, acc[ti]);
    }
}

// One Q6_K super-block (chunk c), as mmap_sup_q4k.
template <int NT>
__device__ __forceinline__ void mmap_sup_q6k(const u8* c, const MatArgs& a, int r0, int k, int g, int t, int lane,
                                             float (*acc)[4]) {
    uint4 q[4], hi[2];
#pragma unroll
    for (int j = 0; j < 4; j++) q[j] = __ldg((const uint4*)(c + 512 * j + 16 * lane));
#pragma unroll
    for (int j = 0; j < 2; j++) hi[j] = __ldg((const uint4*)(c + 2048 + 512 * j + 16 * lane));
    const uint4 sa = __ldg((const uint4*)(c + 3072 + 16 * g)), sb = __ldg((const uint4*)(c + 3072 + 16 * (g + 8)));
    const float ad = h2f(ld16(c + 3328 + 2 * g)), bd = h2f(ld16(c + 3328 + 2 * (g + 8)));
#pragma unroll
    for (int u = 0; u < 8; u++) {
        const uint4& qj = q[u >> 1];
        const uint4& hj = hi[u >> 2];
        const u32 na = (u & 1) ? qj.z : qj.x, nb = (u & 1) ? qj.w : qj.y;
        const u32 h = (u & 3) == 0 ? hj.x : (u & 3) == 1 ? hj.y : (u & 3) == 2 ? hj.z : hj.w;
        const u32 sw_a = (u >> 1) == 0 ? sa.x : (u >> 1) == 1 ? sa.y : (u >> 1) == 2 ? sa.z : sa.w;
        const u32 sw_b = (u >> 1) == 0 ? sb.x : (u >> 1) == 1 ? sb.y : (u >> 1) == 2 ? sb.z : sb.w;
        const int sh = 16 * (u & 1);
        WSub A, B;
        A.lo = q6_signed((na & 0x0F0F0F0Fu) | ((h & 0x03030303u) << 4));
        A.hi = q6_signed(((na >> 4) & 0x0F0F0F0Fu) | (((h >> 2) & 0x03030303u) << 4));
        B.lo = q6_signed((nb & 0x0F0F0F0Fu) | (((h >> 4) & 0x03030303u) << 4));
        B.hi = q6_signed(((nb >> 4) & 0x0F0F0F0Fu) | (((h >> 6) & 0x03030303u) << 4));
        A.d = ad * (float)(int)(i8)((sw_a >> sh) & 0xFFu);
        A.d2 = ad * (float)(int)(i8)((sw_a >> (sh + 8)) & 0xFFu);
        B.d = bd * (float)(int)(i8)((sw_b >> sh) & 0xFFu);
        B.d2 = bd * (float)(int)(i8)((sw_b >> (sh + 8)) & 0xFFu);
        A.m = 0.0f;
        B.m = 0.0f;
#pragma unroll
        for (int ti = 0; ti < NT; ti++) mma_tile_step<FMT_Q6_K>(A, B, a, r0 + 8 * ti, MMA_SUBS * k + u, g, t, acc[ti]);
    }
}

// Grid: one block per tile of 16 weight rows (over the segments, in order, every segment of
// format FMT with its packed copy in `packed`), `split` warps a block.
template <int NT, int FMT>
__device__ __forceinline__ void mmap_body(const MatArgs& a) {
    __shared__ float mmap_part[MMA_MAX_SPLIT * 4 * 32];
    __shared__ u64 block_best[MATVEC_MAX_ROWS];
    const int split = a.split;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    int tile = blockIdx.x, si = 0;
    while (si < a.nseg - 1 && tile >= (a.seg[si].rows + 15) / 16) { tile -= (a.seg[si].rows + 15) / 16; si++; }
    const MatSeg& s = a.seg[si];
    const int nsup = a.cols / 256;
    const int k0 = warp * nsup / split, k1 = (warp + 1) * nsup / split;
    const int chunk = FMT == FMT_Q4_K ? PK_Q4K_CHUNK : PK_Q6K_CHUNK;
    const u8* base = s.packed + (size_t)tile * nsup * chunk;
    // This warp's chunks into L2 before the wait: weights are never written.
    for (int o = 128 * lane; o < (k1 - k0) * chunk; o += 32 * 128) mmap_prefetch(base + (size_t)k0 * chunk + o);
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
            if (FMT == FMT_Q4_K) mmap_sup_q4k<NT>(base + (size_t)k * chunk, a, r0, k, g, t, lane, acc);
            else mmap_sup_q6k<NT>(base + (size_t)k * chunk, a, r0, k, g, t, lane, acc);
        }
        mma_store<NT>(acc, mmap_part, a, s, r0, row0, row1, best ? block_best : nullptr);
        r0 += 8 * NT;
        if (r0 >= a.n) break;
        __syncthreads();  // warp 0 is done with mmap_part
    }
    if (best) {
        __syncthreads();
        for (int r = threadIdx.x; r < a.n; r += blockDim.x)
            if (block_best[r]) atomicMax(a.seg[0].best + r, block_best[r]);
    }
}

extern "C" __global__ void __launch_bounds__(512, 2) mmap_q4k_1(MatArgs a) { mmap_body<1, FMT_Q4_K>(a); }
extern "C" __global__ void __launch_bounds__(512, 2) mmap_q4k_2(MatArgs a) { mmap_body<2, FMT_Q4_K>(a); }
extern "C" __global__ void __launch_bounds__(512) mmap_q4k_4(MatArgs a) { mmap_body<4, FMT_Q4_K>(a); }
extern "C" __global__ void __launch_bounds__(512) mmap_q4k_8(MatArgs a) { mmap_body<8, FMT_Q4_K>(a); }
extern "C" __global__ void __launch_bounds__(512, 2) mmap_q6k_1(MatArgs a) { mmap_body<1, FMT_Q6_K>(a); }
extern "C" __global__ void __launch_bounds__(512, 2) mmap_q6k_2(MatArgs a) { mmap_body<2, FMT_Q6_K>(a); }
extern "C" __global__ void __launch_bounds__(512) mmap_q6k_4(MatArgs a) { mmap_body<4, FMT_Q6_K>(a); }
extern "C" __global__ void __launch_bounds__(512) mmap_q6k_8(MatArgs a) { mmap_body<8, FMT_Q6_K>(a); }
// The two-tile kernels without the two-blocks-a-multiprocessor bound (108 registers, no spills;
// the default, KASOKU_CUDA_PACKED_WIDE=0 takes mmap_*_2): the same code, so the same bits.
extern "C" __global__ void __launch_bounds__(512) mmap_q4k_2w(MatArgs a) { mmap_body<2, FMT_Q4_K>(a); }
extern "C" __global__ void __launch_bounds__(512) mmap_q6k_2w(MatArgs a) { mmap_body<2, FMT_Q6_K>(a); }
