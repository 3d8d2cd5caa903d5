// The host emulation's driver for mma.cu: runs quantize_acts and mma_1/2/4/8 (the real source,
// see gen.py) on the CPU with their parameters filled as kernels/mod.rs fills them (mma_split,
// mma_stride, mma_stages ported below), and checks
//   (a) every block format against f64 products of the dequantized weights (dequant_one) and
//       the int8-dequantized activations, rows beyond n and columns beyond a segment's rows
//       left alone, bias and residual epilogues, 1..3 segments (mixed formats);
//   (b) batch invariance: each activation row's bits the same at every n, and a row computed
//       alone (n = 1, its activations at the start of the buffers) equal to its bits in the
//       largest batch;
//   (c) the ring changes no bit: 1..4 stages, copies landing at once or at the last wait
//       that must complete them, fibers scheduled in either order;
//   (d) the fused argmax (one segment) against the argmax of the written outputs;
//   (e) reads: no weight read outside the buffers (+64 slack), no copy outside the launch's
//       dynamic shared memory, no misaligned copy, every copy waited for.
#define MATVEC_WARPS 4
#define MMA_SHARED_MAX (80 * 1024)
static unsigned g_seed = 12345;
static unsigned rnd() { g_seed = g_seed * 1103515245u + 12345u; return g_seed >> 8; }
static float frand() { return ((int)(rnd() % 2001) - 1000) * 0.001f; }
struct Fmt { int id, bs, bb; const char* name; };
static const Fmt FMTS[] = {{FMT_Q4_0, 32, 18, "Q4_0"}, {FMT_Q4_1, 32, 20, "Q4_1"}, {FMT_Q5_0, 32, 22, "Q5_0"},
                           {FMT_Q5_1, 32, 24, "Q5_1"}, {FMT_Q8_0, 32, 34, "Q8_0"}, {FMT_Q4_K, 256, 144, "Q4_K"},
                           {FMT_Q5_K, 256, 176, "Q5_K"}, {FMT_Q6_K, 256, 210, "Q6_K"}};
static const Fmt& fmt_of(int id) { for (auto& f : FMTS) if (f.id == id) return f; abort(); }

// ---- weights: a 256-byte aligned allocation (+ `offset` bytes, to try unaligned matrices)
// with 64 bytes of slack past the matrix, registered for the bounds checks.
struct WBuf {
    u8* base = nullptr; u8* p = nullptr; size_t len = 0;
    WBuf(size_t n, int offset) : len(n) {
        base = (u8*)aligned_alloc(256, (n + offset + 64 + 255) / 256 * 256);
        p = base + offset;
        g_weights.push_back({base, offset + n + 64});  // from the 16-byte line of its first byte
    }
    ~WBuf() { for (size_t i = 0; i < g_weights.size(); i++) if (g_weights[i].p == p) { g_weights.erase(g_weights.begin() + i); break; } free(base); }
    WBuf(const WBuf&) = delete;
};
static std::unique_ptr<WBuf> make_weights(int fmt, int rows, int cols, long long* row_bytes, int offset) {
    const Fmt& f = fmt_of(fmt);
    *row_bytes = (long long)cols / f.bs * f.bb;
    auto w = std::make_unique<WBuf>((size_t)rows * *row_bytes, offset);
    for (size_t i = 0; i < w->len + 64; i++) w->p[i] = rnd() & 255;
    for (int r = 0; r < rows; r++) {
        u8* row = w->p + (size_t)r * *row_bytes;
        for (int b = 0; b < cols / f.bs; b++) {
            u8* p = row + (size_t)b * f.bb;
            u16 d = f2h(0.0005f * (rnd() % 100 + 1)), m = f2h(0.0005f * ((int)(rnd() % 201) - 100));
            if (fmt == FMT_Q6_K) memcpy(p + 208, &d, 2);
            else { memcpy(p, &d, 2); if (fmt != FMT_Q4_0 && fmt != FMT_Q5_0 && fmt != FMT_Q8_0) memcpy(p + 2, &m, 2); }
        }
    }
    return w;
}

// ---- the launcher's arithmetic (kernels/mod.rs)
static int mma_split_of(int cols, int units) { return std::clamp(((cols + 255) / 256 + units - 1) / units, 1, MMA_MAX_SPLIT); }
static int sup_bytes(int fmt) {
    switch (fmt) { case FMT_Q4_0: return 144; case FMT_Q4_1: return 160; case FMT_Q5_0: return 176; case FMT_Q5_1: return 192;
    case FMT_Q8_0: return 272; case FMT_Q4_K: return 144; case FMT_Q5_K: return 176; default: return 210; }
}
static int mma_stride_of(const MatArgs& a) {
    int need = 16;
    for (int i = 0; i < a.nseg; i++) {
        int sup = sup_bytes(a.seg[i].fmt);
        int n = ((size_t)a.seg[i].w % 16 == 0 && a.seg[i].row_bytes % 16 == 0 && sup % 16 == 0) ? sup : (sup + 30 + 15) / 16 * 16;
        need = std::max(need, n);
    }
    return 16 * (((need + 15) / 16) | 1);
}
static int mma_stages_of(int cols, int split, int stride, long long budget) {
    int most = std::clamp(((cols + 255) / 256 + split - 1) / split, 1, 4);
    return (int)std::clamp(budget / ((long long)split * 16 * stride), 1LL, (long long)most);
}
static int nt_of(int n) { return n <= 8 ? 1 : n <= 16 ? 2 : n <= 32 ? 4 : 8; }

struct Cfg { int units, max_stages; bool late, reverse; };
struct RunInfo { int split, stages, stride; unsigned grid; };
static RunInfo run_mma(MatArgs a, const Cfg& c) {
    RunInfo ri;
    ri.split = a.split = mma_split_of(a.cols, c.units);
    ri.stride = a.stream_stage_bytes = mma_stride_of(a);
    ri.stages = a.stream_stages = std::min(c.max_stages, mma_stages_of(a.cols, a.split, a.stream_stage_bytes, MMA_SHARED_MAX));
    g_dyn_size = (size_t)a.split * a.stream_stages * 16 * a.stream_stage_bytes;
    if (g_dyn_size > MMA_SHARED_MAX) EMU_FAIL("ring of %zu bytes", g_dyn_size);
    unsigned tiles = 0;
    for (int i = 0; i < a.nseg; i++) tiles += (a.seg[i].rows + 15) / 16;
    ri.grid = tiles;
    g_cp_late = c.late; g_reverse = c.reverse;
    int nt = nt_of(a.n);
    for (unsigned b = 0; b < tiles; b++) {
        launch(1, a.split * 32, [&] {
            blockIdx.x = b; gridDim.x = tiles;
            if (nt == 1) mma_1(a); else if (nt == 2) mma_2(a); else if (nt == 4) mma_4(a); else mma_8(a);
        });
        cp_block_end();
    }
    g_reverse = false; g_cp_late = false;
    return ri;
}

// ---- activations: f32 rows (stride ldx) and their int8 blocks from quantize_acts
struct Acts { std::vector<i8> q; std::vector<float4> s; int ldx, n; };
static Acts make_acts(int n, int ldx, int cols) {
    Acts A; A.ldx = ldx; A.n = n;
    std::vector<float> xc((size_t)n * cols);
    for (int r = 0; r < n; r++) for (int c = 0; c < cols; c++) {
        float v = frand() * 2.0f;
        if ((c / 32) % 7 == 3) v *= 0.01f;                  // blocks of very different scales
        if ((c / 32) % 5 == 4) v = 0;                       // all-zero blocks
        xc[(size_t)r * cols + c] = v;
    }
    std::vector<i8> q((size_t)n * cols); std::vector<float4> s((size_t)n * cols / 32);
    long long nb = (long long)n * cols / 32;
    launch((unsigned)((nb * 32 + 127) / 128), 128, [&] { quantize_acts(xc.data(), nb, q.data(), s.data()); });
    A.q.assign((size_t)n * ldx, 0x55); A.s.assign((size_t)n * ldx / 32, {NAN, NAN, NAN, NAN});
    for (int r = 0; r < n; r++) {
        memcpy(&A.q[(size_t)r * ldx], &q[(size_t)r * cols], cols);
        memcpy(&A.s[(size_t)r * ldx / 32], &s[(size_t)r * cols / 32], cols / 32 * 16);
    }
    return A;
}
static double act_value(const Acts& A, int r, int c) {
    return (double)A.s[((size_t)r * A.ldx) / 32 + c / 32].x * A.q[(size_t)r * A.ldx + c];
}

static bool same_bits(const void* a, const void* b, size_t n) { return memcmp(a, b, n) == 0; }
static int g_fails = 0, g_checks = 0;
static void report(bool ok, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static void report(bool ok, const char* fmt, ...) {
    g_checks++; if (!ok) g_fails++;
    printf("%s ", ok ? "ok  " : "FAIL");
    va_list ap; va_start(ap, fmt); vprintf(fmt, ap); va_end(ap); printf("\n"); fflush(stdout);
}

// ---- a product of 1..3 segments
struct SegSpec { int fmt, rows, ldy_extra; bool bias, acc; int offset = 0; };
struct Prod {
    int cols, ldx; std::vector<SegSpec> specs;
    std::vector<std::unique_ptr<WBuf>> w; std::vector<long long> rb;
    std::vector<std::vector<float>> bias, init, y;
    std::vector<u64> best;
    Acts A;
    std::vector<i8> qn; std::vector<float4> sn;
    // Arguments for n activation rows starting at row `from` (exactly those rows readable).
    MatArgs args(int n, int from = 0, bool with_best = false) {
        MatArgs a{};
        for (size_t i = 0; i < specs.size(); i++) {
            y[i] = init[i];
            // rows from `from`: the residual adds their initial outputs
            size_t ldy = specs[i].rows + specs[i].ldy_extra;
            if (from) memcpy(y[i].data(), init[i].data() + from * ldy, n * ldy * 4);
            a.seg[i] = {w[i]->p, y[i].data(), specs[i].bias ? bias[i].data() : nullptr, rb[i], specs[i].fmt, specs[i].rows,
                        specs[i].rows + specs[i].ldy_extra, specs[i].acc ? 1 : 0, nullptr};
        }
        if (with_best) { best.assign(n, 0); a.seg[0].best = best.data(); }
        qn.assign(A.q.begin() + (size_t)from * ldx, A.q.begin() + (size_t)(from + n) * ldx);
        sn.assign(A.s.begin() + (size_t)from * ldx / 32, A.s.begin() + (size_t)(from + n) * ldx / 32);
        g_acts = {{(const u8*)qn.data(), qn.size()}, {(const u8*)sn.data(), sn.size() * 16}};
        a.xq = qn.data(); a.xs = sn.data();
        a.nseg = specs.size(); a.cols = cols; a.n = n; a.ldx = ldx;
        return a;
    }
};
static void setup(Prod& P, int cols, int ldx, std::vector<SegSpec> specs, int nmax) {
    P.cols = cols; P.ldx = ldx; P.specs = specs;
    for (auto& s : specs) {
        long long rb; P.w.push_back(make_weights(s.fmt, s.rows, cols, &rb, s.offset)); P.rb.push_back(rb);
        std::vector<float> b(s.rows), in((size_t)nmax * (s.rows + s.ldy_extra));
        for (auto& v : b) v = frand(); for (auto& v : in) v = frand() * 3;
        P.bias.push_back(b); P.init.push_back(in); P.y.push_back(in);
    }
    P.A = make_acts(nmax, ldx, cols);
}
// Max error of the outputs against f64 (relative to Σ|w·x| + |bias| + |init|), and whether
// everything outside the n × rows outputs kept its initial bits.
static double check_ref(Prod& P, int n, bool* untouched) {
    double err = 0;
    *untouched = true;
    std::vector<double> wd(P.cols);
    for (size_t i = 0; i < P.specs.size(); i++) {
        const SegSpec& s = P.specs[i]; int ldy = s.rows + s.ldy_extra;
        for (int j = 0; j < s.rows; j++) {
            for (int c = 0; c < P.cols; c++) wd[c] = dequant_one(P.w[i]->p + (size_t)j * P.rb[i], s.fmt, c);
            for (int r = 0; r < n; r++) {
                double sum = 0, mag = 0;
                for (int c = 0; c < P.cols; c++) { double t = wd[c] * act_value(P.A, r, c); sum += t; mag += fabs(t); }
                double init = P.init[i][(size_t)r * ldy + j], b = s.bias ? P.bias[i][j] : 0;
                double want = sum + b + (s.acc ? init : 0);
                mag += fabs(b) + (s.acc ? fabs(init) : 0);
                double got = P.y[i][(size_t)r * ldy + j];
                double e = std::isfinite(got) ? fabs(got - want) / std::max(mag, 1e-30) : INFINITY;
                err = std::max(err, e);
            }
        }
        for (size_t k = 0; k < P.y[i].size(); k++) {
            int r = k / ldy, j = k % ldy;
            if ((r >= n || j >= s.rows) && !same_bits(&P.y[i][k], &P.init[i][k], 4)) *untouched = false;
        }
    }
    return err;
}
static std::string describe(const std::vector<SegSpec>& specs) {
    std::string s;
    for (auto& x : specs) {
        char b[80]; snprintf(b, sizeof b, "%s%s:%d%s%s", s.empty() ? "" : "+", fmt_of(x.fmt).name, x.rows, x.bias ? "b" : "", x.acc ? "a" : "");
        s += b;
        if (x.ldy_extra) { snprintf(b, sizeof b, "(ldy+%d)", x.ldy_extra); s += b; }
        if (x.offset) { snprintf(b, sizeof b, "(at +%d)", x.offset); s += b; }
    }
    return s;
}
static const double REL_BOUND = 1e-5;
// The ring configurations each case runs besides the default one: (super-blocks a warp, most
// stages, copies late, fibers in reverse order).
static const Cfg DEFAULT_CFG = {1, 4, false, false};
static const Cfg RING_CFGS[] = {{1, 1, true, false}, {2, 1, true, true}, {2, 2, true, false}, {3, 4, false, true},
                                {4, 2, true, false}, {8, 3, true, true},  {8, 4, true, false}};
static bool same_y(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
    for (size_t i = 0; i < a.size(); i++) if (!same_bits(a[i].data(), b[i].data(), a[i].size() * 4)) return false;
    return true;
}

static void product_case(int cols, int ldx, std::vector<SegSpec> specs, std::vector<int> ns, bool rings) {
    int nmax = *std::max_element(ns.begin(), ns.end());
    Prod P; setup(P, cols, ldx, specs, nmax);
    // Per units: the outputs at the largest n (the reference for invariance).
    std::map<int, std::vector<std::vector<float>>> big;
    double worst = 0; bool ok_ref = true, ok_untouched = true, ok_inv = true, ok_alone = true, ok_ring = true, ok_best = true;
    std::string splits;
    std::vector<int> sorted = ns; std::sort(sorted.rbegin(), sorted.rend());
    std::vector<Cfg> cfgs = {DEFAULT_CFG};
    if (rings) for (auto& c : RING_CFGS) cfgs.push_back(c);
    int ring_runs = 0;
    for (const Cfg& cfg : cfgs) {
        for (int n : sorted) {
            MatArgs a = P.args(n);
            RunInfo ri = run_mma(a, cfg);
            auto out = P.y;
            bool untouched; double e = check_ref(P, n, &untouched);
            worst = std::max(worst, e); ok_ref &= e < REL_BOUND; ok_untouched &= untouched;
            if (n == nmax) {
                char b[64]; snprintf(b, sizeof b, " u%d:%dx%d(%d)%s", cfg.units, ri.split, ri.stages, ri.stride, cfg.late ? "L" : "");
                if (rings || cfg.units == 1) splits += b;
            }
            // (c) the same bits as the default ring of the same split
            auto key = mma_split_of(cols, cfg.units);
            if (!big.count(key)) big[key] = out;
            else {
                ring_runs++;
                for (size_t i = 0; i < specs.size(); i++) {
                    size_t len = (size_t)n * (specs[i].rows + specs[i].ldy_extra);
                    bool same = same_bits(out[i].data(), big[key][i].data(), len * 4);
                    if (n == nmax) ok_ring &= same; else ok_inv &= same;
                }
            }
        }
        if (&cfg != &cfgs[0]) continue;
        // (b) each row alone, from the start of the buffers
        auto key = mma_split_of(cols, cfg.units);
        for (int r = 0; r < nmax; r += std::max(1, nmax / 5)) {
            MatArgs a = P.args(1, r);
            run_mma(a, cfg);
            for (size_t i = 0; i < specs.size(); i++) {
                int ldy = specs[i].rows + specs[i].ldy_extra;
                for (int j = 0; j < specs[i].rows; j++) {
                    float alone = P.y[i][j], batch = big[key][i][(size_t)r * ldy + j];
                    ok_alone &= same_bits(&alone, &batch, 4);
                }
            }
        }
        // (d) the fused argmax of each row, against the outputs it wrote
        if (specs.size() == 1) {
            const int nb = std::min(nmax, MATVEC_MAX_ROWS);  // the launcher's bound for a fused argmax
            MatArgs a = P.args(nb, 0, true);
            run_mma(a, cfg);
            int ldy = specs[0].rows + specs[0].ldy_extra;
            for (int r = 0; r < nb; r++) {
                int bj = 0;
                for (int j = 1; j < specs[0].rows; j++) if (P.y[0][(size_t)r * ldy + j] > P.y[0][(size_t)r * ldy + bj]) bj = j;
                ok_best &= (u32)(0xFFFFFFFFu - (u32)P.best[r]) == (u32)bj;
            }
        }
    }
    std::string nl; for (int n : ns) nl += std::to_string(n) + ",";
    nl.pop_back();
    bool reads = g_bad_reads == 0 && g_misaligned == 0;
    bool ok = ok_ref && ok_untouched && ok_inv && ok_alone && ok_ring && ok_best && reads;
    report(ok, "%5d cols (ldx %d) %s n=%s: rel err %.1e%s%s%s%s%s%s; split x stages (stride):%s%s", cols, ldx, describe(specs).c_str(), nl.c_str(), worst,
           ok_untouched ? "" : ", WROTE OUTSIDE its outputs", ok_inv ? "" : ", rows differ between n", ok_alone ? "" : ", a row alone differs",
           ok_ring ? "" : ", the ring changes bits", ok_best ? "" : ", fused argmax wrong", reads ? "" : ", BAD READS", splits.c_str(),
           rings ? " (all bit-identical per split)" : "");
    g_bad_reads = 0; g_misaligned = 0;
}

// ---- mma_packed.cu: each segment packed by mma_pack (one warp a chunk), then the packed
// kernels against mma_N on the GGUF bytes: the same bits at every n (outputs and the fused
// argmax), and within REL_BOUND of f64.
static int packed_chunk_of(int fmt) { return fmt == FMT_Q4_K ? PK_Q4K_CHUNK : PK_Q6K_CHUNK; }
static std::unique_ptr<WBuf> pack_emulated(const u8* w, long long rb, int fmt, int rows, int cols) {
    long long chunks = (long long)(rows + 15) / 16 * (cols / 256);
    auto out = std::make_unique<WBuf>((size_t)chunks * packed_chunk_of(fmt), 0);
    memset(out->p, 0xA5, out->len);
    g_dyn_size = 0;
    for (long long c = 0; c < chunks; c++)
        launch(1, 32, [&] { blockIdx.x = (unsigned)c; gridDim.x = (unsigned)chunks; mma_pack(w, rb, rows, cols, fmt, out->p); });
    return out;
}
static void run_packed(MatArgs a) {
    a.split = mma_split_of(a.cols, 1);
    g_dyn_size = 0;
    unsigned tiles = 0;
    for (int i = 0; i < a.nseg; i++) tiles += (a.seg[i].rows + 15) / 16;
    const int nt = nt_of(a.n), fmt = a.seg[0].fmt;
    for (unsigned b = 0; b < tiles; b++)
        launch(1, a.split * 32, [&] {
            blockIdx.x = b; gridDim.x = tiles;
            if (fmt == FMT_Q4_K) { if (nt == 1) mmap_q4k_1(a); else if (nt == 2) mmap_q4k_2(a); else if (nt == 4) mmap_q4k_4(a); else mmap_q4k_8(a); }
            else { if (nt == 1) mmap_q6k_1(a); else if (nt == 2) mmap_q6k_2(a); else if (nt == 4) mmap_q6k_4(a); else mmap_q6k_8(a); }
        });
}
static void packed_case(int cols, int ldx, std::vector<SegSpec> specs, std::vector<int> ns) {
    int nmax = *std::max_element(ns.begin(), ns.end());
    Prod P; setup(P, cols, ldx, specs, nmax);
    std::vector<std::unique_ptr<WBuf>> pk;
    for (size_t i = 0; i < specs.size(); i++) pk.push_back(pack_emulated(P.w[i]->p, P.rb[i], specs[i].fmt, specs[i].rows, cols));
    double worst = 0; bool same = true, ok_ref = true, ok_best = true;
    for (int n : ns) {
        MatArgs a = P.args(n);
        run_mma(a, DEFAULT_CFG);
        auto want = P.y;
        a = P.args(n);
        for (size_t i = 0; i < specs.size(); i++) a.seg[i].packed = pk[i]->p;
        run_packed(a);
        same &= same_y(P.y, want);
        bool untouched; double e = check_ref(P, n, &untouched);
        worst = std::max(worst, e); ok_ref &= e < REL_BOUND && untouched;
        if (specs.size() == 1 && n <= MATVEC_MAX_ROWS) {  // the launcher's bound for a fused argmax
            MatArgs b = P.args(n, 0, true);
            run_mma(b, DEFAULT_CFG);
            auto best_mma = P.best;
            b = P.args(n, 0, true);
            b.seg[0].packed = pk[0]->p;
            run_packed(b);
            ok_best &= P.best == best_mma;
        }
    }
    std::string nl; for (int n : ns) nl += std::to_string(n) + ",";
    nl.pop_back();
    bool reads = g_bad_reads == 0 && g_misaligned == 0;
    report(same && ok_ref && ok_best && reads, "packed %5d cols %s n=%s: rel err %.1e%s%s%s%s", cols, describe(specs).c_str(), nl.c_str(), worst,
           same ? ", mma.cu's bits" : ", BITS DIFFER from mma.cu", ok_ref ? "" : ", off the f64 reference or wrote outside",
           ok_best ? "" : ", fused argmax differs", reads ? "" : ", BAD READS");
    g_bad_reads = 0; g_misaligned = 0;
}

int main(int argc, char** argv) {
    bool quick = argc > 1 && !strcmp(argv[1], "quick");
    printf("mma.cu emulated on the host (mma.sync fragments and cp.async from the PTX ISA)\n");
    const std::vector<int> NS = {17, 16, 9, 8, 3, 2, 1};
    struct W { int fmt; std::vector<int> cols; };
    // Widths: a partial super-block (legacy: 96 = 3 blocks), splits 1, 2, 6 and 16 warps, ranges
    // of 1..3 super-blocks a warp; rows of 16-byte, 4-byte and 2-byte alignment.
    std::vector<W> widths = {
        {FMT_Q4_0, {96, 800, 1536}}, {FMT_Q4_1, {256, 800, 1536}}, {FMT_Q5_0, {96, 800, 1536}},
        {FMT_Q5_1, {256, 800, 1536}}, {FMT_Q8_0, {96, 800, 4352}}, {FMT_Q4_K, {256, 1536, 4608}},
        {FMT_Q5_K, {512, 1536, 4608}}, {FMT_Q6_K, {256, 1536, 4608}}};
    for (auto& w : widths)
        for (size_t i = 0; i < w.cols.size(); i++) {
            int cols = w.cols[i];
            if (quick && i == 2) continue;
            product_case(cols, cols + (i == 1 ? 64 : 0), {{w.fmt, 40, 0, i == 0, i == 1}}, NS, i == 1);
        }
    // Unaligned matrices (the general stage stride), three segments of mixed formats with
    // bias, residual and strided outputs, and more rows than one pass takes (64, 65: the
    // eight-tile kernel and a second pass over the weights).
    product_case(800, 800, {{FMT_Q8_0, 20, 0, true, false, 2}}, {9, 1}, true);
    product_case(1536, 1536, {{FMT_Q6_K, 20, 0, false, true, 6}}, {9, 1}, true);
    product_case(1536, 1600, {{FMT_Q4_K, 33, 3, true, false}, {FMT_Q6_K, 18, 0, false, true}, {FMT_Q8_0, 7, 0, true, true}},
                 {17, 8, 1}, true);
    product_case(768, 768, {{FMT_Q5_0, 24, 0, true, false}, {FMT_Q4_1, 17, 2, false, true}}, {16, 3}, false);
    if (!quick) {
        product_case(512, 512, {{FMT_Q4_K, 24, 0, true, true}}, {65, 64, 33, 32}, false);
        product_case(800, 800, {{FMT_Q5_1, 17, 0, false, false}, {FMT_Q8_0, 5, 0, false, false}}, {65, 1}, false);
    }
    // Packed copies: widths of 1, 2, 6, 16 warps a tile (4608: 18 super-blocks over 16 warps,
    // uneven ranges), rows not a multiple of 16, two segments, bias and residual, 1..65 rows.
    for (int fmt : {FMT_Q4_K, FMT_Q6_K}) {
        packed_case(256, 256, {{fmt, 40, 0, true, false}}, {17, 8, 1});
        packed_case(1536, 1600, {{fmt, 33, 3, false, true}}, {16, 9, 2, 1});
        packed_case(1536, 1536, {{fmt, 16, 0, true, true}, {fmt, 21, 0, false, false}}, {8, 3});
        if (!quick) packed_case(4608, 4608, {{fmt, 24, 0, false, true}}, {65, 33, 17, 1});
    }
    printf("%d checks, %d failed; %lld mma.sync, %lld cp.async copies emulated, at most %lld groups in flight a thread\n",
           g_checks, g_fails, g_mmas, g_cp_copies, g_cp_max_pending);
    return g_fails ? 1 : 0;
}
