// Host emulation of mma.cu's PTX wrappers (gen.py puts this in their place), after the PTX ISA:
// - mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32, with g = lane / 4, t = lane % 4: A's
//   registers a0 = row g, k 4t..4t+3; a1 = row g + 8, same k; a2 = row g, k 16+4t..16+4t+3;
//   a3 = row g + 8, same k (byte i of a register is k + i); B's b0 = k 4t..4t+3 of column g,
//   b1 = k 16+4t..; C's c0 = (g, 2t), c1 = (g, 2t + 1), c2 = (g + 8, 2t), c3 = (g + 8, 2t + 1);
// - m16n8k16 .s8: a0 = row g, k 4t..4t+3; a1 = row g + 8; b0 = k 4t..4t+3 of column g; C as
//   above. Both warp-collective: the lanes' registers meet in a per-warp table between two
//   warp barriers (all 32 lanes must arrive);
// - cp.async.cg.shared.global 16: a 16-byte copy, src and dst 16-byte aligned, dst in the
//   launch's dynamic shared memory, src inside a weight buffer (+ its 64 bytes of slack);
//   commit_group closes the thread's open copies into a group; wait_group N returns once at
//   most N of the thread's groups are incomplete. Two modes (main runs both): early, a copy
//   lands at once; late, the destination is poisoned (0xA5) when the copy is issued and the
//   bytes land only at the wait that must complete its group (a read before its wait, or a
//   refill of a stage still being read, shows in the results).
struct uint2 { unsigned x, y; };
static uint2 make_uint2(unsigned a, unsigned b) { return {a, b}; }
static unsigned __vsub4(unsigned a, unsigned b) {  // per byte, modulo 256
    unsigned r = 0;
    for (int i = 0; i < 4; i++) r |= (((a >> (8 * i)) - (b >> (8 * i))) & 0xffu) << (8 * i);
    return r;
}
static unsigned g_frag[EMU_MAXT][6];
static long long g_mmas = 0;
static int sbyte(unsigned w, int i) { return (int)(signed char)(w >> (8 * i)); }
static void mma_k32(int* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    int me = threadIdx.x, w0 = me & ~31, lane = me & 31;
    u32* f = g_frag[me];
    f[0] = a0; f[1] = a1; f[2] = a2; f[3] = a3; f[4] = b0; f[5] = b1;
    warp_bar();
    int A[16][32], B[32][8];
    for (int l = 0; l < 32; l++) {
        int g = l / 4, t = l % 4;
        const u32* x = g_frag[w0 + l];
        for (int i = 0; i < 4; i++) {
            A[g][4 * t + i] = sbyte(x[0], i);
            A[g + 8][4 * t + i] = sbyte(x[1], i);
            A[g][16 + 4 * t + i] = sbyte(x[2], i);
            A[g + 8][16 + 4 * t + i] = sbyte(x[3], i);
            B[4 * t + i][g] = sbyte(x[4], i);
            B[16 + 4 * t + i][g] = sbyte(x[5], i);
        }
    }
    int g = lane / 4, t = lane % 4;
    int rows[4] = {g, g, g + 8, g + 8}, cols[4] = {2 * t, 2 * t + 1, 2 * t, 2 * t + 1};
    for (int e = 0; e < 4; e++) {
        int s = 0;
        for (int k = 0; k < 32; k++) s += A[rows[e]][k] * B[k][cols[e]];
        c[e] = s;
    }
    if (lane == 0) g_mmas++;
    warp_bar();
}
static void mma_k16(int* c, u32 a0, u32 a1, u32 b0) {
    int me = threadIdx.x, w0 = me & ~31, lane = me & 31;
    u32* f = g_frag[me];
    f[0] = a0; f[1] = a1; f[4] = b0;
    warp_bar();
    int A[16][16], B[16][8];
    for (int l = 0; l < 32; l++) {
        int g = l / 4, t = l % 4;
        const u32* x = g_frag[w0 + l];
        for (int i = 0; i < 4; i++) {
            A[g][4 * t + i] = sbyte(x[0], i);
            A[g + 8][4 * t + i] = sbyte(x[1], i);
            B[4 * t + i][g] = sbyte(x[4], i);
        }
    }
    int g = lane / 4, t = lane % 4;
    int rows[4] = {g, g, g + 8, g + 8}, cols[4] = {2 * t, 2 * t + 1, 2 * t, 2 * t + 1};
    for (int e = 0; e < 4; e++) {
        int s = 0;
        for (int k = 0; k < 16; k++) s += A[rows[e]][k] * B[k][cols[e]];
        c[e] = s;
    }
    warp_bar();
}
// cp.async, per thread: its open copies and its committed groups (oldest first).
struct CpCopy { u8* dst; const u8* src; };
static bool g_cp_late = false;
static std::vector<CpCopy> g_cp_open[EMU_MAXT];
static std::vector<std::vector<CpCopy>> g_cp_groups[EMU_MAXT];
static long long g_cp_copies = 0, g_cp_max_pending = 0;
static void mma_cp16(u8* dst, const u8* src) {
    if (((size_t)dst | (size_t)src) & 15) EMU_FAIL("cp.async not 16-byte aligned: dst %p src %p", dst, src);
    if (dst < g_dyn_smem || dst + 16 > g_dyn_smem + g_dyn_size)
        EMU_FAIL("cp.async to shared offset %zd outside the %zu dynamic bytes", (ssize_t)(dst - g_dyn_smem), g_dyn_size);
    bool in = false;
    for (auto& r : g_weights) if (src >= r.p && src + 16 <= r.p + r.len) in = true;
    if (!in) EMU_FAIL("cp.async source %p outside every weight buffer (+64 slack)", src);
    g_cp_copies++;
    if (g_cp_late) { memset(dst, 0xA5, 16); g_cp_open[threadIdx.x].push_back({dst, src}); }
    else memcpy(dst, src, 16);
}
static void mma_cp_commit() {
    auto& gs = g_cp_groups[threadIdx.x];
    gs.push_back(std::move(g_cp_open[threadIdx.x]));
    g_cp_open[threadIdx.x].clear();
    long long pending = 0;
    for (auto& g : gs) pending += !g.empty();
    g_cp_max_pending = std::max(g_cp_max_pending, pending * 1LL);
}
static void mma_cp_wait(int pending) {
    if (pending < 0 || pending > 3) EMU_FAIL("cp.async.wait_group %d", pending);
    auto& gs = g_cp_groups[threadIdx.x];
    while ((int)gs.size() > pending) {
        for (auto& c : gs.front()) memcpy(c.dst, c.src, 16);
        gs.erase(gs.begin());
    }
}
// A block must end with every copy landed (a copy still in flight is a kernel bug: it may land
// in the next block's shared memory).
static void cp_block_end() {
    for (int i = 0; i < EMU_MAXT; i++) {
        if (!g_cp_open[i].empty()) EMU_FAIL("thread %d ends with %zu copies never committed", i, g_cp_open[i].size());
        for (auto& g : g_cp_groups[i])
            if (!g.empty()) EMU_FAIL("thread %d ends with a group of %zu copies never waited for", i, g.size());
        g_cp_groups[i].clear();
    }
}
