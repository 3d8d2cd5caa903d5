// Exact top-K selection of a logits row, for sampling on the host from K candidates instead
// of the whole row. The order is the host sampler's (kasoku::sampler::by_logit): logit
// descending by IEEE total order (total_cmp), ties to the smaller id. Each element's 64-bit
// key orders that way and is unique: the logit's bits made monotone in the high bits, the
// complement of the id (within the vocabulary's id bits) in the low bits. A radix select over
// the keys, 11 bits at a time from the top, finds the K-th largest key; the K keys at or
// above it are written out (in no particular order), and the logits of the gathered ids.
// One block per row; the row is read once per digit (from L2: the head just wrote it).

#define TOPK_THREADS 1024
#define TOPK_BITS 11
#define TOPK_BINS (1 << TOPK_BITS)

// The logit's bits as an unsigned key that orders as total_cmp.
__device__ __forceinline__ u32 topk_monotone(float l) {
    u32 b = __float_as_uint(l);
    return (b >> 31) ? ~b : (b | 0x80000000u);
}

// The key of 32 + id_bits bits: the monotone logit above the id's complement.
__device__ __forceinline__ u64 topk_key(float l, u32 id, int id_bits, u32 id_mask) {
    return ((u64)topk_monotone(l) << id_bits) | (u64)((~id) & id_mask);
}

// The selection of one row by the whole block: logits: the row (vocab values); count: K
// (1..vocab-1); id_bits: bits of the largest id; out: K (id, logit bits) pairs. Every thread
// of the block calls it (it synchronises the block). Also draft_top.cu's rows_top_k.
__device__ __forceinline__ void top_k_select_row(const float* logits, int vocab, int count,
                                                 int id_bits, u32* out) {
    __shared__ u32 hist[TOPK_BINS];
    __shared__ u64 s_prefix;
    __shared__ int s_need, s_done;
    __shared__ u32 s_slot;
    const int tid = threadIdx.x, lane = tid & 31;
    const u32 id_mask = id_bits >= 32 ? 0xffffffffu : ((1u << id_bits) - 1u);
    // Bits at or above `shift` are resolved: the K-th key has them equal to `prefix`.
    u64 prefix = 0;
    int need = count, shift = 32 + id_bits, done = 0;
    while (shift > 0 && !done) {
        const int width = shift < TOPK_BITS ? shift : TOPK_BITS;
        const int lo = shift - width;
        const u64 hi_mask = shift >= 64 ? 0ull : (~0ull << shift);
        const u32 digit_mask = (1u << width) - 1u;
        for (int i = tid; i < TOPK_BINS; i += blockDim.x) hist[i] = 0;
        __syncthreads();
        // Every lane of a warp runs every iteration (the bound is uniform per warp), so the
        // lanes with the same digit add their count with one atomic.
        for (int base = 0; base < vocab; base += blockDim.x) {
            int i = base + tid;
            bool in = false;
            u32 d = 0xffffffffu;
            if (i < vocab) {
                u64 k = topk_key(logits[i], (u32)i, id_bits, id_mask);
                in = (k & hi_mask) == prefix;
                if (in) d = (u32)(k >> lo) & digit_mask;
            }
            u32 peers = __match_any_sync(0xffffffffu, d);
            if (in && lane == __ffs(peers) - 1) atomicAdd(&hist[d], __popc(peers));
        }
        __syncthreads();
        // Warp 0 finds the digit holding the need-th largest key: 64 bins a lane, from the
        // top digit down.
        if (tid < 32) {
            const int per = TOPK_BINS / 32;
            u32 mine = 0;
            for (int b = 0; b < per; b++) mine += hist[lane * per + b];
            // Keys in the bins of the lanes above this one, and of this one and above.
            u32 incl = mine;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                u32 t = __shfl_down_sync(0xffffffffu, incl, o);
                if (lane + o < 32) incl += t;
            }
            u32 above = incl - mine;
            if (above < (u32)need && (u32)need <= incl) {
                for (int b = per - 1; b >= 0; b--) {
                    u32 c = hist[lane * per + b];
                    if (above + c >= (u32)need) {
                        s_prefix = prefix | ((u64)(lane * per + b) << lo);
                        s_need = need - (int)above;
                        s_done = c == (u32)(need - (int)above);
                        break;
                    }
                    above += c;
                }
            }
        }
        __syncthreads();
        prefix = s_prefix;
        need = s_need;
        done = s_done;
        shift = lo;
        __syncthreads();
    }
    // Every key whose resolved bits are at or above the prefix: exactly `count` of them.
    const u64 sel_mask = shift >= 64 ? 0ull : (~0ull << shift);
    if (tid == 0) s_slot = 0;
    __syncthreads();
    for (int i = tid; i < vocab; i += blockDim.x) {
        float l = logits[i];
        u64 k = topk_key(l, (u32)i, id_bits, id_mask);
        if ((k & sel_mask) >= prefix) {
            u32 slot = atomicAdd(&s_slot, 1u);
            if (slot < (u32)count) {
                out[2 * slot] = (u32)i;
                out[2 * slot + 1] = __float_as_uint(l);
            }
        }
    }
}

// logits: the row (vocab values); count: K (1..vocab-1, or 0: gather only); id_bits: bits of
// the largest id. out: K (id, logit bits) pairs; gather/n_gather: ids whose logits go to
// gathered.
extern "C" __global__ void __launch_bounds__(TOPK_THREADS)
top_k_select(const float* logits, int vocab, int count, int id_bits, const u32* gather,
             int n_gather, u32* out, float* gathered) {
    wait_for_predecessor();
    for (int i = threadIdx.x; i < n_gather; i += blockDim.x) {
        u32 id = gather[i];
        gathered[i] = id < (u32)vocab ? logits[id] : 0.0f;
    }
    if (count <= 0) return;
    top_k_select_row(logits, vocab, count, id_bits, out);
}
