// What a draft model's tree needs of each row of a verification pass (kasoku-cuda's draft.rs):
// the best and the runner-up among the row's first `cols` logits, in the host sampler's order
// (logit descending by IEEE total order, ties to the smaller id: topk_key in sample.cu, here
// with all 32 id bits), and z = sum of exp(l - best) over those logits, so the host knows
// both candidates' probabilities (exp(l - best) / z) without copying the row. One block per
// row; per row 5 words out: best id, best logit bits, runner-up id, its logit bits, z bits.

#define TOP2_THREADS 256
#define TOP2_WORDS 5

// (a1 > a2) and (b1 > b2), keys: the two largest of the four into (a1, a2).
__device__ __forceinline__ void top2_merge(u64& a1, u64& a2, u64 b1, u64 b2) {
    if (b1 > a1) {
        a2 = a1 > b2 ? a1 : b2;
        a1 = b1;
    } else {
        a2 = a2 > b1 ? a2 : b1;
    }
}

extern "C" __global__ void __launch_bounds__(TOP2_THREADS)
row_top2(const float* logits, int ld, int cols, u32* out) {
    wait_for_predecessor();
    __shared__ u64 s_k1[TOP2_THREADS / 32], s_k2[TOP2_THREADS / 32];
    __shared__ float s_sum[TOP2_THREADS / 32];
    __shared__ float s_best;
    const float* row = logits + (size_t)blockIdx.x * ld;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    // Key 0 is below every logit's key (the monotone bits of any float are nonzero above
    // the id), so it stands for "none yet".
    u64 k1 = 0, k2 = 0;
    for (int i = tid; i < cols; i += blockDim.x) {
        u64 k = topk_key(row[i], (u32)i, 32, 0xffffffffu);
        if (k > k1) {
            k2 = k1;
            k1 = k;
        } else if (k > k2) {
            k2 = k;
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        u64 b1 = __shfl_down_sync(0xffffffffu, k1, o);
        u64 b2 = __shfl_down_sync(0xffffffffu, k2, o);
        top2_merge(k1, k2, b1, b2);
    }
    if (lane == 0) {
        s_k1[warp] = k1;
        s_k2[warp] = k2;
    }
    __syncthreads();
    if (tid == 0) {
        for (int w = 1; w < TOP2_THREADS / 32; w++) top2_merge(k1, k2, s_k1[w], s_k2[w]);
        const u32 id1 = ~(u32)k1, id2 = ~(u32)k2;
        const float l1 = row[id1], l2 = row[id2];
        u32* o = out + (size_t)blockIdx.x * TOP2_WORDS;
        o[0] = id1;
        o[1] = __float_as_uint(l1);
        o[2] = id2;
        o[3] = __float_as_uint(l2);
        s_best = l1;
    }
    __syncthreads();
    const float best = s_best;
    float sum = 0.0f;
    for (int i = tid; i < cols; i += blockDim.x) sum += expf(row[i] - best);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_down_sync(0xffffffffu, sum, o);
    if (lane == 0) s_sum[warp] = sum;
    __syncthreads();
    if (tid == 0) {
        float z = 0.0f;
        for (int w = 0; w < TOP2_THREADS / 32; w++) z += s_sum[w];
        out[(size_t)blockIdx.x * TOP2_WORDS + 4] = __float_as_uint(z);
    }
}

// The top-K selection of each of gridDim.x rows of logits (row r at logits + r * ld, its
// first `cols` values) into out + r * 2 * count: top_k_select_row (sample.cu) per block, so a
// DFlash block's rows take one launch. The same pairs as top_k_select on each row.
extern "C" __global__ void __launch_bounds__(TOPK_THREADS)
rows_top_k(const float* logits, int ld, int cols, int count, int id_bits, u32* out) {
    wait_for_predecessor();
    const size_t r = blockIdx.x;
    top_k_select_row(logits + r * ld, cols, count, id_bits, out + r * 2 * count);
}

// Row r of dst (`width` floats, rows `width` apart) = row idx[r] of src (rows `ld` floats
// apart), for the gridDim.x rows: a DFlash drafter's features gathered from the layer outputs
// the target recorded for its pass's rows (the accepted path's nodes), read in place.
extern "C" __global__ void __launch_bounds__(256)
gather_rows(const float* src, int ld, const u32* idx, int width, float* dst) {
    wait_for_predecessor();
    const float* s = src + (size_t)idx[blockIdx.x] * ld;
    float* d = dst + (size_t)blockIdx.x * width;
    for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < width; i += gridDim.y * blockDim.x)
        d[i] = s[i];
}
