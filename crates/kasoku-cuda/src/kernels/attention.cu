// Attention of the batch's rows over the f16 KV cache, split over the keys (flash-decoding):
// `attn_partial` computes, per (row, query head, chunk of ATT_CHUNK key positions), the chunk's
// max score, exp-sum and weighted values; the last chunk of a (row, head) to finish combines
// them in order (`attn_merge_row`). `attn_group` (below; opt-in with KASOKU_CUDA_ATTN=1)
// computes the same function per (row, KV head, chunk) for all the group's
// query heads at once, with fewer dependent rounds per chunk. `attn_rows` (below; opt-in with
// KASOKU_CUDA_ATTN_ROWS=N) runs attn_partial's own chunk step and merge for N rows a block,
// reading a chunk of committed keys once for all of them: attn_partial's bits.
//
// A row sees a sequence of "virtual positions" 0..=pos: the committed slots 0..past, then (a
// chain) slots past.. in order, or (a tree node) the slots of its path from the root down, so
// virtual position v holds the key plain decoding of that path would have at position v.
// Chunks are fixed ranges of virtual positions, so a row's arithmetic depends only on what it
// sees: a tree node gets the bits plain decoding of its path gets.

#define ATT_CHUNK 64

__device__ __forceinline__ int att_slot(const Batch* b, const int* path, int i, int v) {
    if (v < b->past || b->is_chain) return v;
    return b->past + path[i * (b->max_depth + 1) + (v - b->past)];
}

// The q/k/v epilogue fused into a decode step's attention (one chain row; `on` 0: off, q is
// already rotated and the new key and value are in the cache). Then each block rotates its
// own query head from the raw projection, and the block whose chunk holds the new position
// computes that position's key and value itself (the bits qkv_post would have written: the
// same head_post, rounded to f16), uses them from shared memory, and, for the first query
// head of each KV group, writes them to the cache. No block of the pass reads that slot from
// the cache, so the write races with nothing.
struct PostArgs {
    const float* k;
    const float* v;
    const float* inv_freq;
    const float* q_norm;
    const float* k_norm;
    int kv_ld;
    int rot_dim;
    int interleaved;
    float eps;
    int on;
    int pad;
};

// out[i][h] = Σ_c e^(m_c − M) o_c / Σ_c e^(m_c − M) l_c over the row's `nc` chunks, in order,
// by one block of 128 threads (`res`: 256 floats of shared memory). With xq/xs, also the int8
// activations of the row's head (head_dim a multiple of 32).
__device__ void attn_merge_row(
    const float* part_ml, const float* part_o, int chunks, int n_heads, int head_dim, int nc,
    int i, int h, float* out, int out_ld, i8* xq, float4* xs, float* res) {
    const float* ml = part_ml + (size_t)(i * n_heads + h) * chunks * 2;
    const float* po = part_o + (size_t)(i * n_heads + h) * chunks * head_dim;
    // The loops unrolled, so each round of partials' loads is issued together.
    float mx = -KINF;
#pragma unroll 8
    for (int c = 0; c < nc; c++) mx = fmaxf(mx, __ldcg(ml + 2 * c));
    float l = 0.0f;
#pragma unroll 8
    for (int c = 0; c < nc; c++) l = fmaf(expf(__ldcg(ml + 2 * c) - mx), __ldcg(ml + 2 * c + 1), l);
    float inv = 1.0f / l;
    __syncthreads();
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float acc = 0.0f;
#pragma unroll 8
        for (int c = 0; c < nc; c++) acc = fmaf(expf(__ldcg(ml + 2 * c) - mx), __ldcg(po + (size_t)c * head_dim + d), acc);
        float v = acc * inv;
        out[(size_t)i * out_ld + h * head_dim + d] = v;
        res[d] = v;
    }
    if (xq) {
        __syncthreads();
        int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
        for (int b = warp; b < head_dim / 32; b += blockDim.x >> 5) {
            size_t at = (size_t)i * out_ld + h * head_dim + 32 * b;
            quant_block32(res[32 * b + lane], xq + at, xs + at / 32);
        }
    }
}

// Whether this block is the last of `working` blocks to finish a (row, head) that counts its
// arrivals in `*count` (every thread calling; `last` one int of shared memory): each block's
// partials published first (fence), the last resets the count for the next pass and fences
// again before it reads the others' partials (past L1, which their writes do not reach).
__device__ __forceinline__ bool last_to_arrive(int* count, int working, int* last) {
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        *last = atomicAdd(count, 1) == working - 1;
        if (*last) *count = 0;
    }
    __syncthreads();
    if (!*last) return false;
    __threadfence();
    return true;
}

// Grid (n, n_heads, blocks), block 128 (4 warps): block z takes chunks z, z + blocks, ... of
// the row (so a pass launches blocks by the cache's length, not its capacity). Partials:
// [row][head][chunk] (m, l) and [row][head][chunk][head_dim] (weighted values).
//
// A chunk's 64 keys are split over the 4 warps, 16 each; a key's row over L lanes (L =
// head_dim / 8 rounded up to a power of two, 4..32), each holding 8 values from one 16-byte
// load, so a warp covers 32 / L keys per step. Every key and value load of the chunk is
// issued before any arithmetic and unconditionally (a key past the row's end reads the
// chunk's first slot and is replaced by zeros, a lane past the head reads its row's first
// vector), because a load behind a branch waits for the one before it: the kernel this
// replaces paid a memory latency per key vector, 14 us a chunk on an H100. The first chunk's
// loads are in flight while the query is read and rotated.
//
// The arithmetic, in an order fixed by head_dim and the row's own length: a score is each
// lane's 8 products in order, then a butterfly over the L lanes; the chunk's max is exact;
// its weights e^(s − m), summed per lane over its keys in order, then a butterfly over the
// warp's key groups, then the 4 warps in order; the weighted values likewise (per lane over
// its keys, a butterfly over the groups, the 4 warps in order). So a tree node gets the bits
// plain decoding of its path gets, whatever the batch, grid or block that computes it.
#define ATTP_KPW (ATT_CHUNK / 4)

// Chunks of ATT_CHUNK virtual positions a row at position `pos` sees (0..=pos).
__device__ __forceinline__ int att_row_chunks(int pos) { return pos / ATT_CHUNK + 1; }

// The 8 f16 values of a 16-byte load, as floats (both decode kernels).
__device__ __forceinline__ void unpack_f16x8(uint4 raw, float* f) {
    u32 w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int z = 0; z < 4; z++) {
        f[2 * z] = h2f((u16)(w[z] & 0xffff));
        f[2 * z + 1] = h2f((u16)(w[z] >> 16));
    }
}

// Shared memory of attn_partial and attn_rows, passed to their bodies (one instantiation per L).
struct AttpShared {
    float* qs;    // [256] the query, then (one chunk) the output
    float* ks;    // [256] the fused epilogue's key
    u16* knew;    // [256] the new key and value (fused epilogue)
    u16* vnew;
    float* parts; // [4][256] each warp's weighted values
    float* red;   // [8] the warps' maxima and sums
    int* last;
};

// Row i's slots of the keys this thread scores in the chunk at virtual position v0 (nk keys
// of the row fall in it; -1 past them): the committed slots, then a tree row's path. Returns
// the chunk's first slot, which a lane reads in place of a missing key (so every load goes
// out unconditionally).
template <int L>
__device__ __forceinline__ int attp_slots(int past, int chain, int plen, const int* path, int i, int v0, int nk,
                                          int* slot) {
    constexpr int KPS = 32 / L, STEPS = ATTP_KPW / KPS;
    const int warp = threadIdx.x >> 5, g = (threadIdx.x & 31) / L;
    const int vfirst = (v0 < past || chain) ? v0 : past + path[i * plen + (v0 - past)];
#pragma unroll
    for (int s = 0; s < STEPS; s++) {
        int t = warp * ATTP_KPW + s * KPS + g, v = v0 + t;
        int node = path[chain ? 0 : i * plen + min(v > past ? v - past : 0, plen - 1)];
        slot[s] = t >= nk ? -1 : (v < past || chain) ? v : past + node;
    }
    return vfirst;
}

// This lane's 16-byte pieces of the keys and values at `slot` (vfirst for a missing one),
// every load issued before any is used.
template <int L>
__device__ __forceinline__ void attp_load(const u16* kc, const u16* vc, int head_dim, const int* slot, int vfirst,
                                          uint4* kraw, uint4* vraw) {
    constexpr int KPS = 32 / L, STEPS = ATTP_KPW / KPS;
    const int r = (threadIdx.x & 31) % L, rr = 8 * r < head_dim ? r : 0;
#pragma unroll
    for (int s = 0; s < STEPS; s++)
        kraw[s] = __ldg((const uint4*)(kc + (size_t)(slot[s] >= 0 ? slot[s] : vfirst) * head_dim) + rr);
#pragma unroll
    for (int s = 0; s < STEPS; s++)
        vraw[s] = __ldg((const uint4*)(vc + (size_t)(slot[s] >= 0 ? slot[s] : vfirst) * head_dim) + rr);
}

// One chunk of row i and query head h, from its keys and values in registers and the
// query's 8 values of this lane (qr), in the order the file comment gives: the chunk's max,
// exp-sum and weighted values into the partial buffers, or (`alone`: the row's only chunk)
// the output itself, which is also left in sm.qs. `fresh`: the virtual position whose key
// and value are in sm.knew/vnew (the fused epilogue), or -1. Ends with a barrier.
template <int L>
__device__ __forceinline__ void attp_chunk(uint4* kraw, uint4* vraw, const int* slot, const float* qr, int fresh,
                                           int v0, float scale, bool alone, int i, int h, int c, int n_heads,
                                           int chunks, int head_dim, float* part_ml, float* part_o, float* out,
                                           int out_ld, const AttpShared& sm) {
    constexpr int KPS = 32 / L, STEPS = ATTP_KPW / KPS;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane / L, r = lane % L;
    const bool act = 8 * r < head_dim;
    const int rr = act ? r : 0;
    // Keys past the row's end are zeros; the new key and value come from shared memory.
#pragma unroll
    for (int s = 0; s < STEPS; s++) {
        const int v = v0 + warp * ATTP_KPW + s * KPS + g;
        if (slot[s] < 0) {
            kraw[s] = make_uint4(0, 0, 0, 0);
            vraw[s] = make_uint4(0, 0, 0, 0);
        } else if (v == fresh) {
            kraw[s] = ((const uint4*)sm.knew)[rr];
            vraw[s] = ((const uint4*)sm.vnew)[rr];
        }
    }
    float sc[STEPS];
    float m = -KINF;
#pragma unroll
    for (int s = 0; s < STEPS; s++) {
        float kf[8];
        unpack_f16x8(kraw[s], kf);
        float a = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; j++) a = fmaf(qr[j], kf[j], a);
#pragma unroll
        for (int o = L / 2; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
        sc[s] = slot[s] >= 0 ? a * scale : -KINF;
        m = fmaxf(m, sc[s]);
    }
    m = warp_max(m);
    if (lane == 0) sm.red[warp] = m;
    __syncthreads();
    m = fmaxf(fmaxf(sm.red[0], sm.red[1]), fmaxf(sm.red[2], sm.red[3]));
    float l = 0.0f;
    float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int s = 0; s < STEPS; s++) {
        const float p = slot[s] >= 0 ? expf(sc[s] - m) : 0.0f;
        l += p;
        float vf[8];
        unpack_f16x8(vraw[s], vf);
#pragma unroll
        for (int j = 0; j < 8; j++) acc[j] = fmaf(p, vf[j], acc[j]);
    }
#pragma unroll
    for (int o = 16; o >= L; o >>= 1) {
        l += __shfl_xor_sync(0xffffffffu, l, o);
#pragma unroll
        for (int j = 0; j < 8; j++) acc[j] += __shfl_xor_sync(0xffffffffu, acc[j], o);
    }
    if (lane == 0) sm.red[4 + warp] = l;
    if (g == 0 && act) {
        float4* dst = (float4*)(sm.parts + warp * 256 + 8 * r);
        dst[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
        dst[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
    }
    __syncthreads();
    l = ((sm.red[4] + sm.red[5]) + sm.red[6]) + sm.red[7];
    if (!alone && tid == 0) {
        size_t at = ((size_t)(i * n_heads + h) * chunks + c) * 2;
        part_ml[at] = m;
        part_ml[at + 1] = l;
    }
    const float inv_l = 1.0f / l;
    float* o = part_o + ((size_t)(i * n_heads + h) * chunks + c) * head_dim;
    for (int d = tid; d < head_dim; d += blockDim.x) {
        float total = ((sm.parts[d] + sm.parts[256 + d]) + sm.parts[512 + d]) + sm.parts[768 + d];
        if (alone) {
            float v = total * inv_l;
            out[(size_t)i * out_ld + h * head_dim + d] = v;
            sm.qs[d] = v;
        } else {
            o[d] = total;
        }
    }
    __syncthreads();
}

// The int8 blocks of row i's head h from its output in sm.qs (written before a barrier).
__device__ __forceinline__ void attp_quantize(int i, int h, int head_dim, int out_ld, i8* xq, float4* xs,
                                              const AttpShared& sm) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int b = warp; b < head_dim / 32; b += blockDim.x >> 5) {
        size_t at = (size_t)i * out_ld + h * head_dim + 32 * b;
        quant_block32(sm.qs[32 * b + lane], xq + at, xs + at / 32);
    }
}

template <int L>
__device__ __forceinline__ void attn_partial_body(
    const float* q, int q_ld, u16* k_cache, u16* v_cache, int max_slots,
    int n_heads, int n_kv_heads, int head_dim, float scale,
    const Batch* batch, const int* pos, const int* path,
    float* part_ml, float* part_o, int chunks,
    int* arrivals, float* out, int out_ld, i8* xq, float4* xs, const PostArgs& post, AttpShared sm) {
    constexpr int KPS = 32 / L;           // keys a warp covers per step
    constexpr int STEPS = ATTP_KPW / KPS; // steps per warp per chunk
    const int tid = threadIdx.x;
    const int r = (tid & 31) % L;
    const bool act = 8 * r < head_dim;
    const int rr = act ? r : 0;
    const int i = blockIdx.x, h = blockIdx.y;
    const int seen = pos[i] + 1;
    const int nc = att_row_chunks(pos[i]);
    if ((int)blockIdx.z >= nc) return;
    const int kh = h / (n_heads / n_kv_heads);
    const u16* kc = k_cache + (size_t)kh * max_slots * head_dim;
    const u16* vc = v_cache + (size_t)kh * max_slots * head_dim;
    const int past = batch->past, chain = batch->is_chain, plen = batch->max_depth + 1;
    const bool alone = nc == 1;
    int fresh = -1;
    float qr[8];
    bool first = true;
    for (int c = blockIdx.z; c < nc; c += gridDim.z) {
        const int v0 = c * ATT_CHUNK;
        const int nk = min(ATT_CHUNK, seen - v0);
        int slot[STEPS];
        const int vfirst = attp_slots<L>(past, chain, plen, path, i, v0, nk, slot);
        uint4 kraw[STEPS], vraw[STEPS];
        attp_load<L>(kc, vc, head_dim, slot, vfirst, kraw, vraw);
        if (first) {
            // The query (with the fused epilogue: rotated here, and the new key and value
            // computed by the block whose chunks end the row), while the loads are in flight.
            first = false;
            for (int d = tid; d < head_dim; d += blockDim.x) sm.qs[d] = q[(size_t)i * q_ld + h * head_dim + d];
            if (post.on) {
                head_post(sm.qs, post.q_norm, post.eps, head_dim, post.rot_dim, post.interleaved, post.inv_freq, pos[i]);
                if ((int)blockIdx.z == (nc - 1) % (int)gridDim.z) {
                    fresh = seen - 1;
                    const float* kr = post.k + (size_t)i * post.kv_ld + kh * head_dim;
                    const float* vr = post.v + (size_t)i * post.kv_ld + kh * head_dim;
                    for (int d = tid; d < head_dim; d += blockDim.x) sm.ks[d] = kr[d];
                    head_post(sm.ks, post.k_norm, post.eps, head_dim, post.rot_dim, post.interleaved, post.inv_freq, pos[i]);
                    bool writer = h % (n_heads / n_kv_heads) == 0;
                    size_t at = ((size_t)kh * max_slots + past + i) * head_dim;
                    for (int d = tid; d < head_dim; d += blockDim.x) {
                        u16 kq = f2h(sm.ks[d]), vq = f2h(vr[d]);
                        sm.knew[d] = kq;
                        sm.vnew[d] = vq;
                        if (writer) {
                            k_cache[at + d] = kq;
                            v_cache[at + d] = vq;
                        }
                    }
                }
            }
            __syncthreads();
#pragma unroll
            for (int j = 0; j < 8; j++) qr[j] = act ? sm.qs[8 * rr + j] : 0.0f;
        }
        attp_chunk<L>(kraw, vraw, slot, qr, fresh, v0, scale, alone, i, h, c, n_heads, chunks, head_dim, part_ml,
                      part_o, out, out_ld, sm);
    }
    if (alone) {
        if (xq) attp_quantize(i, h, head_dim, out_ld, xq, xs, sm);
        return;
    }
    // The last of the row's blocks to finish merges them all (no second kernel).
    if (!last_to_arrive(arrivals + i * n_heads + h, min(nc, (int)gridDim.z), sm.last)) return;
    attn_merge_row(part_ml, part_o, chunks, n_heads, head_dim, nc, i, h, out, out_ld, xq, xs, sm.qs);
}

extern "C" __global__ void __launch_bounds__(128) attn_partial(
    const float* q, int q_ld, u16* k_cache, u16* v_cache, int max_slots,
    int n_heads, int n_kv_heads, int head_dim, float scale,
    const Batch* batch, const int* pos, const int* path,
    float* part_ml, float* part_o, int chunks,
    int* arrivals, float* out, int out_ld, i8* xq, float4* xs, PostArgs post) {
    wait_for_predecessor();
    __shared__ __align__(16) float qs[256];
    __shared__ float ks[256];
    __shared__ __align__(16) u16 knew[256];
    __shared__ __align__(16) u16 vnew[256];
    __shared__ __align__(16) float parts[4 * 256];
    __shared__ float red[8];
    __shared__ int last;
    AttpShared sm = {qs, ks, knew, vnew, parts, red, &last};
#define ATTP_RUN(L)                                                                                             \
    attn_partial_body<L>(q, q_ld, k_cache, v_cache, max_slots, n_heads, n_kv_heads, head_dim, scale, batch, pos, \
                         path, part_ml, part_o, chunks, arrivals, out, out_ld, xq, xs, post, sm)
    if (head_dim <= 32) ATTP_RUN(4);
    else if (head_dim <= 64) ATTP_RUN(8);
    else if (head_dim <= 128) ATTP_RUN(16);
    else ATTP_RUN(32);
#undef ATTP_RUN
}

// attn_rows: attn_partial for passes of several rows (a tree's or a chain's), with each
// block taking `rows` rows of one query head instead of one, so a chunk of committed keys
// and values is read once for all of them. Grid (ceil(n / rows), n_heads, blocks); block z
// takes chunks z, z + blocks, ... of every row of its group. Each row's chunk goes through
// attp_chunk with its query read as attn_partial reads it, and the merge is the same, so a
// row gets attn_partial's bits whatever its group: a verification pass keeps plain decoding's
// bits. A chunk wholly before the committed end (v0 + ATT_CHUNK <= past) holds the same
// slots for every row and is loaded once; the chunks holding a tree's nodes or the rows' own
// ends are loaded per row, as attn_partial loads them. No fused q/k/v epilogue (a decode
// step's one row runs attn_partial).
template <int L>
__device__ __forceinline__ void attn_rows_body(
    const float* q, int q_ld, const u16* k_cache, const u16* v_cache, int max_slots,
    int n_heads, int n_kv_heads, int head_dim, float scale,
    const Batch* batch, const int* pos, const int* path,
    float* part_ml, float* part_o, int chunks,
    int* arrivals, float* out, int out_ld, i8* xq, float4* xs, int n, int rows, AttpShared sm) {
    constexpr int KPS = 32 / L;
    constexpr int STEPS = ATTP_KPW / KPS;
    const int r = (threadIdx.x & 31) % L;
    const bool act = 8 * r < head_dim;
    const int rr = act ? r : 0;
    const int i0 = blockIdx.x * rows, i1 = min(n, i0 + rows), h = blockIdx.y;
    const int kh = h / (n_heads / n_kv_heads);
    const u16* kc = k_cache + (size_t)kh * max_slots * head_dim;
    const u16* vc = v_cache + (size_t)kh * max_slots * head_dim;
    const int past = batch->past, chain = batch->is_chain, plen = batch->max_depth + 1;
    int most = 0;  // chunks of the group's longest row
    for (int i = i0; i < i1; i++) {
        const int nc = att_row_chunks(pos[i]);
        if (nc > most) most = nc;
    }
    for (int c = blockIdx.z; c < most; c += gridDim.z) {
        const int v0 = c * ATT_CHUNK;
        const bool common = v0 + ATT_CHUNK <= past;
        int slot[STEPS];
        uint4 kraw[STEPS], vraw[STEPS];
        bool loaded = false;
        for (int i = i0; i < i1; i++) {
            const int seen = pos[i] + 1, nc = att_row_chunks(pos[i]);
            if (c >= nc) continue;
            if (!(common && loaded)) {
                const int vfirst = attp_slots<L>(past, chain, plen, path, i, v0, min(ATT_CHUNK, seen - v0), slot);
                attp_load<L>(kc, vc, head_dim, slot, vfirst, kraw, vraw);
                loaded = true;
            }
            float qr[8];
#pragma unroll
            for (int j = 0; j < 8; j++) qr[j] = act ? q[(size_t)i * q_ld + h * head_dim + 8 * rr + j] : 0.0f;
            attp_chunk<L>(kraw, vraw, slot, qr, -1, v0, scale, nc == 1, i, h, c, n_heads, chunks, head_dim, part_ml,
                          part_o, out, out_ld, sm);
            if (nc == 1 && xq) attp_quantize(i, h, head_dim, out_ld, xq, xs, sm);
        }
    }
    // Each row of several chunks: the last of its blocks to finish merges it.
    for (int i = i0; i < i1; i++) {
        const int nc = att_row_chunks(pos[i]);
        if (nc == 1 || (int)blockIdx.z >= nc) continue;
        if (last_to_arrive(arrivals + i * n_heads + h, min(nc, (int)gridDim.z), sm.last))
            attn_merge_row(part_ml, part_o, chunks, n_heads, head_dim, nc, i, h, out, out_ld, xq, xs, sm.qs);
    }
}

extern "C" __global__ void __launch_bounds__(128) attn_rows(
    const float* q, int q_ld, const u16* k_cache, const u16* v_cache, int max_slots,
    int n_heads, int n_kv_heads, int head_dim, float scale,
    const Batch* batch, const int* pos, const int* path,
    float* part_ml, float* part_o, int chunks,
    int* arrivals, float* out, int out_ld, i8* xq, float4* xs, int n, int rows) {
    wait_for_predecessor();
    __shared__ __align__(16) float qs[256];
    __shared__ __align__(16) float parts[4 * 256];
    __shared__ float red[8];
    __shared__ int last;
    AttpShared sm = {qs, nullptr, nullptr, nullptr, parts, red, &last};
#define ATTR_RUN(L)                                                                                                 \
    attn_rows_body<L>(q, q_ld, k_cache, v_cache, max_slots, n_heads, n_kv_heads, head_dim, scale, batch, pos, path, \
                      part_ml, part_o, chunks, arrivals, out, out_ld, xq, xs, n, rows, sm)
    if (head_dim <= 32) ATTR_RUN(4);
    else if (head_dim <= 64) ATTR_RUN(8);
    else if (head_dim <= 128) ATTR_RUN(16);
    else ATTR_RUN(32);
#undef ATTR_RUN
}


// ---------------------------------------------------------------------------------------------
// attn_group: the same function as attn_partial (opt-in with KASOKU_CUDA_ATTN=1), with one
// block per (row, KV head, split) for all the group's query heads, so K/V are read once per
// GQA group. It was written against an earlier attn_partial (a block per query head whose
// chunk took several dependent rounds); attn_partial now issues a chunk's loads together as
// this kernel does, and on an H100 (2026-12-06) this one is slower at one row: 62.5 against
// 24.0 us after 4,000 tokens, 29.9 against 7.4 after 512 (`kasoku-cuda-check attn`). It
// launches a sixth of the blocks on the 1.5B (2 per row and chunk), too few to fill the GPU,
// and spills registers. Its layout:
// - One block per (row, KV head, split) takes every query head of the group (up to
//   ATTG_HEADS; a larger group takes several blocks), so K/V are read once per group and the
//   fused epilogue computes the new key once per group and split.
// - A chunk (the same ATT_CHUNK virtual positions as attn_partial, so the same partials
//   buffers and merge geometry) is split over the 4 warps, 16 keys each; a key's row is split
//   over L lanes (L = head_dim / 8 rounded up to a power of two, 4..32), each holding 8 values
//   from one 16-byte load, so a warp scores 32 / L keys per step. Every K and V load of the
//   chunk is issued before any arithmetic (head_dim 256: two rounds of K), so a chunk costs
//   one memory round instead of attn_partial's three.
// - A score is each lane's 8 products in order, then a butterfly over the L lanes (xor
//   L/2 .. 1): every lane of the group gets the same bits (a + b == b + a). The chunk's max
//   and exp-sum per head are one warp's max and butterfly sum over its 64 scores; the weighted
//   values are each lane's running sums over its warp's keys (in order), then the 4 * 32 / L
//   partial sums added in order by the thread that owns (head, dim).
// - The merge of a multi-chunk row (the last block of the row's KV head to arrive, as in
//   attn_partial) computes per head the max and exp-sum of the chunks with a warp (lane c
//   takes chunks c, c + 32, ...), then each (head, dim) sums its chunks in order, 64 chunks'
//   weights at a time in shared memory.
// Every order above depends only on head_dim, the group's size and the row's own length
// (never on the batch, the row's index, the blocks launched or which block arrives last), so
// a tree node gets the bits plain decoding of its path gets, as with attn_partial (the two
// kernels' bits differ from each other; a process uses one).
//
// The fused epilogue (post.on): every block rotates (and normalizes) its query heads, a warp
// per head, with head_post's arithmetic in head_post's order (head_post_warp below: the
// 128-thread block's sum of squares reproduced lane by lane); RoPE's cos/sin are computed once
// per block (the same f64 sincos, rounded as head_post rounds them). The block whose split
// holds the new position also computes the new key and value (a warp), keeps them in shared
// memory for its chunk, and, for the group's first block of query heads, writes them to the
// cache; no block reads that slot from the cache, as in attn_partial.
//
// Grid (n, n_kv_heads * ceil(group / ATTG_HEADS), blocks), block 128. head_dim a multiple of
// 8, at most 256 (of 32 with xq/xs). Shared memory: 43 KB.

#define ATTG_HEADS 8
#define ATTG_WARPS 4
#define ATTG_KPW (ATT_CHUNK / ATTG_WARPS)
// Partial value sums of a chunk: (4 warps × 32 / L groups) × heads × head_dim ≤ 8192 floats.
#define ATTG_PARTS 8192

// head_post (ops.cu) by one warp, with its bits: the sum of squares of thread t of its
// 128-thread block (elements t, t + 128) for each of the 4 warps, each warp's butterfly, then
// the butterfly of the 4 warp sums (lanes 0..3, the rest 0.0); RoPE from the block's table
// (cos, sin of each pair, rounded to f32 as head_post rounds them).
__device__ void head_post_warp(float* s, const float* nw, float eps, int head_dim, int rot_dim, int interleaved,
                               const float* cs, const float* sn) {
    int lane = threadIdx.x & 31;
    __syncwarp();
    if (nw) {
        double y = 0.0;
        for (int w = 0; w < 4; w++) {
            double ss = 0.0;
            for (int d = 32 * w + lane; d < head_dim; d += 128) ss += (double)s[d] * (double)s[d];
            ss = warp_sum_d(ss);
            if (lane == w) y = ss;
        }
        double t = warp_sum_d(y);
        float scale = 1.0f / sqrtf((float)(t / head_dim) + eps);
        __syncwarp();
        for (int d = lane; d < head_dim; d += 32) s[d] = s[d] * scale * nw[d];
        __syncwarp();
    }
    int half = rot_dim / 2;
    for (int t = lane; t < half; t += 32) {
        float c = cs[t], sv = sn[t];
        int a = interleaved ? 2 * t : t, b = interleaved ? 2 * t + 1 : t + half;
        float x0 = s[a], x1 = s[b];
        s[a] = x0 * c - x1 * sv;
        s[b] = x1 * c + x0 * sv;
    }
    __syncwarp();
}

// Shared memory of attn_group, passed to its body (one instantiation per L would otherwise
// each have its own).
struct AttgShared {
    float* qs;    // [ATTG_HEADS][256] the queries, then (one chunk) the outputs
    float* parts; // [ATTG_PARTS] partial value sums; before the chunks, the epilogue's key and table
    float* sc;    // [ATTG_HEADS][ATT_CHUNK] scores, then weights
    u16* knew;    // [256] the new key and value (fused epilogue)
    u16* vnew;
    float* mrow;  // [ATTG_HEADS]
    float* lrow;  // [ATTG_HEADS]
    int* last;
};

template <int L>
__device__ __forceinline__ void attn_group_body(
    const float* q, int q_ld, u16* k_cache, u16* v_cache, int max_slots,
    int n_heads, int n_kv_heads, int head_dim, float scale,
    const Batch* batch, const int* pos, const int* path,
    float* part_ml, float* part_o, int chunks,
    int* arrivals, float* out, int out_ld, i8* xq, float4* xs, const PostArgs& post, AttgShared sm) {
    constexpr int KPS = 32 / L;              // keys a warp scores per step
    constexpr int STEPS = ATTG_KPW / KPS;    // steps per warp per chunk
    constexpr int BATCH = STEPS < 8 ? STEPS : 8;
    constexpr int P = ATTG_WARPS * KPS;      // partial value sums per chunk
    const int i = blockIdx.x;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane / L, r = lane % L;
    const bool act = 8 * r < head_dim;
    const int group = n_heads / n_kv_heads;
    const int tiles = (group + ATTG_HEADS - 1) / ATTG_HEADS;
    const int kh = blockIdx.y / tiles, tile = blockIdx.y % tiles;
    const int h0 = kh * group + tile * ATTG_HEADS;
    const int hn = min(ATTG_HEADS, group - tile * ATTG_HEADS);
    // The row's position, the batch and the queries in one round (a block past the row's
    // end has loaded its queries for nothing).
    const int seen = pos[i] + 1;
    const int past = batch->past, chain = batch->is_chain, plen = batch->max_depth + 1;
    for (int e = tid; e < hn * head_dim; e += blockDim.x) {
        int hh = e / head_dim, d = e - hh * head_dim;
        sm.qs[hh * 256 + d] = q[(size_t)i * q_ld + (h0 + hh) * head_dim + d];
    }
    const int nc = att_row_chunks(pos[i]);
    if ((int)blockIdx.z >= nc) return;
    const u16* kc = k_cache + (size_t)kh * max_slots * head_dim;
    const u16* vc = v_cache + (size_t)kh * max_slots * head_dim;
    const bool alone = nc == 1;
    int fresh = -1;
    if (post.on) {
        const bool holder = (int)blockIdx.z == (nc - 1) % (int)gridDim.z;
        float* ks = sm.parts;
        float* cs = sm.parts + 256;
        float* sn = sm.parts + 384;
        const int half = post.rot_dim / 2;
        for (int t = tid; t < half; t += blockDim.x) {
            float angle = (float)(seen - 1) * post.inv_freq[t];
            double sv, cv;
            sincos((double)angle, &sv, &cv);
            cs[t] = (float)cv;
            sn[t] = (float)sv;
        }
        if (holder) {
            const float* kr = post.k + (size_t)i * post.kv_ld + kh * head_dim;
            for (int d = tid; d < head_dim; d += blockDim.x) ks[d] = kr[d];
        }
        __syncthreads();
        for (int it = warp; it < hn + (holder ? 1 : 0); it += ATTG_WARPS) {
            bool is_q = it < hn;
            head_post_warp(is_q ? sm.qs + it * 256 : ks, is_q ? post.q_norm : post.k_norm, post.eps, head_dim,
                           post.rot_dim, post.interleaved, cs, sn);
        }
        __syncthreads();
        if (holder) {
            fresh = seen - 1;
            const float* vr = post.v + (size_t)i * post.kv_ld + kh * head_dim;
            size_t at = ((size_t)kh * max_slots + past + i) * head_dim;
            for (int d = tid; d < head_dim; d += blockDim.x) {
                u16 kq = f2h(ks[d]), vq = f2h(vr[d]);
                sm.knew[d] = kq;
                sm.vnew[d] = vq;
                if (tile == 0) {
                    k_cache[at + d] = kq;
                    v_cache[at + d] = vq;
                }
            }
        }
    }
    __syncthreads();
    for (int c = blockIdx.z; c < nc; c += gridDim.z) {
        const int v0 = c * ATT_CHUNK;
        const int nk = min(ATT_CHUNK, seen - v0);
        // This lane's keys: t = warp * ATTG_KPW + s * KPS + g (-1: past the row's end).
        int slot[STEPS];
#pragma unroll
        for (int s = 0; s < STEPS; s++) {
            int t = warp * ATTG_KPW + s * KPS + g, v = v0 + t;
            slot[s] = t >= nk ? -1 : (v < past || chain) ? v : past + path[i * plen + (v - past)];
        }
        // Every value row first (held until the weights are known), then the keys. The loads
        // are unconditional (a key past the row reads the chunk's first slot, a lane past the
        // head its first vector; both replaced by zeros, a new key or value by its own after
        // the load), so the compiler issues them together: a load behind a branch waits for
        // the one before it.
        const int first = (v0 < past || chain) ? v0 : past + path[i * plen + (v0 - past)];
        const int rr = act ? r : 0;
        uint4 vraw[STEPS];
#pragma unroll
        for (int s = 0; s < STEPS; s++)
            vraw[s] = __ldg((const uint4*)(vc + (size_t)(slot[s] >= 0 ? slot[s] : first) * head_dim) + rr);
#pragma unroll
        for (int s = 0; s < STEPS; s++) {
            int v = v0 + warp * ATTG_KPW + s * KPS + g;
            if (!(slot[s] >= 0 && act)) vraw[s] = make_uint4(0, 0, 0, 0);
            else if (v == fresh) vraw[s] = ((const uint4*)sm.vnew)[r];
        }
#pragma unroll
        for (int b0 = 0; b0 < STEPS; b0 += BATCH) {
            uint4 kraw[BATCH];
#pragma unroll
            for (int s = 0; s < BATCH; s++)
                kraw[s] = __ldg((const uint4*)(kc + (size_t)(slot[b0 + s] >= 0 ? slot[b0 + s] : first) * head_dim) + rr);
#pragma unroll
            for (int s = 0; s < BATCH; s++) {
                int v = v0 + warp * ATTG_KPW + (b0 + s) * KPS + g;
                if (!(slot[b0 + s] >= 0 && act)) kraw[s] = make_uint4(0, 0, 0, 0);
                else if (v == fresh) kraw[s] = ((const uint4*)sm.knew)[r];
            }
#pragma unroll
            for (int s = 0; s < BATCH; s++) {
                const int t = warp * ATTG_KPW + (b0 + s) * KPS + g;
                float kf[8];
                unpack_f16x8(kraw[s], kf);
                float dot[ATTG_HEADS];
#pragma unroll
                for (int hh = 0; hh < ATTG_HEADS; hh++) {
                    float a = 0.0f;
                    if (hh < hn && act) {
                        const float4* qv = (const float4*)(sm.qs + hh * 256 + 8 * r);
                        float4 qa = qv[0], qb = qv[1];
                        a = fmaf(qa.x, kf[0], a);
                        a = fmaf(qa.y, kf[1], a);
                        a = fmaf(qa.z, kf[2], a);
                        a = fmaf(qa.w, kf[3], a);
                        a = fmaf(qb.x, kf[4], a);
                        a = fmaf(qb.y, kf[5], a);
                        a = fmaf(qb.z, kf[6], a);
                        a = fmaf(qb.w, kf[7], a);
                    }
                    dot[hh] = a;
                }
#pragma unroll
                for (int o = L / 2; o > 0; o >>= 1) {
#pragma unroll
                    for (int hh = 0; hh < ATTG_HEADS; hh++)
                        if (hh < hn) dot[hh] += __shfl_xor_sync(0xffffffffu, dot[hh], o);
                }
                if (t < nk) {
#pragma unroll
                    for (int hh = 0; hh < ATTG_HEADS; hh++)
                        if (hh < hn && hh % L == r) sm.sc[hh * ATT_CHUNK + t] = dot[hh] * scale;
                }
            }
        }
        __syncthreads();
        // Per head: the chunk's max, its weights e^(s − m) in place, their sum (one warp).
        for (int hh = warp; hh < hn; hh += ATTG_WARPS) {
            float* row = sm.sc + hh * ATT_CHUNK;
            float a = lane < nk ? row[lane] : -KINF;
            float b = lane + 32 < nk ? row[lane + 32] : -KINF;
            float m = warp_max(fmaxf(a, b));
            float ea = lane < nk ? expf(a - m) : 0.0f;
            float eb = lane + 32 < nk ? expf(b - m) : 0.0f;
            float l = warp_sum(ea + eb);
            row[lane] = ea;
            row[lane + 32] = eb;
            if (lane == 0) {
                sm.lrow[hh] = l;
                if (!alone) {
                    size_t at = ((size_t)(i * n_heads + h0 + hh) * chunks + c) * 2;
                    part_ml[at] = m;
                    part_ml[at + 1] = l;
                }
            }
        }
        __syncthreads();
        // The weighted values: this lane's 8 dims over its keys, per head.
        float acc[ATTG_HEADS][8];
#pragma unroll
        for (int hh = 0; hh < ATTG_HEADS; hh++)
#pragma unroll
            for (int j = 0; j < 8; j++) acc[hh][j] = 0.0f;
#pragma unroll
        for (int s = 0; s < STEPS; s++) {
            const int t = warp * ATTG_KPW + s * KPS + g;
            if (slot[s] >= 0 && act) {
                float vf[8];
                unpack_f16x8(vraw[s], vf);
#pragma unroll
                for (int hh = 0; hh < ATTG_HEADS; hh++) {
                    if (hh < hn) {
                        float e = sm.sc[hh * ATT_CHUNK + t];
#pragma unroll
                        for (int j = 0; j < 8; j++) acc[hh][j] = fmaf(e, vf[j], acc[hh][j]);
                    }
                }
            }
        }
        if (act) {
            const int p = warp * KPS + g;
#pragma unroll
            for (int hh = 0; hh < ATTG_HEADS; hh++) {
                if (hh < hn) {
                    float4* dst = (float4*)(sm.parts + (p * ATTG_HEADS + hh) * head_dim + 8 * r);
                    dst[0] = make_float4(acc[hh][0], acc[hh][1], acc[hh][2], acc[hh][3]);
                    dst[1] = make_float4(acc[hh][4], acc[hh][5], acc[hh][6], acc[hh][7]);
                }
            }
        }
        __syncthreads();
        // The partial sums in order; a row of one chunk is its own merge (out = o / l).
        for (int e = tid; e < hn * head_dim; e += blockDim.x) {
            int hh = e / head_dim, d = e - hh * head_dim;
            float total = 0.0f;
#pragma unroll
            for (int p = 0; p < P; p++) total += sm.parts[(p * ATTG_HEADS + hh) * head_dim + d];
            if (alone) {
                float v = total * (1.0f / sm.lrow[hh]);
                out[(size_t)i * out_ld + (h0 + hh) * head_dim + d] = v;
                sm.qs[hh * 256 + d] = v;
            } else {
                part_o[((size_t)(i * n_heads + h0 + hh) * chunks + c) * head_dim + d] = total;
            }
        }
        __syncthreads();
    }
    const int nb = head_dim / 32;
    if (alone) {
        if (xq)
            for (int b = warp; b < hn * nb; b += ATTG_WARPS) {
                int hh = b / nb, k = b - hh * nb;
                size_t at = (size_t)i * out_ld + (h0 + hh) * head_dim + 32 * k;
                quant_block32(sm.qs[hh * 256 + 32 * k + lane], xq + at, xs + at / 32);
            }
        return;
    }
    // The last of the row's blocks (for this KV head's query heads) merges: as attn_partial.
    if (!last_to_arrive(arrivals + i * n_heads + blockIdx.y, min(nc, (int)gridDim.z), sm.last)) return;
    for (int hh = warp; hh < hn; hh += ATTG_WARPS) {
        const float* ml = part_ml + (size_t)(i * n_heads + h0 + hh) * chunks * 2;
        float m = -KINF;
        for (int c = lane; c < nc; c += 32) m = fmaxf(m, __ldcg(ml + 2 * c));
        m = warp_max(m);
        float l = 0.0f;
        for (int c = lane; c < nc; c += 32) l = fmaf(expf(__ldcg(ml + 2 * c) - m), __ldcg(ml + 2 * c + 1), l);
        l = warp_sum(l);
        if (lane == 0) {
            sm.mrow[hh] = m;
            sm.lrow[hh] = l;
        }
    }
    constexpr int OUTS = ATTG_HEADS * 256 / 128;
    float acc[OUTS];
#pragma unroll
    for (int k = 0; k < OUTS; k++) acc[k] = 0.0f;
    for (int c0 = 0; c0 < nc; c0 += ATT_CHUNK) {
        const int cn = min(ATT_CHUNK, nc - c0);
        __syncthreads();
        for (int e = tid; e < hn * ATT_CHUNK; e += blockDim.x) {
            int hh = e / ATT_CHUNK, cc = e - hh * ATT_CHUNK;
            if (cc < cn)
                sm.sc[e] = expf(__ldcg(part_ml + ((size_t)(i * n_heads + h0 + hh) * chunks + c0 + cc) * 2) - sm.mrow[hh]);
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < OUTS; k++) {
            int e = tid + 128 * k;
            if (e < hn * head_dim) {
                int hh = e / head_dim, d = e - hh * head_dim;
                const float* po = part_o + ((size_t)(i * n_heads + h0 + hh) * chunks + c0) * head_dim + d;
                const float* w = sm.sc + hh * ATT_CHUNK;
                float a = acc[k];
#pragma unroll 8
                for (int cc = 0; cc < cn; cc++) a = fmaf(w[cc], __ldcg(po + (size_t)cc * head_dim), a);
                acc[k] = a;
            }
        }
    }
#pragma unroll
    for (int k = 0; k < OUTS; k++) {
        int e = tid + 128 * k;
        if (e < hn * head_dim) {
            int hh = e / head_dim, d = e - hh * head_dim;
            float v = acc[k] * (1.0f / sm.lrow[hh]);
            out[(size_t)i * out_ld + (h0 + hh) * head_dim + d] = v;
            sm.qs[hh * 256 + d] = v;
        }
    }
    if (xq) {
        __syncthreads();
        for (int b = warp; b < hn * nb; b += ATTG_WARPS) {
            int hh = b / nb, k = b - hh * nb;
            size_t at = (size_t)i * out_ld + (h0 + hh) * head_dim + 32 * k;
            quant_block32(sm.qs[hh * 256 + 32 * k + lane], xq + at, xs + at / 32);
        }
    }
}

extern "C" __global__ void __launch_bounds__(128) attn_group(
    const float* q, int q_ld, u16* k_cache, u16* v_cache, int max_slots,
    int n_heads, int n_kv_heads, int head_dim, float scale,
    const Batch* batch, const int* pos, const int* path,
    float* part_ml, float* part_o, int chunks,
    int* arrivals, float* out, int out_ld, i8* xq, float4* xs, PostArgs post) {
    wait_for_predecessor();
    __shared__ __align__(16) float qs[ATTG_HEADS * 256];
    __shared__ __align__(16) float parts[ATTG_PARTS];
    __shared__ float sc[ATTG_HEADS * ATT_CHUNK];
    __shared__ __align__(16) u16 knew[256];
    __shared__ __align__(16) u16 vnew[256];
    __shared__ float mrow[ATTG_HEADS];
    __shared__ float lrow[ATTG_HEADS];
    __shared__ int last;
    AttgShared sm = {qs, parts, sc, knew, vnew, mrow, lrow, &last};
#define ATTG_RUN(L)                                                                                           \
    attn_group_body<L>(q, q_ld, k_cache, v_cache, max_slots, n_heads, n_kv_heads, head_dim, scale, batch, pos, \
                       path, part_ml, part_o, chunks, arrivals, out, out_ld, xq, xs, post, sm)
    if (head_dim <= 32) ATTG_RUN(4);
    else if (head_dim <= 64) ATTG_RUN(8);
    else if (head_dim <= 128) ATTG_RUN(16);
    else ATTG_RUN(32);
#undef ATTG_RUN
}
