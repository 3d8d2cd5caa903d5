// Attention of the batch's rows over the f16 KV cache, split over the keys (flash-decoding):
// `attn_partial` computes, per (row, query head, chunk of ATT_CHUNK key positions), the chunk's
// max score, exp-sum and weighted values; the last chunk of a (row, head) to finish combines
// them in order (`attn_merge_row`).
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
    float mx = -KINF;
    for (int c = 0; c < nc; c++) mx = fmaxf(mx, __ldcg(ml + 2 * c));
    float l = 0.0f;
    for (int c = 0; c < nc; c++) l = fmaf(expf(__ldcg(ml + 2 * c) - mx), __ldcg(ml + 2 * c + 1), l);
    float inv = 1.0f / l;
    __syncthreads();
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float acc = 0.0f;
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

// Grid (n, n_heads, blocks), block 128 (4 warps): block z takes chunks z, z + blocks, ... of
// the row (so a pass launches blocks for the cache's length, not its capacity). Partials: [row][head][chunk] (m, l) and
// [row][head][chunk][head_dim] (weighted values). Thread t scores key t of the chunk whole
// (its row read as 16-byte vectors, q from shared memory); then thread d sums the values of
// dim d over the chunk's keys, eight running sums (more loads in flight) added in order.
extern "C" __global__ void __launch_bounds__(128) attn_partial(
    const float* q, int q_ld, u16* k_cache, u16* v_cache, int max_slots,
    int n_heads, int n_kv_heads, int head_dim, float scale,
    const Batch* batch, const int* pos, const int* path,
    float* part_ml, float* part_o, int chunks,
    int* arrivals, float* out, int out_ld, i8* xq, float4* xs, PostArgs post) {
    wait_for_predecessor();
    __shared__ float qs[256];
    __shared__ float ks[256];
    __shared__ __align__(16) u16 knew[256];
    __shared__ u16 vnew[256];
    __shared__ int last;
    __shared__ float sc[ATT_CHUNK];
    __shared__ int slots[ATT_CHUNK];
    __shared__ float red[32];
    int i = blockIdx.x, h = blockIdx.y;
    int seen = pos[i] + 1;
    int nc = (seen + ATT_CHUNK - 1) / ATT_CHUNK;
    if ((int)blockIdx.z >= nc) return;
    int kh = h / (n_heads / n_kv_heads);
    const u16* kc = k_cache + (size_t)kh * max_slots * head_dim;
    const u16* vc = v_cache + (size_t)kh * max_slots * head_dim;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) qs[d] = q[(size_t)i * q_ld + h * head_dim + d];
    // The fused epilogue: the virtual position of the new key (-1: none here).
    int fresh = -1;
    if (post.on) {
        head_post(qs, post.q_norm, post.eps, head_dim, post.rot_dim, post.interleaved, post.inv_freq, pos[i]);
        if ((int)blockIdx.z == (nc - 1) % (int)gridDim.z) {
            fresh = seen - 1;
            const float* kr = post.k + (size_t)i * post.kv_ld + kh * head_dim;
            const float* vr = post.v + (size_t)i * post.kv_ld + kh * head_dim;
            for (int d = threadIdx.x; d < head_dim; d += blockDim.x) ks[d] = kr[d];
            head_post(ks, post.k_norm, post.eps, head_dim, post.rot_dim, post.interleaved, post.inv_freq, pos[i]);
            bool writer = h % (n_heads / n_kv_heads) == 0;
            size_t at = ((size_t)kh * max_slots + batch->past + i) * head_dim;
            for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
                u16 kq = f2h(ks[d]), vq = f2h(vr[d]);
                knew[d] = kq;
                vnew[d] = vq;
                if (writer) {
                    k_cache[at + d] = kq;
                    v_cache[at + d] = vq;
                }
            }
        }
        __syncthreads();
    }
    for (int c = blockIdx.z; c < nc; c += gridDim.z) {
        int v0 = c * ATT_CHUNK;
        int v1 = min(v0 + ATT_CHUNK, seen), nk = v1 - v0;
        for (int t = threadIdx.x; t < nk; t += blockDim.x) slots[t] = att_slot(batch, path, i, v0 + t);
        __syncthreads();
        for (int t = threadIdx.x; t < nk; t += blockDim.x) {
            const uint4* kr = v0 + t == fresh ? (const uint4*)knew : (const uint4*)(kc + (size_t)slots[t] * head_dim);
            float s = 0.0f;
            // Eight 16-byte loads in flight, then their products in order.
            for (int e0 = 0; e0 < head_dim / 8; e0 += 8) {
                uint4 raw[8];
#pragma unroll
                for (int k = 0; k < 8; k++) raw[k] = e0 + k < head_dim / 8 ? kr[e0 + k] : make_uint4(0, 0, 0, 0);
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    if (e0 + k < head_dim / 8) {
                        u32 w[4] = {raw[k].x, raw[k].y, raw[k].z, raw[k].w};
                        const float* qv = qs + 8 * (e0 + k);
#pragma unroll
                        for (int z = 0; z < 4; z++) {
                            s = fmaf(qv[2 * z], h2f((u16)(w[z] & 0xffff)), s);
                            s = fmaf(qv[2 * z + 1], h2f((u16)(w[z] >> 16)), s);
                        }
                    }
                }
            }
            sc[t] = s * scale;
        }
        __syncthreads();
        float m = -KINF;
        for (int t = threadIdx.x; t < nk; t += blockDim.x) m = fmaxf(m, sc[t]);
        m = block_max(m, red);
        __syncthreads();
        for (int t = threadIdx.x; t < nk; t += blockDim.x) sc[t] = expf(sc[t] - m);
        __syncthreads();
        // The exp-sum in a fixed order (one thread, sequential), then the weighted values.
        if (threadIdx.x == 0) {
            float l = 0.0f;
            for (int t = 0; t < nk; t++) l += sc[t];
            size_t at = ((size_t)(i * n_heads + h) * chunks + c) * 2;
            part_ml[at] = m;
            part_ml[at + 1] = l;
            red[0] = l;
        }
        // A row of one chunk is its own merge: out = o / l, the bits attn_merge_row gives one
        // chunk (its weight e^(m − m) is exactly 1), without the partials' round trip.
        __syncthreads();
        const bool alone = nc == 1;
        const float inv_l = 1.0f / red[0];
        float* o = part_o + ((size_t)(i * n_heads + h) * chunks + c) * head_dim;
        for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
            // Every value of the chunk loaded first (independent loads in flight), then eight
            // running sums over the keys in order, added in order.
            float vals[ATT_CHUNK];
#pragma unroll
            for (int t = 0; t < ATT_CHUNK; t++)
                vals[t] = t < nk ? h2f(v0 + t == fresh ? vnew[d] : vc[(size_t)slots[t] * head_dim + d]) : 0.0f;
            float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int t = 0; t < ATT_CHUNK; t++)
                if (t < nk) acc[t % 8] = fmaf(sc[t], vals[t], acc[t % 8]);
            float total = 0.0f;
#pragma unroll
            for (int k = 0; k < 8; k++) total += acc[k];
            if (alone) {
                float v = total * inv_l;
                out[(size_t)i * out_ld + h * head_dim + d] = v;
                qs[d] = v;
            } else {
                o[d] = total;
            }
        }
        __syncthreads();
    }
    if (nc == 1) {
        if (xq) {
            int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
            for (int b = warp; b < head_dim / 32; b += blockDim.x >> 5) {
                size_t at = (size_t)i * out_ld + h * head_dim + 32 * b;
                quant_block32(qs[32 * b + lane], xq + at, xs + at / 32);
            }
        }
        return;
    }
    // The last of the row's blocks to finish merges them all (no second kernel): each block
    // publishes its partials, then counts itself in; the one that completes the count reads
    // every chunk's partials (past L1, which other blocks' writes do not reach) and resets
    // the count for the next pass.
    __threadfence();
    __syncthreads();
    int working = min(nc, (int)gridDim.z);
    if (threadIdx.x == 0) {
        int* count = arrivals + i * n_heads + h;
        last = atomicAdd(count, 1) == working - 1;
        if (last) *count = 0;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    attn_merge_row(part_ml, part_o, chunks, n_heads, head_dim, nc, i, h, out, out_ld, xq, xs, qs);
}

