// Prefill products on f16 tensor cores: y[n][rows] (+)= x[n][cols] · W[rows][cols]ᵀ (+ bias)
// for passes of many activation rows (more than a verified tree's), where the weights are
// worth expanding once per pass instead of being re-read per 8-row tile as matvec.cu does.
//
// Two kernels per product (one to three matrices of one width, e.g. q|k|v or gate|up):
//
// - `gemm_prepare` expands the matrices' GGUF blocks into one f16 scratch W16[Σ rows][cols]
//   (the segments one after another) and converts the f32 activations into f16 X16[n][cols].
//   One thread per unit: 32 values of a row for block formats (a block, or a sub-block of a
//   K-quant super-block), 8 for float formats; each writes its halves with 16-byte stores.
// - `gemm_<BM>x<BN>` multiplies them: a block computes a BM×BN tile of y (BM activation
//   rows × BN weight rows) with mma.sync m16n8k16 (f16 in, f32 accumulate), the K dimension
//   in slices of GEMM_BK staged into shared memory by cp.async, several stages so that the
//   next slices load while this one is multiplied; fragments come out of shared memory through
//   ldmatrix (rows padded by 8 halves: conflict-free). Partial tiles load zeros (cp.async
//   with a source size of 0) and store nothing. The epilogue adds the bias and, for residual
//   products, the output's old value, per segment.
// - Products with too few tiles to fill the GPU (o and down: 1536 rows at 512 activation
//   rows) split K over `splits` blocks per tile (gridDim.z): each writes its partial sums to
//   a workspace, and `gemm_reduce` adds them in split order and applies the epilogue.
//
// Results depend on f16 rounding of both operands and are NOT batch-invariant with
// matvec.cu's: this path is for prefill only, whose rows no verification compares.
// Deterministic (no atomics, fixed K order): the same pass gives the same bits every run.

#define GEMM_BK 32
// Halves of padding per shared-memory row (ldmatrix's 8 rows then hit distinct banks).
#define GEMM_PAD 8
#define GEMM_LDS (GEMM_BK + GEMM_PAD)

// One matrix of a prefill product: where its rows of the output go.
struct GemmOut {
    float* y;           // y[r * ldy + j]
    const float* bias;  // or null
    int rows;
    int ldy;
    int accumulate;     // 1: y += result (residual epilogue)
    int pad_;
};

struct GemmArgs {
    GemmOut out[3];
    const u16* w;  // f16 [rows][cols]: the segments' rows one after another
    const u16* x;  // f16 [n][cols]
    float* part;   // splits > 1: partial sums [splits][n][rows]
    int nseg;
    int rows;      // Σ segment rows
    int cols;      // a multiple of 8
    int n;
    int splits;    // blocks per tile along K (gridDim.z)
    int kper;      // K slices (GEMM_BK) per split
};

// One matrix to expand into the scratch.
struct DequantSeg {
    const u8* w;
    long long row_bytes;
    int fmt;
    int rows;
};

struct PrepArgs {
    DequantSeg seg[3];
    u16* w16;           // [Σ rows][cols]
    const float* x;     // x[r * ldx + c]
    u16* x16;           // [n][cols]
    long long w_units;  // units of the weights (Σ rows × units per row)
    long long x_units;  // n × cols / 8
    int nseg;
    int cols;
    int ldx;
    int w_blocks;       // blocks of the grid on the weights; the rest convert activations
};

// The layouts kernels/gemm.rs builds (its tests assert the same numbers).
static_assert(sizeof(GemmOut) == 32 && sizeof(GemmArgs) == 144, "GemmArgs layout");
static_assert(sizeof(DequantSeg) == 24 && sizeof(PrepArgs) == 128, "PrepArgs layout");

__device__ __forceinline__ bool gemm_is_float(int fmt) {
    return fmt == FMT_F32 || fmt == FMT_F16 || fmt == FMT_BF16;
}

__device__ __forceinline__ u32 pack_h2(float lo, float hi) {
    return (u32)f2h(lo) | ((u32)f2h(hi) << 16);
}

// f32 to f16 for activations: clamped to the largest finite half, so an outlier saturates
// instead of becoming an infinity (and NaNs downstream); a NaN stays a NaN.
__device__ __forceinline__ float clamp_half(float v) {
    return fabsf(v) > 65504.0f ? copysignf(65504.0f, v) : v;
}

// 32 values as halves at `out` (64 bytes, 16-aligned).
__device__ __forceinline__ void store_halves32(u16* out, const float* v) {
    uint4* o = (uint4*)out;
#pragma unroll
    for (int i = 0; i < 4; i++)
        o[i] = make_uint4(pack_h2(v[8 * i], v[8 * i + 1]), pack_h2(v[8 * i + 2], v[8 * i + 3]),
                          pack_h2(v[8 * i + 4], v[8 * i + 5]), pack_h2(v[8 * i + 6], v[8 * i + 7]));
}

// The 32 values of block-format unit u of `row` (a 32-value block of the legacy formats; a
// 32-value sub-block of a K-quant super-block), as dequant_one computes them, stored as halves
// at `out` (each format its own values array, so that all stay in registers).
__device__ __forceinline__ void dequant_unit32(const u8* row, int fmt, int u, u16* out) {
    float v[32];
    switch (fmt) {
    case FMT_Q4_0: {
        const u8* b = row + u * 18; float d = h2f(ld16(b));
#pragma unroll
        for (int i = 0; i < 16; i++) {
            int q = b[2 + i];
            v[i] = d * (float)((q & 15) - 8);
            v[i + 16] = d * (float)((q >> 4) - 8);
        }
        store_halves32(out, v);
        break;
    }
    case FMT_Q4_1: {
        const u8* b = row + u * 20; float d = h2f(ld16(b)), m = h2f(ld16(b + 2));
#pragma unroll
        for (int i = 0; i < 16; i++) {
            int q = b[4 + i];
            v[i] = fmaf(d, (float)(q & 15), m);
            v[i + 16] = fmaf(d, (float)(q >> 4), m);
        }
        store_halves32(out, v);
        break;
    }
    case FMT_Q5_0: {
        const u8* b = row + u * 22; float d = h2f(ld16(b));
        u32 qh = (u32)ld16(b + 2) | ((u32)ld16(b + 4) << 16);
#pragma unroll
        for (int i = 0; i < 16; i++) {
            int q = b[6 + i];
            // (int): the high bit comes from an unsigned word, and q − 16 must not wrap.
            v[i] = d * (float)((int)((q & 15) | (((qh >> i) & 1) << 4)) - 16);
            v[i + 16] = d * (float)((int)((q >> 4) | (((qh >> (i + 16)) & 1) << 4)) - 16);
        }
        store_halves32(out, v);
        break;
    }
    case FMT_Q5_1: {
        const u8* b = row + u * 24; float d = h2f(ld16(b)), m = h2f(ld16(b + 2));
        u32 qh = (u32)ld16(b + 4) | ((u32)ld16(b + 6) << 16);
#pragma unroll
        for (int i = 0; i < 16; i++) {
            int q = b[8 + i];
            v[i] = fmaf(d, (float)(int)((q & 15) | (((qh >> i) & 1) << 4)), m);
            v[i + 16] = fmaf(d, (float)(int)((q >> 4) | (((qh >> (i + 16)) & 1) << 4)), m);
        }
        store_halves32(out, v);
        break;
    }
    case FMT_Q8_0: {
        const u8* b = row + u * 34; float d = h2f(ld16(b));
#pragma unroll
        for (int i = 0; i < 32; i++) v[i] = d * (float)(i8)b[2 + i];
        store_halves32(out, v);
        break;
    }
    case FMT_Q4_K:
    case FMT_Q5_K: {
        bool five = fmt == FMT_Q5_K;
        const u8* b = row + (u / 8) * (five ? 176 : 144);
        int sub = u % 8, j = sub / 2, hi = sub & 1;
        float sc, m;
        scale_min_k4(sub, b + 4, &sc, &m);
        float d = h2f(ld16(b)) * sc, dm = h2f(ld16(b + 2)) * m;
        const u8* qs = b + (five ? 48 : 16) + 32 * j;
#pragma unroll
        for (int l = 0; l < 32; l++) {
            int q = hi ? (qs[l] >> 4) : (qs[l] & 15);
            if (five) q += ((b[16 + l] >> sub) & 1) << 4;
            v[l] = d * (float)q - dm;
        }
        store_halves32(out, v);
        break;
    }
    case FMT_Q6_K: {
        const u8* b = row + (u / 8) * 210;
        int sub = u % 8, h = sub / 4, quarter = sub % 4;
        const u8* ql = b + 64 * h + (quarter & 1 ? 32 : 0);
        const u8* qh = b + 128 + 32 * h;
        float d = h2f(ld16(b + 208));
        float s0 = d * (float)(i8)b[192 + 8 * h + 2 * quarter];
        float s1 = d * (float)(i8)b[192 + 8 * h + 2 * quarter + 1];
#pragma unroll
        for (int l = 0; l < 32; l++) {
            int lo = quarter >= 2 ? (ql[l] >> 4) : (ql[l] & 15);
            int q = (lo | (((qh[l] >> (2 * quarter)) & 3) << 4)) - 32;
            v[l] = (l < 16 ? s0 : s1) * (float)q;
        }
        store_halves32(out, v);
        break;
    }
    }
}

// Float-format unit u of `row`: 8 values as 8 halves (one 16-byte store).
__device__ __forceinline__ uint4 float_unit8(const u8* row, int fmt, int u) {
    if (fmt == FMT_F16) return __ldg((const uint4*)(row + 16 * u));
    float v[8];
    if (fmt == FMT_F32) {
        float4 a = __ldg((const float4*)(row + 32 * u)), b = __ldg((const float4*)(row + 32 * u + 16));
        v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
    } else {
        uint4 r = __ldg((const uint4*)(row + 16 * u));
        u32 w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            v[2 * i] = bf2f((u16)(w[i] & 0xffff));
            v[2 * i + 1] = bf2f((u16)(w[i] >> 16));
        }
    }
    return make_uint4(pack_h2(v[0], v[1]), pack_h2(v[2], v[3]), pack_h2(v[4], v[5]), pack_h2(v[6], v[7]));
}

extern "C" __global__ void __launch_bounds__(256) gemm_prepare(PrepArgs a) {
    wait_for_predecessor();
    if ((int)blockIdx.x < a.w_blocks) {
        long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
        if (t >= a.w_units) return;
        // The segment, row and unit of t (unrolled: the segments stay in parameter space).
        long long row0 = 0;
        bool found = false;
        DequantSeg sg;
#pragma unroll
        for (int i = 0; i < 3; i++) {
            if (!found && i < a.nseg) {
                int upr = gemm_is_float(a.seg[i].fmt) ? a.cols / 8 : a.cols / 32;
                long long units = (long long)a.seg[i].rows * upr;
                if (t < units) {
                    sg = a.seg[i];
                    found = true;
                } else {
                    t -= units;
                    row0 += a.seg[i].rows;
                }
            }
        }
        if (!found) return;
        bool is_float = gemm_is_float(sg.fmt);
        int upr = is_float ? a.cols / 8 : a.cols / 32;
        int r = (int)(t / upr), u = (int)(t % upr);
        const u8* row = sg.w + (size_t)r * sg.row_bytes;
        u16* out = a.w16 + (size_t)(row0 + r) * a.cols;
        if (is_float) {
            *(uint4*)(out + 8 * u) = float_unit8(row, sg.fmt, u);
            return;
        }
        dequant_unit32(row, sg.fmt, u, out + 32 * u);
    } else {
        long long t = (long long)(blockIdx.x - a.w_blocks) * blockDim.x + threadIdx.x;
        if (t >= a.x_units) return;
        int upr = a.cols / 8;
        int r = (int)(t / upr), u = (int)(t % upr);
        const float4* src = (const float4*)(a.x + (size_t)r * a.ldx + 8 * u);
        float4 p = src[0], q = src[1];
        *(uint4*)(a.x16 + (size_t)r * a.cols + 8 * u) = make_uint4(
            pack_h2(clamp_half(p.x), clamp_half(p.y)), pack_h2(clamp_half(p.z), clamp_half(p.w)),
            pack_h2(clamp_half(q.x), clamp_half(q.y)), pack_h2(clamp_half(q.z), clamp_half(q.w)));
    }
}

__device__ __forceinline__ u32 smem_addr(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// 16 bytes from global to shared memory, asynchronously; zeros when !valid (`src` must still
// be a mapped address).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(valid ? 16 : 0));
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;" ::);
#endif
}

template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;" ::"n"(N));
#endif
}

__device__ __forceinline__ void ldmatrix_x4(u32* r, const u16* p) {
#if __CUDA_ARCH__ >= 800
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
#endif
}

__device__ __forceinline__ void mma_f16(float* c, const u32* a, u32 b0, u32 b1) {
#if __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    __trap();
#endif
}

// Output (r, j) of the product (j over the segments' rows one after another).
__device__ __forceinline__ void gemm_store(const GemmArgs& a, int r, int j, float v) {
    if (r >= a.n || j >= a.rows) return;
    float* y;
    const float* bias;
    int ldy, acc;
    if (j < a.out[0].rows) {
        y = a.out[0].y; bias = a.out[0].bias; ldy = a.out[0].ldy; acc = a.out[0].accumulate;
    } else if (j - a.out[0].rows < a.out[1].rows) {
        j -= a.out[0].rows;
        y = a.out[1].y; bias = a.out[1].bias; ldy = a.out[1].ldy; acc = a.out[1].accumulate;
    } else {
        j -= a.out[0].rows + a.out[1].rows;
        y = a.out[2].y; bias = a.out[2].bias; ldy = a.out[2].ldy; acc = a.out[2].accumulate;
    }
    float* p = y + (size_t)r * ldy + j;
    if (bias) v += bias[j];
    if (acc) v += *p;
    *p = v;
}

// One BM×BN tile of y: WARPS_M × WARPS_N warps, each a (BM/WARPS_M) × (BN/WARPS_N) sub-tile
// of m16n8 products; STAGES slices of K in shared memory, STAGES − 1 loading while one is
// multiplied.
template <int BM, int BN, int WARPS_M, int WARPS_N, int STAGES>
__device__ __forceinline__ void gemm_tile(const GemmArgs& a) {
    constexpr int THREADS = WARPS_M * WARPS_N * 32;
    constexpr int WTM = BM / WARPS_M, WTN = BN / WARPS_N;
    constexpr int MI = WTM / 16, NI = WTN / 8;
    static_assert(NI % 2 == 0, "B fragments load two n8 blocks at a time");
    static_assert(STAGES >= 2 && STAGES * (BM + BN) * GEMM_LDS * 2 <= 48 * 1024, "static shared memory");
    __shared__ __align__(16) u16 sa[STAGES][BM * GEMM_LDS];
    __shared__ __align__(16) u16 sb[STAGES][BN * GEMM_LDS];
    wait_for_predecessor();
    const int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp / WARPS_N, wn = warp % WARPS_N;
    float acc[MI][NI][4];
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
        for (int j = 0; j < NI; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.0f;
    // This block's K slices: split blockIdx.z's share.
    const int kbegin = blockIdx.z * a.kper;
    const int kend = min((a.cols + GEMM_BK - 1) / GEMM_BK, kbegin + a.kper);
    // Slice kt of the activations' and the weights' tiles into stage `st`: 16-byte chunks
    // (8 halves), GEMM_BK / 8 per row.
    auto load = [&](int st, int kt) {
        const int k0 = kt * GEMM_BK;
#pragma unroll
        for (int c = tid; c < BM * (GEMM_BK / 8); c += THREADS) {
            int r = c / (GEMM_BK / 8), kc = (c % (GEMM_BK / 8)) * 8;
            int gr = m0 + r, gk = k0 + kc;
            bool ok = gr < a.n && gk < a.cols;
            cp_async16(&sa[st][r * GEMM_LDS + kc], ok ? a.x + (size_t)gr * a.cols + gk : a.x, ok);
        }
#pragma unroll
        for (int c = tid; c < BN * (GEMM_BK / 8); c += THREADS) {
            int r = c / (GEMM_BK / 8), kc = (c % (GEMM_BK / 8)) * 8;
            int gr = n0 + r, gk = k0 + kc;
            bool ok = gr < a.rows && gk < a.cols;
            cp_async16(&sb[st][r * GEMM_LDS + kc], ok ? a.w + (size_t)gr * a.cols + gk : a.w, ok);
        }
    };
    // The first STAGES − 1 slices in flight (one commit group each, empty past the end).
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (kbegin + s < kend) load(s, kbegin + s);
        cp_async_commit();
    }
    for (int kt = kbegin; kt < kend; kt++) {
        // Slice kt has landed once at most STAGES − 2 groups are pending; the barrier also
        // tells every warp is done with the stage the next load overwrites (slice kt − 1's).
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        const int next = kt + STAGES - 1;
        if (next < kend) load((next - kbegin) % STAGES, next);
        cp_async_commit();
        const int st = (kt - kbegin) % STAGES;
        const u16* A = sa[st];
        const u16* B = sb[st];
#pragma unroll
        for (int kk = 0; kk < GEMM_BK; kk += 16) {
            u32 af[MI][4], bf[NI][2];
#pragma unroll
            for (int i = 0; i < MI; i++) {
                int r = wm * WTM + i * 16 + (lane & 15), k = kk + (lane >> 4) * 8;
                ldmatrix_x4(af[i], &A[r * GEMM_LDS + k]);
            }
#pragma unroll
            for (int j = 0; j < NI; j += 2) {
                int r = wn * WTN + j * 8 + (lane & 7) + ((lane >> 4) << 3);
                int k = kk + ((lane >> 3) & 1) * 8;
                u32 t[4];
                ldmatrix_x4(t, &B[r * GEMM_LDS + k]);
                bf[j][0] = t[0]; bf[j][1] = t[1]; bf[j + 1][0] = t[2]; bf[j + 1][1] = t[3];
            }
#pragma unroll
            for (int i = 0; i < MI; i++)
#pragma unroll
                for (int j = 0; j < NI; j++) mma_f16(acc[i][j], af[i], bf[j][0], bf[j][1]);
        }
    }
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
        for (int j = 0; j < NI; j++) {
            int r = m0 + wm * WTM + i * 16 + (lane >> 2);
            int c = n0 + wn * WTN + j * 8 + (lane & 3) * 2;
            if (a.splits > 1) {
                float* part = a.part + (size_t)blockIdx.z * a.n * a.rows;
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int rr = r + (e >> 1) * 8, cc = c + (e & 1);
                    if (rr < a.n && cc < a.rows) part[(size_t)rr * a.rows + cc] = acc[i][j][e];
                }
            } else {
                gemm_store(a, r, c, acc[i][j][0]);
                gemm_store(a, r, c + 1, acc[i][j][1]);
                gemm_store(a, r + 8, c, acc[i][j][2]);
                gemm_store(a, r + 8, c + 1, acc[i][j][3]);
            }
        }
}

// The split products' partial sums added in split order (the same bits every run), then the
// epilogue: one thread per output.
extern "C" __global__ void __launch_bounds__(256) gemm_reduce(GemmArgs a) {
    wait_for_predecessor();
    long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long total = (long long)a.n * a.rows;
    if (t >= total) return;
    float v = a.part[t];
    for (int z = 1; z < a.splits; z++) v += a.part[(size_t)z * total + t];
    gemm_store(a, (int)(t / a.rows), (int)(t % a.rows), v);
}

// Large products: 128 activation rows × 128 weight rows per block, 8 warps of 64×32, two
// stages (40 KiB: static shared memory holds no third).
extern "C" __global__ void __launch_bounds__(256) gemm_128x128(GemmArgs a) {
    gemm_tile<128, 128, 2, 4, 2>(a);
}

// Products too small to fill the GPU with 128×128 tiles: 64×64 per block, 4 warps of 32×32,
// four stages (40 KiB), the deeper pipeline for blocks of fewer warps.
extern "C" __global__ void __launch_bounds__(128) gemm_64x64(GemmArgs a) {
    gemm_tile<64, 64, 2, 2, 4>(a);
}
