// The element-wise and per-row kernels of a forward pass: embedding, RMSNorm, the q/k/v
// epilogue (per-head norm, RoPE, KV-cache write), SwiGLU, argmax, the KV-cache commit and
// Qwen3.5's attention output gate.

// The per-pass description of the batch, in device memory (filled before each pass, so a
// captured graph replays any batch of its size).
struct Batch {
    int past;      // committed positions before the batch
    int n;         // rows
    int is_chain;  // 1: row i sits at past + i and sees 0..=past + i
    int max_depth; // trees: the path table's row length
};
// Arrays beside it: tokens[n] (u32), pos[n] (int: past + depth), path[n][max_depth + 1]
// (trees: row i's nodes from the root down; path[i][d] is the node at depth d).

// y[i] = dequant(embedding row tokens[i]); grid (n), any block size. Block 0 also zeroes
// `clear_n` u64s at `clear` (the head's argmax keys: one kernel instead of a memset node
// that would break the chain of early launches).
extern "C" __global__ void embed(const u8* table, long long row_bytes, int fmt, int dim,
                                 const u32* tokens, float* y, u64* clear, int clear_n) {
    wait_for_predecessor();
    int i = blockIdx.x;
    if (i == 0 && clear)
        for (int c = threadIdx.x; c < clear_n; c += blockDim.x) clear[c] = 0;
    const u8* row = table + (size_t)tokens[i] * row_bytes;
    for (int c = threadIdx.x; c < dim; c += blockDim.x) y[(size_t)i * dim + c] = dequant_one(row, fmt, c);
}

// y = x · w / sqrt(mean(x²) + eps), row by row; grid (rows), any block size (a multiple of
// 32). With xq/xs, also the int8 activations of y. Rows of whole 32-value blocks go through
// rms_row (matvec.cu), whose bits a product's fused norm tail shares; other widths (no int8
// blocks) sum their squares in f64 thread by thread.
extern "C" __global__ void __launch_bounds__(256) rmsnorm(const float* x, const float* w, float eps, int dim, float* y,
                                                          i8* xq, float4* xs) {
    wait_for_predecessor();
    __shared__ double red[NORM_MAX_DIM / 32];
    __shared__ float scale_sh;
    const float* xr = x + (size_t)blockIdx.x * dim;
    float* yr = y + (size_t)blockIdx.x * dim;
    if (dim % 32 == 0 && dim <= NORM_MAX_DIM) {
        rms_row(xr, w, eps, dim, yr, xq ? xq + (size_t)blockIdx.x * dim : 0,
                xq ? xs + (size_t)blockIdx.x * (dim / 32) : 0, red, &scale_sh);
        return;
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    double ss = 0.0;
    for (int c = threadIdx.x; c < dim; c += blockDim.x) ss += (double)xr[c] * (double)xr[c];
    ss = warp_sum_d(ss);
    if (lane == 0) red[warp] = ss;
    __syncthreads();
    double t = lane < nw ? red[lane] : 0.0;
    t = warp_sum_d(t);
    float scale = 1.0f / sqrtf((float)(t / dim) + eps);
    for (int c = threadIdx.x; c < dim; c += blockDim.x) yr[c] = xr[c] * scale * w[c];
}

// One head's epilogue in shared memory `s` (head_dim values, by a block of 128 threads, every
// thread calling): optional RMSNorm with weights `nw` (sum of squares in f64, like rmsnorm),
// then RoPE at position p (the angle rounded to f32 first, then sin and cos in f64, as the
// CPU's Rope). qkv_post and the fused decode attention share it, so both give the same bits.
__device__ __noinline__ void head_post(float* s, const float* nw, float eps, int head_dim, int rot_dim, int interleaved,
                          const float* inv_freq, int p) {
    __syncthreads();
    if (nw) {
        double ss = 0.0;
        for (int d = threadIdx.x; d < head_dim; d += blockDim.x) ss += (double)s[d] * (double)s[d];
        __shared__ double redd[32];
        int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
        ss = warp_sum_d(ss);
        if (lane == 0) redd[warp] = ss;
        __syncthreads();
        double t = lane < (int)(blockDim.x >> 5) ? redd[lane] : 0.0;
        t = warp_sum_d(t);
        float scale = 1.0f / sqrtf((float)(t / head_dim) + eps);
        __syncthreads();
        for (int d = threadIdx.x; d < head_dim; d += blockDim.x) s[d] = s[d] * scale * nw[d];
        __syncthreads();
    }
    int half = rot_dim / 2;
    for (int t = threadIdx.x; t < half; t += blockDim.x) {
        float angle = (float)p * inv_freq[t];
        double sn, cs;
        sincos((double)angle, &sn, &cs);
        float c = (float)cs, sv = (float)sn;
        int a = interleaved ? 2 * t : t, b = interleaved ? 2 * t + 1 : t + half;
        float x0 = s[a], x1 = s[b];
        s[a] = x0 * c - x1 * sv;
        s[b] = x1 * c + x0 * sv;
    }
    __syncthreads();
}

// After the q/k/v projections: per head, optional RMSNorm (q_norm / k_norm), RoPE at the row's
// position, then q stays in place (f32) and k, v go to the cache as f16 at slot past + row.
// Grid (n, n_heads + n_kv_heads), block 128; head_dim ≤ 256.
// Cache layout: [kv_head][slot][head_dim].
extern "C" __global__ void __launch_bounds__(128) qkv_post(
    float* q, const float* k, const float* v, int q_ld, int kv_ld,
    int n_heads, int n_kv_heads, int head_dim, int rot_dim, int interleaved,
    const float* inv_freq, const float* q_norm, const float* k_norm, float eps,
    const Batch* batch, const int* pos, u16* k_cache, u16* v_cache, int max_slots) {
    wait_for_predecessor();
    __shared__ float s[256];
    int i = blockIdx.x, h = blockIdx.y;
    bool is_q = h < n_heads;
    int kh = h - n_heads;
    const float* src = is_q ? q + (size_t)i * q_ld + h * head_dim : k + (size_t)i * kv_ld + kh * head_dim;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) s[d] = src[d];
    head_post(s, is_q ? q_norm : k_norm, eps, head_dim, rot_dim, interleaved, inv_freq, pos[i]);
    if (is_q) {
        float* dst = q + (size_t)i * q_ld + h * head_dim;
        for (int d = threadIdx.x; d < head_dim; d += blockDim.x) dst[d] = s[d];
    } else {
        int slot = batch->past + i;
        size_t at = ((size_t)kh * max_slots + slot) * head_dim;
        const float* vs = v + (size_t)i * kv_ld + kh * head_dim;
        for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
            k_cache[at + d] = f2h(s[d]);
            v_cache[at + d] = f2h(vs[d]);
        }
    }
}

// g = silu(g) · u, silu(x) = x / (1 + e^-x), one warp per 32 values (len a multiple of 32);
// with xq/xs, also the int8 activations of the result.
extern "C" __global__ void swiglu(float* g, const float* u, long long blocks, i8* xq, float4* xs) {
    wait_for_predecessor();
    long long b = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (b >= blocks) return;
    long long c = 32 * b + (threadIdx.x & 31);
    float x = g[c];
    float v = x / (1.0f + expf(-x)) * u[c];
    g[c] = v;
    if (xq) quant_block32(v, xq + 32 * b, xs + b);
}

// ids[i] = the index of row i's largest value (the first on ties); grid (n), block 1024.
extern "C" __global__ void __launch_bounds__(1024) argmax(const float* logits, int vocab, u32* ids) {
    wait_for_predecessor();
    __shared__ float bv[32];
    __shared__ int bi[32];
    const float* row = logits + (size_t)blockIdx.x * vocab;
    float best = -KINF;
    int idx = 0x7fffffff;
    for (int c = threadIdx.x; c < vocab; c += blockDim.x) {
        float v = row[c];
        if (v > best) { best = v; idx = c; }
    }
    // Larger value wins; equal values: smaller index.
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, best, o);
        int oi = __shfl_xor_sync(0xffffffffu, idx, o);
        if (ov > best || (ov == best && oi < idx)) { best = ov; idx = oi; }
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) { bv[warp] = best; bi[warp] = idx; }
    __syncthreads();
    if (warp == 0) {
        int nw = blockDim.x >> 5;
        best = lane < nw ? bv[lane] : -KINF;
        idx = lane < nw ? bi[lane] : 0x7fffffff;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, best, o);
            int oi = __shfl_xor_sync(0xffffffffu, idx, o);
            if (ov > best || (ov == best && oi < idx)) { best = ov; idx = oi; }
        }
        if (lane == 0) ids[blockIdx.x] = idx == 0x7fffffff ? 0 : (u32)idx;
    }
}

// Keeps the accepted path of a verified tree: slot past + path[t] moves to past + t, in order
// (each source is at or after its destination, so moving t = 0, 1, ... in turn is safe).
// Grid (layers × kv_heads), block 128. caches: every layer's [kv_head][slot][head_dim] back to
// back, k then v per layer: cache + (layer * 2 + {0, 1}) * layer_elems.
extern "C" __global__ void kv_commit(u16* cache, long long head_elems, int n_kv_heads, int head_dim,
                                     int past, const int* path, int len) {
    wait_for_predecessor();
    int layer = blockIdx.x / n_kv_heads, kh = blockIdx.x % n_kv_heads;
    for (int which = 0; which < 2; which++) {
        u16* base = cache + ((size_t)(layer * 2 + which) * n_kv_heads + kh) * head_elems;
        for (int t = 0; t < len; t++) {
            int from = past + path[t], to = past + t;
            if (from != to)
                for (int d = threadIdx.x; d < head_dim; d += blockDim.x)
                    base[(size_t)to * head_dim + d] = base[(size_t)from * head_dim + d];
            __syncthreads();
        }
    }
}

// Qwen3.5's attention output gate: x = x · sigmoid(gate), one warp per 32 values (len a
// multiple of 32); with xq/xs, also the int8 activations of the result (what the output
// projection reads).
extern "C" __global__ void sigmoid_gate(float* x, const float* gate, long long blocks, i8* xq, float4* xs) {
    wait_for_predecessor();
    long long b = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (b >= blocks) return;
    long long c = 32 * b + (threadIdx.x & 31);
    float g = gate[c];
    float sg = g >= 0.0f ? 1.0f / (1.0f + expf(-g)) : expf(g) / (1.0f + expf(g));
    float v = x[c] * sg;
    x[c] = v;
    if (xq) quant_block32(v, xq + 32 * b, xs + b);
}
