// Attention of a long chain pass (a prompt's prefill) on f16 tensor cores, flash style: the
// decode kernels (attention.cu) give every (row, head) blocks of its own that score and sum a
// chunk in dependent rounds, which is what a step of one row needs but makes a 512-row pass
// re-read the keys once per row (51 of the 67 ms of a pp512 pass of the 1.5B on an H100).
//
// Here a block takes ATTP_WARPS × 16 consecutive rows and one query head. Per chunk of
// ATTP_KEYS key positions it brings the keys and values of the head's KV group into shared
// memory once (values transposed), and each warp computes its 16 rows' scores with
// m16n8k16 mma (f32 sums), the online softmax of the chunk, and the weighted values with
// another mma. Queries and probabilities enter the tensor cores as two halves each,
// x = f16(x) + f16(x − f16(x)) (two products summed in f32), so their rounding costs about
// 2^-22 of their value instead of 2^-11: the result stays within f32 noise of the CPU's
// attention over the same f16 keys and values.
//
// A row's arithmetic depends only on its own position and the cache: chunks are fixed ranges
// of positions, every row runs its chunks in order and skips a chunk in which it sees no key,
// so its bits do not depend on the rows beside it or on where the pass starts. They are not
// the decode kernels' bits (as the prefill GEMM's are not matvec's): the model takes this
// kernel only for chain passes longer than any speculative tree.

#define ATTP_WARPS 4
#define ATTP_KEYS 64
// Padding (in halves) of a key row and of a transposed value row in shared memory, so the
// fragment loads of a warp fall in 32 different banks.
#define ATTP_KPAD 8
#define ATTP_VPAD 8

// x as a high and a low half-precision pair of words for an mma fragment.
__device__ __forceinline__ void attp_split2(float a, float b, u32* hi, u32* lo) {
    u16 ha = f2h(a), hb = f2h(b);
    *hi = (u32)ha | ((u32)hb << 16);
    *lo = pack_h2(a - h2f(ha), b - h2f(hb));
}

// Grid (ceil(n / (16·ATTP_WARPS)), n_heads), block 32·ATTP_WARPS. Chain rows only: row i has
// position pos[i] (increasing) and sees the cache's slots 0..=pos[i], which the pass's q/k/v
// epilogue has filled. out[i][h·HD + d]; with xq/xs also its int8 blocks.
template <int HD>
__device__ __forceinline__ void attn_prefill_body(
    const float* q, int q_ld, const u16* k_cache, const u16* v_cache, int max_slots,
    int n, int n_heads, int n_kv_heads, float scale, const int* pos,
    float* out, int out_ld, i8* xq, float4* xs) {
    wait_for_predecessor();
    constexpr int KS = HD / 16;                 // k-steps of a score product
    constexpr int NT = HD / 8;                  // 8-wide tiles of the output
    constexpr int KROW = HD + ATTP_KPAD;        // halves per key row
    constexpr int VROW = ATTP_KEYS + ATTP_VPAD; // halves per transposed value row
    __shared__ __align__(16) u16 smem[ATTP_KEYS * KROW + HD * VROW];
    u16* ks = smem;
    u16* vt = smem + ATTP_KEYS * KROW;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int h = blockIdx.y, kh = h / (n_heads / n_kv_heads);
    const int r0 = blockIdx.x * (ATTP_WARPS * 16), wr = r0 + warp * 16;
    const u16* kc = k_cache + (size_t)kh * max_slots * HD;
    const u16* vc = v_cache + (size_t)kh * max_slots * HD;
    // This thread's rows (fragment rows g and g + 8) and their positions (−1: no row).
    const int ra = wr + g, rb = wr + g + 8;
    const int pa = ra < n ? pos[ra] : -1, pb = rb < n ? pos[rb] : -1;
    const int last = pos[min(r0 + ATTP_WARPS * 16, n) - 1];
    const int warp_last = wr < n ? pos[min(wr + 16, n) - 1] : -1;

    // The queries' A fragments (rows g, g + 8; columns 2t, 2t + 1 and 2t + 8, 2t + 9 of each
    // 16-wide step), high and low halves, held for the whole pass.
    u32 qh[KS][4], ql[KS][4];
#pragma unroll
    for (int s = 0; s < KS; s++) {
#pragma unroll
        for (int f = 0; f < 4; f++) {
            int row = (f & 1) ? rb : ra;
            int col = 16 * s + 2 * t + ((f & 2) ? 8 : 0);
            float x0 = 0.0f, x1 = 0.0f;
            if (row < n) {
                const float* qr = q + (size_t)row * q_ld + h * HD + col;
                x0 = qr[0];
                x1 = qr[1];
            }
            attp_split2(x0, x1, &qh[s][f], &ql[s][f]);
        }
    }

    float o[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    float m[2] = {-KINF, -KINF}, l[2] = {0.0f, 0.0f};
    const int chunks = last / ATTP_KEYS + 1;
    for (int c = 0; c < chunks; c++) {
        const int c0 = c * ATTP_KEYS;
        __syncthreads();
        // Keys as rows, values transposed; positions past the block's last row are zeros
        // (a masked key weighs exactly 0, and 0 times a zero value adds nothing).
        for (int e = threadIdx.x; e < ATTP_KEYS * HD / 8; e += blockDim.x) {
            int key = e & (ATTP_KEYS - 1), d8 = (e / ATTP_KEYS) * 8;
            uint4 kv = make_uint4(0, 0, 0, 0), vv = kv;
            if (c0 + key <= last) {
                kv = *(const uint4*)(kc + (size_t)(c0 + key) * HD + d8);
                vv = *(const uint4*)(vc + (size_t)(c0 + key) * HD + d8);
            }
            *(uint4*)(ks + key * KROW + d8) = kv;
            u32 w[4] = {vv.x, vv.y, vv.z, vv.w};
#pragma unroll
            for (int i = 0; i < 4; i++) {
                vt[(d8 + 2 * i) * VROW + key] = (u16)(w[i] & 0xffff);
                vt[(d8 + 2 * i + 1) * VROW + key] = (u16)(w[i] >> 16);
            }
        }
        __syncthreads();
        if (c0 > warp_last) continue;  // no row of this warp sees the chunk (warp-uniform)

        // Scores: s[j] is keys c0 + 8j .. c0 + 8j + 7 against rows g (0, 1) and g + 8 (2, 3).
        float s[ATTP_KEYS / 8][4];
#pragma unroll
        for (int j = 0; j < ATTP_KEYS / 8; j++) {
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
            for (int k = 0; k < KS; k++) {
                const u16* kr = ks + (8 * j + g) * KROW + 16 * k + 2 * t;
                u32 b0 = *(const u32*)kr, b1 = *(const u32*)(kr + 8);
                mma_f16(s[j], qh[k], b0, b1);
                mma_f16(s[j], ql[k], b0, b1);
            }
        }
        // Masked and scaled; each row's maximum over the chunk (a quad holds a row).
        float mx[2] = {-KINF, -KINF};
#pragma unroll
        for (int j = 0; j < ATTP_KEYS / 8; j++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int key = c0 + 8 * j + 2 * t + (e & 1);
                int p = e < 2 ? pa : pb;
                float v = key <= p ? s[j][e] * scale : -KINF;
                s[j][e] = v;
                mx[e >> 1] = fmaxf(mx[e >> 1], v);
            }
        }
        float corr[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            float mn = fmaxf(m[r], mx[r]);
            // A row that sees nothing here keeps its state (factor 1, nothing added).
            corr[r] = mn == -KINF ? 1.0f : expf(m[r] - mn);
            m[r] = mn;
        }
#pragma unroll
        for (int j = 0; j < ATTP_KEYS / 8; j++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float v = s[j][e] == -KINF ? 0.0f : expf(s[j][e] - m[e >> 1]);
                s[j][e] = v;
                sum[e >> 1] += v;
            }
        }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            // Lane t adds (t, t^1) then (t^2, t^3): the same bits in all four (a + b = b + a).
            sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 1);
            sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 2);
            l[r] = l[r] * corr[r] + sum[r];
        }
#pragma unroll
        for (int j = 0; j < NT; j++) {
            o[j][0] *= corr[0];
            o[j][1] *= corr[0];
            o[j][2] *= corr[1];
            o[j][3] *= corr[1];
        }
        // Weighted values: the probabilities' C fragments are the A fragments of the next
        // product (keys 16kk .. 16kk + 15 are score tiles 2kk and 2kk + 1).
#pragma unroll
        for (int kk = 0; kk < ATTP_KEYS / 16; kk++) {
            u32 ph[4], pl[4];
            attp_split2(s[2 * kk][0], s[2 * kk][1], &ph[0], &pl[0]);
            attp_split2(s[2 * kk][2], s[2 * kk][3], &ph[1], &pl[1]);
            attp_split2(s[2 * kk + 1][0], s[2 * kk + 1][1], &ph[2], &pl[2]);
            attp_split2(s[2 * kk + 1][2], s[2 * kk + 1][3], &ph[3], &pl[3]);
#pragma unroll
            for (int j = 0; j < NT; j++) {
                const u16* vr = vt + (8 * j + g) * VROW + 16 * kk + 2 * t;
                u32 b0 = *(const u32*)vr, b1 = *(const u32*)(vr + 8);
                mma_f16(o[j], ph, b0, b1);
                mma_f16(o[j], pl, b0, b1);
            }
        }
    }

    // out = o / l. With int8 blocks, each warp's rows go through shared memory (free now) so
    // that a warp can quantize 32 values a lane each.
    __syncthreads();
    float* stage = (float*)smem + warp * 16 * HD;
    const float inv[2] = {l[0] > 0.0f ? 1.0f / l[0] : 0.0f, l[1] > 0.0f ? 1.0f / l[1] : 0.0f};
#pragma unroll
    for (int j = 0; j < NT; j++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int rr = e < 2 ? g : g + 8, row = wr + rr;
            int col = 8 * j + 2 * t + (e & 1);
            float v = o[j][e] * inv[e >> 1];
            if (row < n) out[(size_t)row * out_ld + h * HD + col] = v;
            stage[rr * HD + col] = v;
        }
    }
    if (xq) {
        __syncwarp();
        for (int rr = 0; rr < 16 && wr + rr < n; rr++) {
#pragma unroll
            for (int b = 0; b < HD / 32; b++) {
                size_t at = (size_t)(wr + rr) * out_ld + h * HD + 32 * b;
                quant_block32(stage[rr * HD + 32 * b + lane], xq + at, xs + at / 32);
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(32 * ATTP_WARPS) attn_prefill_64(
    const float* q, int q_ld, const u16* k_cache, const u16* v_cache, int max_slots,
    int n, int n_heads, int n_kv_heads, float scale, const int* pos,
    float* out, int out_ld, i8* xq, float4* xs) {
    attn_prefill_body<64>(q, q_ld, k_cache, v_cache, max_slots, n, n_heads, n_kv_heads, scale, pos,
                          out, out_ld, xq, xs);
}

extern "C" __global__ void __launch_bounds__(32 * ATTP_WARPS) attn_prefill_128(
    const float* q, int q_ld, const u16* k_cache, const u16* v_cache, int max_slots,
    int n, int n_heads, int n_kv_heads, float scale, const int* pos,
    float* out, int out_ld, i8* xq, float4* xs) {
    attn_prefill_body<128>(q, q_ld, k_cache, v_cache, max_slots, n, n_heads, n_kv_heads, scale, pos,
                           out, out_ld, xq, xs);
}
