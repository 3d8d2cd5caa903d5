// Gated DeltaNet, Qwen3.5's linear-attention layers (shared/research/qwen35.md §5): the short
// causal conv with SiLU and each head's preparation (q/k l2 norms, the gates), the gated delta
// rule over a chain or a tree of rows (with a chain's conv-state advance), the gated RMSNorm of
// its output, and the commit of a verified tree's accepted path.
//
// One layer: nk key heads of dk values, nv value heads of dv, conv_dim = 2·nk·dk + nv·dv
// channels [q | k | v]. Layouts:
// - conv taps channel-major [conv_dim][K] (the GGUF's), the last tap multiplying the current row;
// - conv state [K-1][conv_dim], the oldest input first (zeros for a fresh sequence);
// - recurrent state per value head [dv][dk], f32: column j of the CPU's dk × dv state is
//   contiguous here, so the warp that owns column j reads it in one pass;
// - prepared rows `qkv` [n][conv_dim]: q l2-normed and scaled, k l2-normed, v; `gates`
//   [n][2·nv]: the log-decay g of each value head, then its β.
// Value head h reads key head h % nk (GGUF order) or h / (nv/nk) (`grouped`, Hugging Face's).
//
// Every row is computed the same way whatever the batch: a chain row and a tree node take the
// same step (gdn_step) from the same state bits, and a tree node's state is rebuilt by replaying
// its ancestors' updates (gdn_update with their stored deltas), the very arithmetic of decoding
// them one by one; the commit replays the accepted path the same way. So a verified draft
// reproduces plain decoding bit for bit.

struct GdnShape {
    int nk, nv, dk, dv;
    int kernel;  // conv taps K
    int grouped; // 1: value head h reads key head h / (nv/nk); 0: h % nk
};

// Largest key head the recurrence holds in registers (GDN_PER_LANE values a lane).
#define GDN_MAX_DK 128
#define GDN_PER_LANE (GDN_MAX_DK / 32)
// Largest head the conv kernel keeps in shared memory.
#define GDN_MAX_HEAD 256

__device__ __forceinline__ int gdn_conv_dim(const GdnShape& s) { return 2 * s.nk * s.dk + s.nv * s.dv; }

__device__ __forceinline__ int gdn_key_head(const GdnShape& s, int h) {
    return s.grouped ? h / (s.nv / s.nk) : h % s.nk;
}

// The CPU's sigmoid (activation::sigmoid): no overflow on either side.
__device__ __forceinline__ float gdn_sigmoid(float x) {
    if (x >= 0.0f) return 1.0f / (1.0f + expf(-x));
    float e = expf(x);
    return e / (1.0f + e);
}

// The row that sits at depth `e` on row i's path: row e of a chain, the path table's entry of a
// tree (path[i][e], rows of max_depth + 1 entries).
__device__ __forceinline__ int gdn_row_at(const Batch* b, const int* path, int i, int e) {
    return b->is_chain ? e : path[i * (b->max_depth + 1) + e];
}

// Conv + SiLU of one head's channels for row i, then its preparation. Grid (n, 2·nk + nv),
// block 128: blocks y < nk take q heads (l2-normed, times q_scale), nk ≤ y < 2·nk k heads
// (l2-normed), the rest v heads (as they are; the thread 0 of each also computes its head's
// gates g = ssm_a · softplus(a + dt_bias), β = sigmoid(b)). A row's window: its K-1
// predecessors on its path (chain rows before it, a node's ancestors), reaching into the conv
// state above the pass's first row. `ba`: per row b then a (2·nv values).
extern "C" __global__ void __launch_bounds__(128) gdn_conv(
    GdnShape s, const float* mixed, const float* taps, const float* conv_state, const float* ba,
    const float* ssm_a, const float* dt_bias, float q_scale, const Batch* batch, const int* pos,
    const int* path, float* qkv, float* gates) {
    wait_for_predecessor();
    __shared__ float head[GDN_MAX_HEAD];
    __shared__ float red[32];
    int i = blockIdx.x, y = blockIdx.y;
    int cd = gdn_conv_dim(s), kd = s.nk * s.dk, hist = s.kernel - 1;
    int first, width;
    float scale = 1.0f;
    bool is_key = y < 2 * s.nk;
    if (y < s.nk) {
        first = y * s.dk;
        width = s.dk;
        scale = q_scale;
    } else if (is_key) {
        first = kd + (y - s.nk) * s.dk;
        width = s.dk;
    } else {
        first = 2 * kd + (y - 2 * s.nk) * s.dv;
        width = s.dv;
    }
    int depth = pos[i] - batch->past;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < width; c += blockDim.x) {
        int ch = first + c;
        float acc = 0.0f;
        for (int j = 0; j < s.kernel; j++) {
            int e = depth - hist + j;
            float x = e >= 0 ? mixed[(size_t)gdn_row_at(batch, path, i, e) * cd + ch]
                             : conv_state[(size_t)(hist + e) * cd + ch];
            float w = taps[(size_t)ch * s.kernel + j];
            acc = j == 0 ? x * w : acc + x * w;
        }
        float v = acc * gdn_sigmoid(acc);
        head[c] = v;
        ss += v * v;
    }
    if (is_key) {
        float total = block_sum(ss, red);
        float f = scale / sqrtf(total + 1e-6f);
        for (int c = threadIdx.x; c < width; c += blockDim.x) head[c] = head[c] * f;
    }
    for (int c = threadIdx.x; c < width; c += blockDim.x) qkv[(size_t)i * cd + first + c] = head[c];
    if (!is_key && threadIdx.x == 0) {
        int h = y - 2 * s.nk;
        float x = ba[(size_t)i * 2 * s.nv + s.nv + h] + dt_bias[h];
        float softplus = x > 20.0f ? x : log1pf(expf(x));
        gates[(size_t)i * 2 * s.nv + h] = ssm_a[h] * softplus;
        gates[(size_t)i * 2 * s.nv + s.nv + h] = gdn_sigmoid(ba[(size_t)i * 2 * s.nv + h]);
    }
}

// After a chain pass's gdn_conv: the conv state becomes the last K-1 inputs of [state | rows]
// (a tree pass leaves it; its commit moves it). Channels first..last by a block, a thread per
// channel, rows in order (each reads a later row than it writes).
__device__ void gdn_conv_advance(const GdnShape& s, const float* mixed, float* conv_state, int n, int first,
                                 int last) {
    int cd = gdn_conv_dim(s), hist = s.kernel - 1;
    for (int c = first + threadIdx.x; c < last && c < cd; c += blockDim.x)
        for (int r = 0; r < hist; r++) {
            int v = n + r;
            conv_state[(size_t)r * cd + c] =
                v < hist ? conv_state[(size_t)v * cd + c] : mixed[(size_t)(v - hist) * cd + c];
        }
}

// Column j's part of one recurrent step (a warp; lane l holds state rows l, l + 32, …):
// kv = Sᵀk, sq = Sᵀq and q·k summed in a fixed order, then δ = β(v − α·kv) and the output
// o = α·sq + (q·k)·δ (the updated state read with q), as the CPU's recurrent form.
__device__ __forceinline__ void gdn_step(const float* st, const float* q, const float* k, int dk, int lane,
                                         float v, float alpha, float beta, float* o, float* delta) {
    float kv = 0.0f, sq = 0.0f, qk = 0.0f;
#pragma unroll
    for (int r = 0; r < GDN_PER_LANE; r++) {
        int i = lane + 32 * r;
        if (i < dk) {
            float ki = k[i], qi = q[i];
            kv = kv + st[r] * ki;
            sq = sq + st[r] * qi;
            qk = qk + qi * ki;
        }
    }
    kv = warp_sum(kv);
    sq = warp_sum(sq);
    qk = warp_sum(qk);
    float d = beta * (v - alpha * kv);
    *delta = d;
    *o = alpha * sq + qk * d;
}

// Column j's state update S = α·S + k ⊗ δ: decoding's, a tree node's replay of its ancestors
// and the commit's replay all take it.
__device__ __forceinline__ void gdn_update(float* st, const float* k, int dk, int lane, float alpha, float delta) {
#pragma unroll
    for (int r = 0; r < GDN_PER_LANE; r++) {
        int i = lane + 32 * r;
        if (i < dk) st[r] = alpha * st[r] + k[i] * delta;
    }
}

// The gated delta rule over a pass's rows: grid (nv + 1, ceil(dv / 4)), block 128, a warp per
// state column j of value head blockIdx.x; the blocks of x = nv advance a chain's conv state
// past its rows `mixed` (gdn_conv, the kernel before, has read it). A chain runs its rows in order from the layer's
// state and leaves the state after the last; a tree reads the state only: a node steps from
// its parent's state, which is the warp's running state when the parent is the node before
// it, else rebuilt from the committed state by replaying the node's ancestors' updates (their
// deltas, written by this warp for earlier nodes: a parent comes before its children). A chain
// of nodes costs a step and an update each. Writes each row's output `out` [n][nv·dv] and
// delta `deltas` [n][nv·dv].
extern "C" __global__ void __launch_bounds__(128) gdn_recurrence(
    GdnShape s, const float* qkv, const float* gates, float* state, const Batch* batch, const int* pos,
    const int* path, float* out, float* deltas, const float* mixed, float* conv_state) {
    wait_for_predecessor();
    if ((int)blockIdx.x == s.nv) {
        if (!batch->is_chain) return;
        int per = (gdn_conv_dim(s) + gridDim.y - 1) / gridDim.y;
        gdn_conv_advance(s, mixed, conv_state, batch->n, blockIdx.y * per, (blockIdx.y + 1) * per);
        return;
    }
    int h = blockIdx.x, lane = threadIdx.x & 31;
    int j = blockIdx.y * 4 + (threadIdx.x >> 5);
    if (j >= s.dv) return;
    int cd = gdn_conv_dim(s), kd = s.nk * s.dk, vd = s.nv * s.dv, dk = s.dk;
    int kh = gdn_key_head(s, h);
    float* col = state + ((size_t)h * s.dv + j) * dk;
    float st[GDN_PER_LANE];
#pragma unroll
    for (int r = 0; r < GDN_PER_LANE; r++) {
        int i = lane + 32 * r;
        st[r] = i < dk ? col[i] : 0.0f;
    }
    int n = batch->n;
    if (batch->is_chain) {
        for (int t = 0; t < n; t++) {
            const float* row = qkv + (size_t)t * cd;
            const float* k = row + kd + kh * dk;
            float alpha = expf(gates[(size_t)t * 2 * s.nv + h]);
            float beta = gates[(size_t)t * 2 * s.nv + s.nv + h];
            float o, d;
            gdn_step(st, row + kh * dk, k, dk, lane, row[2 * kd + h * s.dv + j], alpha, beta, &o, &d);
            gdn_update(st, k, dk, lane, alpha, d);
            if (lane == 0) {
                out[(size_t)t * vd + h * s.dv + j] = o;
                deltas[(size_t)t * vd + h * s.dv + j] = d;
            }
        }
#pragma unroll
        for (int r = 0; r < GDN_PER_LANE; r++) {
            int i = lane + 32 * r;
            if (i < dk) col[i] = st[r];
        }
        return;
    }
    // `cur` holds the state after node `at` (-1: the committed state). A node whose parent is
    // `at` (the next node of a chain, a first child) steps from it; another rebuilds its
    // parent's state from the committed one by replaying its ancestors' updates.
    int width = batch->max_depth + 1, at = -1;
    float cur[GDN_PER_LANE];
#pragma unroll
    for (int r = 0; r < GDN_PER_LANE; r++) cur[r] = st[r];
    for (int t = 0; t < n; t++) {
        int depth = pos[t] - batch->past;
        int parent = depth == 0 ? -1 : path[t * width + depth - 1];
        if (parent != at) {
#pragma unroll
            for (int r = 0; r < GDN_PER_LANE; r++) cur[r] = st[r];
            for (int e = 0; e < depth; e++) {
                int a = path[t * width + e];
                const float* ka = qkv + (size_t)a * cd + kd + kh * dk;
                float alpha_a = expf(gates[(size_t)a * 2 * s.nv + h]);
                gdn_update(cur, ka, dk, lane, alpha_a, deltas[(size_t)a * vd + h * s.dv + j]);
            }
        }
        const float* row = qkv + (size_t)t * cd;
        const float* k = row + kd + kh * dk;
        float alpha = expf(gates[(size_t)t * 2 * s.nv + h]);
        float beta = gates[(size_t)t * 2 * s.nv + s.nv + h];
        float o, d;
        gdn_step(cur, row + kh * dk, k, dk, lane, row[2 * kd + h * s.dv + j], alpha, beta, &o, &d);
        if (lane == 0) {
            out[(size_t)t * vd + h * s.dv + j] = o;
            deltas[(size_t)t * vd + h * s.dv + j] = d;
        }
        // The delta is read back by this warp when a later node replays this one.
        __syncwarp();
        gdn_update(cur, k, dk, lane, alpha, d);
        at = t;
    }
}

// The output of a row: per value head, RMSNorm over dv with the plain weight w, times
// silu(z); in place in `o` [n][nv·dv], then its int8 blocks when xq is set. Grid (n, nv) when
// dv is a multiple of 32 (a block per head, its own int8 blocks), else (n, 1) (a block per row,
// its heads in turn; nv·dv a multiple of 32). Block 128.
extern "C" __global__ void __launch_bounds__(128) gdn_out(GdnShape s, float* o, const float* z, const float* w,
                                                         float eps, i8* xq, float4* xs) {
    wait_for_predecessor();
    __shared__ float red[32];
    int i = blockIdx.x, dv = s.dv, vd = s.nv * s.dv;
    int first = gridDim.y == 1 ? 0 : blockIdx.y, last = gridDim.y == 1 ? s.nv : blockIdx.y + 1;
    float* orow = o + (size_t)i * vd;
    const float* zrow = z + (size_t)i * vd;
    for (int h = first; h < last; h++) {
        float ss = 0.0f;
        for (int c = threadIdx.x; c < dv; c += blockDim.x) {
            float x = orow[h * dv + c];
            ss += x * x;
        }
        float total = block_sum(ss, red);
        float scale = 1.0f / sqrtf(total / (float)dv + eps);
        for (int c = threadIdx.x; c < dv; c += blockDim.x) {
            float zz = zrow[h * dv + c];
            orow[h * dv + c] = orow[h * dv + c] * scale * w[c] * (zz * gdn_sigmoid(zz));
        }
    }
    __syncthreads();
    if (!xq) return;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int b = first * dv / 32 + warp; b < last * dv / 32; b += nw)
        quant_block32(orow[32 * b + lane], xq + (size_t)i * vd + 32 * b, xs + (size_t)i * (vd / 32) + b);
}

// Commits the accepted path (`path`: len node indices, root first) of the tree every GDN
// layer verified last: each layer's state replays the path's updates in order. Grid (nv,
// ceil(dv / 4), layers), block 128; layer l's state at state + l·state_stride, its tree rows
// (qkv, gates, deltas) at l times their strides.
extern "C" __global__ void __launch_bounds__(128) gdn_commit_state(
    GdnShape s, float* state, long long state_stride, const float* qkv, long long qkv_stride,
    const float* gates, long long gates_stride, const float* deltas, long long deltas_stride,
    const int* path, int len) {
    wait_for_predecessor();
    int h = blockIdx.x, lane = threadIdx.x & 31, layer = blockIdx.z;
    int j = blockIdx.y * 4 + (threadIdx.x >> 5);
    if (j >= s.dv) return;
    int cd = gdn_conv_dim(s), kd = s.nk * s.dk, vd = s.nv * s.dv, dk = s.dk;
    int kh = gdn_key_head(s, h);
    float* col = state + layer * state_stride + ((size_t)h * s.dv + j) * dk;
    qkv += layer * qkv_stride;
    gates += layer * gates_stride;
    deltas += layer * deltas_stride;
    float st[GDN_PER_LANE];
#pragma unroll
    for (int r = 0; r < GDN_PER_LANE; r++) {
        int i = lane + 32 * r;
        st[r] = i < dk ? col[i] : 0.0f;
    }
    for (int t = 0; t < len; t++) {
        int a = path[t];
        float alpha = expf(gates[(size_t)a * 2 * s.nv + h]);
        gdn_update(st, qkv + (size_t)a * cd + kd + kh * dk, dk, lane, alpha, deltas[(size_t)a * vd + h * s.dv + j]);
    }
#pragma unroll
    for (int r = 0; r < GDN_PER_LANE; r++) {
        int i = lane + 32 * r;
        if (i < dk) col[i] = st[r];
    }
}

// The conv state of every GDN layer after the accepted path: its last K-1 inputs (from the
// old state where the path is shorter). Grid (ceil(conv_dim / 128), layers), block 128.
extern "C" __global__ void gdn_commit_conv(GdnShape s, float* conv_state, long long conv_stride,
                                           const float* mixed, long long mixed_stride, const int* path,
                                           int len) {
    wait_for_predecessor();
    int cd = gdn_conv_dim(s), hist = s.kernel - 1;
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cd) return;
    float* st = conv_state + blockIdx.y * conv_stride;
    const float* x = mixed + blockIdx.y * mixed_stride;
    // Row r takes the path's input at depth len - hist + r, or the old state's row len + r.
    for (int r = 0; r < hist; r++) {
        int e = len - hist + r;
        st[(size_t)r * cd + c] = e >= 0 ? x[(size_t)path[e] * cd + c] : st[(size_t)(hist + e) * cd + c];
    }
}
