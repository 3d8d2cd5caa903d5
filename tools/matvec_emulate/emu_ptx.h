// Host emulation of matvec_stream's PTX (gen.py puts these calls in place of the asm), after
// the PTX ISA:
// - mbarrier.init [bar], count: the current phase 0, `count` pending arrivals, tx-count 0;
// - mbarrier.arrive.expect_tx [bar], bytes: tx-count += bytes, then one arrival;
// - cp.async.bulk.shared.global.mbarrier::complete_tx::bytes [dst], [src], bytes, [bar]: the
//   copy, then tx-count -= bytes; src, dst and bytes 16-byte aligned / a multiple of 16;
// - a phase completes when its pending arrivals and its tx-count are both zero: the phase
//   number advances and the pending arrivals are reset to `count`;
// - mbarrier.try_wait.parity [bar], P: true once the phase of parity P has completed, i.e.
//   while the current phase's parity differs from P.
// Two modes (main runs both): early, a bulk copy lands at once; late, the stage is poisoned
// (0xA5) when the copy is asked for and the bytes land at the second try_wait poll on its
// barrier, so a read of a stage before its wait shows in the results. Every fetch checks
// alignment, that dst lies in one stage of the launch's dynamic shared memory and that src
// lies in a weight buffer plus its 64 bytes of slack; a wait that spins 100000 times aborts;
// a block that ends with a copy in flight is reported.
struct MBar {
    int count = 0, pending = 0;
    long long tx = 0;
    unsigned phase = 0;
    int polls = 0;
    struct Copy { u8* dst; const u8* src; u32 bytes; };
    std::vector<Copy> inflight;
};
static std::map<const void*, MBar> g_mbar;
static bool g_late_copies = false;
static int g_stage_bytes = 0;       // the launch's stream_stage_bytes
static long long g_fetches = 0, g_fetch_bytes = 0, g_max_spin = 0;
static int g_spin[EMU_MAXT];
static void block_start() {
    g_mbar.clear();  // shared memory starts undefined: a wait before init is caught
    memset(g_dyn_smem, 0xA5, sizeof g_dyn_smem);
    memset(g_spin, 0, sizeof g_spin);
    for (auto& s : g_shared) memset(s.first, 0xFF, s.second);
}
static void block_end() {
    for (auto& [p, m] : g_mbar)
        if (m.tx || !m.inflight.empty() || m.pending != m.count)
            EMU_FAIL("block ends with an mbarrier phase open (tx %lld, %zu copies in flight)", m.tx, m.inflight.size());
}
static void mbar_check_phase(MBar& m) {
    if (m.pending == 0 && m.tx == 0) { m.phase++; m.pending = m.count; m.polls = 0; }
}
static MBar& mbar_get(const void* bar) {
    auto it = g_mbar.find(bar);
    if (it == g_mbar.end()) EMU_FAIL("mbarrier %p used before mbarrier.init", bar);
    return it->second;
}
static void emu_mbar_init(u64* bar, int count) {
    if ((size_t)bar & 7) EMU_FAIL("mbarrier not 8-byte aligned");
    MBar m; m.count = m.pending = count;
    g_mbar[bar] = m;
}
static void land(MBar& m, const MBar::Copy& c) {
    memcpy(c.dst, c.src, c.bytes);
    m.tx -= c.bytes;
}
static void emu_fetch(u64* bar, u8* dst, const u8* src, u32 bytes) {
    MBar& m = mbar_get(bar);
    if (((size_t)dst | (size_t)src | bytes) & 15) EMU_FAIL("bulk copy not 16-byte aligned: dst %p src %p bytes %u", dst, src, bytes);
    if (bytes == 0) EMU_FAIL("bulk copy of 0 bytes");
    if (dst < g_dyn_smem || dst + bytes > g_dyn_smem + g_dyn_size)
        EMU_FAIL("bulk copy to shared [%zd, +%u) outside the %zu dynamic bytes", (ssize_t)(dst - g_dyn_smem), bytes, g_dyn_size);
    size_t off = dst - g_dyn_smem;
    if (g_stage_bytes <= 0 || off % g_stage_bytes || bytes > (u32)g_stage_bytes)
        EMU_FAIL("bulk copy at shared offset %zu of %u bytes: not one stage of %d", off, bytes, g_stage_bytes);
    bool in = false;
    for (auto& r : g_weights) if (src >= r.p && src + bytes <= r.p + r.len) in = true;
    if (!in) EMU_FAIL("bulk copy source [%p, +%u) outside every weight buffer (+64 slack)", src, bytes);
    // arrive.expect_tx
    if (m.pending <= 0) EMU_FAIL("arrive on an mbarrier with no pending arrival");
    m.tx += bytes;
    m.pending--;
    // cp.async.bulk ... complete_tx
    g_fetches++; g_fetch_bytes += bytes;
    MBar::Copy c{dst, src, bytes};
    if (g_late_copies) { memset(dst, 0xA5, bytes); m.inflight.push_back(c); }
    else { land(m, c); mbar_check_phase(m); }
}
static u32 emu_try_wait(u64* bar, u32 parity) {
    MBar& m = mbar_get(bar);
    if (!m.inflight.empty() && ++m.polls >= 2) {
        for (auto& c : m.inflight) land(m, c);
        m.inflight.clear();
        mbar_check_phase(m);
    }
    bool ok = (m.phase & 1) != (parity & 1);
    int& s = g_spin[threadIdx.x];
    if (ok) { g_max_spin = std::max<long long>(g_max_spin, s); s = 0; }
    else if (++s > 100000) EMU_FAIL("mbarrier wait (parity %u, phase %u) spins forever", parity, m.phase);
    return ok;
}
