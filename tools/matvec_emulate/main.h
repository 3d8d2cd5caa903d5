// The host emulation's driver: runs quantize_acts and matvec_1/2/4/8 (the real source, see
// gen.py) on the CPU with their parameters filled as kernels/mod.rs fills them (matvec_args,
// matvec_split, stream_layout ported below), and checks
//   (a) the plain kernel against f64 products of the dequantized weights (dequant_one) and the
//       int8-dequantized activations, rows beyond n and columns beyond a segment's rows left
//       alone, and each activation row's bits the same at every n (batch invariance);
//   (b) the streamed kernel (matvec_stream: persistent grids of 2..6 blocks, 2..8 stages,
//       bulk copies landing at once or late) bit-identical to the plain one;
//   (c) the fused tails (SwiGLU, RMSNorm, argmax) against the plain product followed by the
//       separate computation, plain and streamed, bit-identical.
#ifndef KASOKU_MATVEC_STREAM
#define STREAMED 0
#else
#define STREAMED 1
#endif
#define MATVEC_WARPS 4
#define STREAM_SHARED_MAX (100 * 1024)
static unsigned g_seed = 12345;
static unsigned rnd() { g_seed = g_seed * 1103515245u + 12345u; return g_seed >> 8; }
static float frand() { return ((int)(rnd() % 2001) - 1000) * 0.001f; }
struct Fmt { int id, bs, bb; const char* name; };
static const Fmt FMTS[] = {{FMT_F32, 1, 4, "F32"},     {FMT_F16, 1, 2, "F16"},   {FMT_BF16, 1, 2, "BF16"},
                           {FMT_Q4_0, 32, 18, "Q4_0"}, {FMT_Q4_1, 32, 20, "Q4_1"}, {FMT_Q5_0, 32, 22, "Q5_0"},
                           {FMT_Q5_1, 32, 24, "Q5_1"}, {FMT_Q8_0, 32, 34, "Q8_0"}, {FMT_Q4_K, 256, 144, "Q4_K"},
                           {FMT_Q5_K, 256, 176, "Q5_K"}, {FMT_Q6_K, 256, 210, "Q6_K"}};
static const Fmt& fmt_of(int id) { for (auto& f : FMTS) if (f.id == id) return f; abort(); }
static bool is_float(int fmt) { return fmt == FMT_F32 || fmt == FMT_F16 || fmt == FMT_BF16; }

// ---- buffers: weights are 256-byte aligned with 64 bytes of slack (registered for the
// bounds checks), everything else plain vectors.
struct WBuf {
    u8* p = nullptr; size_t len = 0;
    WBuf(size_t n) : len(n) { p = (u8*)aligned_alloc(256, (n + 64 + 255) / 256 * 256); g_weights.push_back({p, n + 64}); }
    ~WBuf() { for (size_t i = 0; i < g_weights.size(); i++) if (g_weights[i].p == p) { g_weights.erase(g_weights.begin() + i); break; } free(p); }
    WBuf(const WBuf&) = delete;
};
// rows × cols of `fmt`: random quants/values, finite scales; `same`: every row a copy of row 0.
static std::unique_ptr<WBuf> make_weights(int fmt, int rows, int cols, long long* row_bytes, bool same = false) {
    const Fmt& f = fmt_of(fmt);
    *row_bytes = (long long)cols / f.bs * f.bb;
    auto w = std::make_unique<WBuf>((size_t)rows * *row_bytes);
    for (size_t i = 0; i < w->len + 64; i++) w->p[i] = rnd() & 255;
    for (int r = 0; r < rows; r++) {
        u8* row = w->p + (size_t)r * *row_bytes;
        if (same && r > 0) { memcpy(row, w->p, *row_bytes); continue; }
        if (is_float(fmt)) {
            for (int c = 0; c < cols; c++) {
                float v = frand();
                if (fmt == FMT_F32) memcpy(row + 4 * c, &v, 4);
                else if (fmt == FMT_F16) { u16 h = f2h(v); memcpy(row + 2 * c, &h, 2); }
                else { u32 u; memcpy(&u, &v, 4); u16 b = u >> 16; memcpy(row + 2 * c, &b, 2); }
            }
            continue;
        }
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
static int matvec_split(const MatArgs& a) {
    int units = 1 << 30;
    for (int i = 0; i < a.nseg; i++) {
        int f = a.seg[i].fmt, u = is_float(f) ? a.cols / 8 : f == FMT_Q6_K ? a.cols / 64 : a.cols / 32;
        units = std::min(units, u);
    }
    return units >= 256 ? 4 : units >= 128 ? 2 : 1;
}
// The tallest tile, as matvec_max_tile: 4 by default (passes of 5 or more rows loop over
// 4-row tiles), 8 with EMU_MAX_TILE=8 (the 8-row kernel, four weight rows a warp).
static int g_max_tile = 4;
// matvec_rows_per_warp: the kernel's NW (4 in the 8-row kernel).
static int rows_per_warp(int n) { return n > 4 && g_max_tile >= 8 ? 4 : 2; }
static unsigned matvec_grid(const MatArgs& a) {  // matvec_args' grid (a.split set)
    long long groups = 0, nw = rows_per_warp(a.n);
    for (int i = 0; i < a.nseg; i++) groups += (a.seg[i].rows + nw - 1) / nw;
    return (unsigned)((groups * a.split + MATVEC_WARPS - 1) / MATVEC_WARPS);
}
// stream_layout: (stages, stage bytes, grid) or false where two stages do not fit.
static bool stream_layout(const MatArgs& a, int mps, int bps, long long budget, int* stages, int* stage_bytes, unsigned* grid) {
    int ppt = MATVEC_WARPS / std::max(a.split, 1);
    long long stage = 0, tiles = 0;
    for (int i = 0; i < a.nseg; i++) {
        stage = std::max(stage, (2 * ppt * a.seg[i].row_bytes + 15) / 16 * 16 + 32);
        tiles += ((a.seg[i].rows + 1) / 2 + ppt - 1) / ppt;
    }
    long long st = std::clamp(budget / stage, 2LL, 8LL);
    if (st * stage > STREAM_SHARED_MAX) return false;
    *stages = (int)st; *stage_bytes = (int)stage;
    *grid = (unsigned)std::min(tiles, (long long)mps * std::max(bps, 1));
    return true;
}
static int nr_of(int n) { return n <= 1 ? 1 : n == 2 ? 2 : n <= 4 || g_max_tile < 8 ? 4 : 8; }

// A streamed configuration: persistent blocks (one SM), stages wanted, copy mode, fiber order.
struct SCfg { int blocks, stages; bool late, reverse; };
static const SCfg SCFGS[] = {{2, 2, false, false}, {3, 8, true, false}, {6, 3, true, true}, {4, 5, false, true}};
struct RunInfo { bool streamed = false; int stages = 0, grid = 0; };
// Runs the product kernel for a.n rows, plain (cfg null) or streamed.
static RunInfo run_matvec(MatArgs a, const SCfg* cfg, bool reverse = false) {
    a.split = matvec_split(a);
    unsigned grid = matvec_grid(a);
    RunInfo info;
    a.stream_stages = 0; a.stream_stage_bytes = 0;
    g_dyn_size = 0; g_stage_bytes = 0; g_late_copies = false; g_reverse = reverse;
    if (cfg && rows_per_warp(a.n) == 2) {  // streaming takes pairs of rows only
        int ppt = MATVEC_WARPS / a.split; long long stage = 0;
        for (int i = 0; i < a.nseg; i++) stage = std::max(stage, (2 * ppt * a.seg[i].row_bytes + 15) / 16 * 16 + 32);
        long long fit = STREAM_SHARED_MAX / stage, want = std::min<long long>(cfg->stages, std::max(fit, 2LL));
        int st, sb; unsigned g;
        if (stream_layout(a, 1, cfg->blocks, want * stage, &st, &sb, &g)) {
            a.stream_stages = st; a.stream_stage_bytes = sb; grid = g;
            g_dyn_size = (size_t)st * sb; g_stage_bytes = sb; g_late_copies = cfg->late; g_reverse = cfg->reverse;
            info = {true, st, (int)g};
        }
    }
    int nr = nr_of(a.n);
    launch(grid, MATVEC_WARPS * 32, [&] {
        if (nr == 1) matvec_1(a); else if (nr == 2) matvec_2(a); else if (nr == 4) matvec_4(a); else matvec_8(a);
    });
    g_reverse = false;
    return info;
}

// ---- activations: f32 rows (stride ldx) and their int8 blocks from quantize_acts
struct Acts { std::vector<float> x; std::vector<i8> q; std::vector<float4> s; int ldx, n; };
static void host_quant32(const float* v, i8* q, float4* s) {  // quant_block32's rule, written again
    float amax = 0; for (int i = 0; i < 32; i++) amax = std::max(amax, fabsf(v[i]));
    float d = amax / 127.0f; int s0 = 0, s1 = 0;
    for (int i = 0; i < 32; i++) { int qi = d == 0.0f ? 0 : (int)rintf(v[i] / d); q[i] = (i8)qi; (i < 16 ? s0 : s1) += qi; }
    *s = make_float4(d, d * (float)s0, d * (float)s1, 0.0f);
}
static bool same_bits(const void* a, const void* b, size_t n) { return memcmp(a, b, n) == 0; }
static int g_fails = 0, g_checks = 0;
// No read outside the weights (+64), the activations' n rows or the stages, no misaligned
// 16-byte vector (and resets the counts).
static bool reads_ok() { bool ok = g_bad_reads == 0 && g_misaligned == 0; g_bad_reads = g_misaligned = 0; return ok; }
static void report(bool ok, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static void report(bool ok, const char* fmt, ...) {
    g_checks++; if (!ok) g_fails++;
    printf("%s ", ok ? "ok  " : "FAIL");
    va_list ap; va_start(ap, fmt); vprintf(fmt, ap); va_end(ap); printf("\n"); fflush(stdout);
}
static Acts make_acts(int n, int ldx, int cols) {
    Acts A; A.ldx = ldx; A.n = n;
    A.x.resize((size_t)n * ldx); A.q.assign((size_t)n * ldx, 0x55); A.s.assign((size_t)n * ldx / 32, {NAN, NAN, NAN, NAN});
    for (int r = 0; r < n; r++) for (int c = 0; c < ldx; c++) {
        float v = c < cols ? frand() * 2.0f : NAN;  // the padding is never read
        if (c < cols && (c / 32) % 7 == 3) v *= 0.01f;                    // blocks of very different scales
        if (c < cols && c % 32 == 0 && (c / 32) % 5 == 4) v = 0;          // (an all-zero block below)
        A.x[(size_t)r * ldx + c] = v;
    }
    for (int r = 0; r < n; r++) for (int c = 64; c < 96 && c < cols; c++) A.x[(size_t)r * ldx + c] = 0.0f;
    long long blocks = (long long)n * ldx / 32;
    // quantize_acts over whole rows of cols values (the padding stays unquantized)
    std::vector<float> xc((size_t)n * cols);
    for (int r = 0; r < n; r++) memcpy(&xc[(size_t)r * cols], &A.x[(size_t)r * ldx], cols * 4);
    std::vector<i8> q((size_t)n * cols); std::vector<float4> s((size_t)n * cols / 32);
    long long nb = (long long)n * cols / 32;
    launch((unsigned)((nb * 32 + 127) / 128), 128, [&] { quantize_acts(xc.data(), nb, q.data(), s.data()); });
    int bad = 0;
    for (long long b = 0; b < nb; b++) {
        i8 hq[32]; float4 hs; host_quant32(&xc[32 * b], hq, &hs);
        if (!same_bits(hq, &q[32 * b], 32) || !same_bits(&hs, &s[b], 16)) bad++;
    }
    (void)blocks;
    static int reported = 0;
    if (bad || reported++ < 1) report(bad == 0, "quantize_acts %d rows x %d: %d of %lld blocks differ from the rule written again", n, cols, bad, nb);
    for (int r = 0; r < n; r++) {
        memcpy(&A.q[(size_t)r * ldx], &q[(size_t)r * cols], cols);
        memcpy(&A.s[(size_t)r * ldx / 32], &s[(size_t)r * cols / 32], cols / 32 * 16);
    }
    return A;
}
static double act_value(const Acts& A, int fmt, int r, int c) {
    if (is_float(fmt)) return A.x[(size_t)r * A.ldx + c];
    return (double)A.s[((size_t)r * A.ldx) / 32 + c / 32].x * A.q[(size_t)r * A.ldx + c];
}

// ---- (a) + (b): products of 1..3 segments
struct SegSpec { int rows, ldy_extra; bool bias, acc; int fmt = -1; };  // fmt -1: the case's
struct Prod {
    int fmt, cols, ldx; std::vector<SegSpec> specs;
    std::vector<std::unique_ptr<WBuf>> w; std::vector<long long> rb;
    std::vector<std::vector<float>> bias, init, y;
    Acts A;
    int fmt_i(size_t i) const { return specs[i].fmt >= 0 ? specs[i].fmt : fmt; }
    std::vector<float> xn; std::vector<i8> qn; std::vector<float4> sn;
    MatArgs args(int n) {
        MatArgs a{};
        for (size_t i = 0; i < specs.size(); i++) {
            y[i] = init[i];
            a.seg[i] = {w[i]->p, y[i].data(), specs[i].bias ? bias[i].data() : nullptr, rb[i], fmt_i(i), specs[i].rows,
                        specs[i].rows + specs[i].ldy_extra, specs[i].acc ? 1 : 0, nullptr};
        }
        // exactly n rows of activations (a read past them is caught)
        xn.assign(A.x.begin(), A.x.begin() + (size_t)n * ldx);
        qn.assign(A.q.begin(), A.q.begin() + (size_t)n * ldx);
        sn.assign(A.s.begin(), A.s.begin() + (size_t)n * ldx / 32);
        g_acts = {{(const u8*)xn.data(), xn.size() * 4}, {(const u8*)qn.data(), qn.size()}, {(const u8*)sn.data(), sn.size() * 16}};
        a.x = xn.data(); a.xq = qn.data(); a.xs = sn.data();
        a.nseg = specs.size(); a.cols = cols; a.n = n; a.ldx = ldx;
        return a;
    }
};
static const int NMAX = 12;
static void setup(Prod& P, int fmt, int cols, int ldx, std::vector<SegSpec> specs, int nmax, bool same = false) {
    P.fmt = fmt; P.cols = cols; P.ldx = ldx; P.specs = specs;
    for (auto& s : specs) {
        long long rb; P.w.push_back(make_weights(s.fmt >= 0 ? s.fmt : fmt, s.rows, cols, &rb, same)); P.rb.push_back(rb);
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
            for (int c = 0; c < P.cols; c++) wd[c] = dequant_one(P.w[i]->p + (size_t)j * P.rb[i], P.fmt_i(i), c);
            for (int r = 0; r < n; r++) {
                double sum = 0, mag = 0;
                for (int c = 0; c < P.cols; c++) { double t = wd[c] * act_value(P.A, P.fmt_i(i), r, c); sum += t; mag += fabs(t); }
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
static std::vector<std::vector<float>> snapshot(Prod& P) { return P.y; }
static bool same_outputs(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
    for (size_t i = 0; i < a.size(); i++) if (!same_bits(a[i].data(), b[i].data(), a[i].size() * 4)) return false;
    return true;
}
static std::string describe(const std::vector<SegSpec>& specs) {
    std::string s;
    for (auto& x : specs) {
        char b[64]; snprintf(b, sizeof b, "%s%s%s%d%s%s", s.empty() ? "" : "+", x.fmt >= 0 ? fmt_of(x.fmt).name : "", x.fmt >= 0 ? ":" : "",
                             x.rows, x.bias ? "b" : "", x.acc ? "a" : "");
        s += b; if (x.ldy_extra) { snprintf(b, sizeof b, "(ldy+%d)", x.ldy_extra); s += b; }
    }
    return s;
}
static const double REL_BOUND = 1e-5;
static void product_case(int fmt, int cols, int ldx, std::vector<SegSpec> specs, std::vector<int> ns) {
    Prod P; setup(P, fmt, cols, ldx, specs, NMAX);
    std::vector<std::vector<float>> big;  // outputs at the largest n (ns[0])
    double worst = 0; bool ok_ref = true, ok_untouched = true, ok_inv = true, ok_rev = true;
    int stream_same = 0, stream_runs = 0; std::string stream_desc;
    for (int n : ns) {
        MatArgs a = P.args(n);
        run_matvec(a, nullptr);
        auto plain = snapshot(P);
        bool untouched; double e = check_ref(P, n, &untouched);
        worst = std::max(worst, e); ok_ref &= e < REL_BOUND; ok_untouched &= untouched;
        if (big.empty()) big = plain;
        else for (size_t i = 0; i < specs.size(); i++) {
            size_t len = (size_t)n * (specs[i].rows + specs[i].ldy_extra);
            ok_inv &= same_bits(plain[i].data(), big[i].data(), len * 4);
        }
        if (n == ns[0]) { a = P.args(n); run_matvec(a, nullptr, true); ok_rev &= same_outputs(P.y, plain); }
        if (STREAMED) for (const SCfg& c : SCFGS) {
            a = P.args(n);
            RunInfo ri = run_matvec(a, &c);
            if (!ri.streamed) continue;
            stream_runs++;
            if (same_outputs(P.y, plain)) stream_same++;
            if (n == ns[0]) { char b[48]; snprintf(b, sizeof b, " %dx%d%s", ri.grid, ri.stages, c.late ? "L" : ""); stream_desc += b; }
        }
    }
    MatArgs a0 = P.args(1); a0.split = matvec_split(a0);
    std::string nl; for (int n : ns) nl += std::to_string(n) + ",";
    nl.pop_back();
    bool ok = ok_ref && ok_untouched && ok_inv && ok_rev && stream_same == stream_runs && g_bad_reads == 0 && g_misaligned == 0;
    if (STREAMED)
        report(ok, "%-4s %5d cols (ldx %d) split %d, segs %s, n=%s: rel err %.1e%s%s%s%s; streamed %d/%d bit-identical (grid x stages:%s)",
               P.specs[0].fmt >= 0 ? "mix" : fmt_of(fmt).name, cols, ldx, a0.split, describe(specs).c_str(), nl.c_str(), worst, ok_untouched ? "" : ", WROTE OUTSIDE its outputs",
               ok_inv ? "" : ", rows differ between n", ok_rev ? "" : ", fiber order changes bits", (g_bad_reads || g_misaligned) ? ", BAD READS" : "",
               stream_same, stream_runs, stream_runs ? stream_desc.c_str() : " none fit");
    else
        report(ok, "%-4s %5d cols (ldx %d) split %d, segs %s, n=%s: rel err %.1e%s%s%s%s", P.specs[0].fmt >= 0 ? "mix" : fmt_of(fmt).name, cols, ldx, a0.split,
               describe(specs).c_str(), nl.c_str(), worst, ok_untouched ? "" : ", WROTE OUTSIDE its outputs",
               ok_inv ? "" : ", rows differ between n", ok_rev ? "" : ", fiber order changes bits", (g_bad_reads || g_misaligned) ? ", BAD READS" : "");
    g_bad_reads = 0; g_misaligned = 0;
}

// ---- (c) fused tails
// SwiGLU: gate|up (the same rows, a multiple of 32, ldy = rows) with glu_count.
static void swiglu_case(int fmt, int cols, int rows, std::vector<int> ns) {
    Prod P; setup(P, fmt, cols, cols, {{rows, 0, true, false}, {rows, 0, false, false}}, NMAX);
    for (int n : ns) {
        MatArgs a = P.args(n);
        run_matvec(a, nullptr);
        auto prod = snapshot(P);
        // the reference: silu(g)·u and its int8 blocks, the swiglu kernel's arithmetic
        std::vector<float> v((size_t)n * rows); std::vector<i8> rq((size_t)n * rows); std::vector<float4> rs((size_t)n * rows / 32);
        for (size_t k = 0; k < v.size(); k++) { float x = prod[0][k]; v[k] = x / (1.0f + expf(-x)) * prod[1][k]; }
        for (size_t b = 0; b < rs.size(); b++) host_quant32(&v[32 * b], &rq[32 * b], &rs[b]);
        std::string what;
        bool all = true; std::vector<float> first_g; std::vector<i8> first_q;
        for (int k = -1; k < (STREAMED ? 4 : 0); k++) {
            std::vector<u32> counts(rows / 32, 0); std::vector<i8> q((size_t)n * rows, 0x55); std::vector<float4> s(rows / 32 * n, {NAN, NAN, NAN, NAN});
            a = P.args(n); a.glu_count = counts.data(); a.glu_q = q.data(); a.glu_s = s.data();
            RunInfo ri = run_matvec(a, k < 0 ? nullptr : &SCFGS[k]);
            if (k >= 0 && !ri.streamed) continue;
            bool ok = same_bits(P.y[0].data(), v.data(), v.size() * 4) && same_bits(P.y[1].data(), prod[1].data(), v.size() * 4) &&
                      same_bits(q.data(), rq.data(), q.size()) && same_bits(s.data(), rs.data(), s.size() * 16);
            for (u32 c : counts) ok &= c == 0;
            all &= ok;
            what += k < 0 ? "plain" : " streamed"; if (!ok) what += "(DIFFERS)";
        }
        report(all & reads_ok(), "SwiGLU fused %s %d cols, %d gate|up rows, n=%d: %s == product, silu(g)*u, quant (bits), counts back to 0",
               fmt_of(fmt).name, cols, rows, n, what.c_str());
    }
}
// RMSNorm of segment 0's output (a residual product: accumulate), with norm_count.
static void rms_reference(const float* y, const float* w, float eps, int dim, int n, float* ny, i8* nq, float4* ns) {
    launch(n, 256, [&] {  // the rmsnorm kernel's launch: a block of 256 per row
        static double red[NORM_MAX_DIM / 32]; static float scale_sh;
        size_t r = blockIdx.x;
        rms_row(y + r * dim, w, eps, dim, ny + r * dim, nq + r * dim, ns + r * (dim / 32), red, &scale_sh);
    });
}
static void norm_case(int fmt, int cols, int dim, bool bias, std::vector<int> ns) {
    Prod P; setup(P, fmt, cols, cols, {{dim, 0, bias, true}}, NMAX);
    std::vector<float> nw(dim); for (auto& v : nw) v = 1.0f + 0.2f * frand();
    const float eps = 1e-6f;
    for (int n : ns) {
        MatArgs a = P.args(n);
        run_matvec(a, nullptr);
        auto prod = snapshot(P);
        std::vector<float> ry((size_t)n * dim); std::vector<i8> rq((size_t)n * dim); std::vector<float4> rs((size_t)n * dim / 32);
        rms_reference(prod[0].data(), nw.data(), eps, dim, n, ry.data(), rq.data(), rs.data());
        double err = 0; int qbad = 0;  // the reference itself: against f64 and the quant rule
        for (int r = 0; r < n; r++) {
            double ss = 0; for (int c = 0; c < dim; c++) ss += (double)prod[0][(size_t)r * dim + c] * prod[0][(size_t)r * dim + c];
            double sc = 1.0 / sqrt(ss / dim + eps);
            for (int c = 0; c < dim; c++) {
                double want = prod[0][(size_t)r * dim + c] * sc * nw[c];
                err = std::max(err, fabs(ry[(size_t)r * dim + c] - want) / (fabs(want) + 1e-3));
            }
        }
        for (size_t b = 0; b < rs.size(); b++) { i8 hq[32]; float4 hs; host_quant32(&ry[32 * b], hq, &hs); qbad += !same_bits(hq, &rq[32 * b], 32) || !same_bits(&hs, &rs[b], 16); }
        std::string what; bool all = err < 1e-5 && qbad == 0;
        for (int k = -1; k < (STREAMED ? 4 : 0); k++) {
            u32 count = 0; std::vector<float> ny((size_t)n * dim, NAN); std::vector<i8> q((size_t)n * dim, 0x55); std::vector<float4> s((size_t)n * dim / 32);
            a = P.args(n); a.norm_count = &count; a.norm_w = nw.data(); a.norm_y = ny.data(); a.norm_q = q.data(); a.norm_s = s.data(); a.norm_eps = eps;
            RunInfo ri = run_matvec(a, k < 0 ? nullptr : &SCFGS[k]);
            if (k >= 0 && !ri.streamed) continue;
            bool ok = same_bits(P.y[0].data(), prod[0].data(), prod[0].size() * 4) && same_bits(ny.data(), ry.data(), ry.size() * 4) &&
                      same_bits(q.data(), rq.data(), q.size()) && same_bits(s.data(), rs.data(), s.size() * 16) && count == 0;
            all &= ok;
            what += k < 0 ? "plain" : " streamed"; if (!ok) what += "(DIFFERS)";
        }
        report(all & reads_ok(), "RMSNorm fused %s %d cols, dim %d%s, n=%d: %s == product then rms_row at 256 threads (bits; that vs f64 %.1e, its quant %d bad), count back to 0",
               fmt_of(fmt).name, cols, dim, bias ? " +bias" : "", n, what.c_str(), err, qbad);
    }
}
// Argmax: one segment with seg.best; `same`: every weight row identical (every output equal:
// the key must name row 0, and every row's value must have the same bits).
static void argmax_case(int fmt, int cols, int rows, bool bias, bool acc, bool same, std::vector<int> ns) {
    Prod P; setup(P, fmt, cols, cols, {{rows, 0, bias, acc}}, 64, same);
    for (int n : ns) {
        MatArgs a = P.args(n);
        run_matvec(a, nullptr);
        auto prod = snapshot(P);
        std::vector<u64> want(n, 0);
        bool equal = true;
        for (int r = 0; r < n; r++) for (int j = 0; j < rows; j++) {
            float v = prod[0][(size_t)r * rows + j];
            want[r] = std::max(want[r], argmax_key(v, j));
            if (same) equal &= same_bits(&v, &prod[0][(size_t)r * rows], 4);
        }
        std::string what; bool all = !same || equal;
        for (int k = -1; k < (STREAMED ? 4 : 0); k++) {
            std::vector<u64> best(n, 0);
            a = P.args(n); a.seg[0].best = best.data();
            RunInfo ri = run_matvec(a, k < 0 ? nullptr : &SCFGS[k]);
            if (k >= 0 && !ri.streamed) continue;
            bool ok = same_bits(best.data(), want.data(), n * 8) && same_bits(P.y[0].data(), prod[0].data(), prod[0].size() * 4);
            if (same) for (int r = 0; r < n; r++) ok &= (0xFFFFFFFFu - (u32)best[r]) == 0;
            all &= ok;
            what += k < 0 ? "plain" : " streamed"; if (!ok) what += "(DIFFERS)";
        }
        report(all & reads_ok(), "argmax fused %s %d cols, %d rows%s%s%s, n=%d: %s == argmax of the product%s", fmt_of(fmt).name, cols, rows,
               bias ? " +bias" : "", acc ? " +acc" : "", same ? " (identical rows)" : "", n, what.c_str(),
               same ? (equal ? ", all outputs equal" : ", IDENTICAL ROWS GIVE DIFFERENT BITS") : "");
    }
}

int main(int argc, char** argv) {
    bool quick = argc > 1 && !strcmp(argv[1], "quick");
    if (const char* t = getenv("EMU_MAX_TILE")) g_max_tile = atoi(t) >= 8 ? 8 : 4;
    printf("matvec.cu emulated on the host, %s, tiles of at most %d rows\n",
           STREAMED ? "with KASOKU_MATVEC_STREAM (plain and streamed paths)" : "without KASOKU_MATVEC_STREAM (plain path)", g_max_tile);
    // widths giving split 1, 2 and 4 for each format (rows of 2-byte, 4-byte and 16-byte alignment)
    struct W { int fmt; std::vector<int> cols; };
    std::vector<W> widths = {
        {FMT_F32, {96, 1024, 2048}}, {FMT_F16, {256, 1536, 4096}}, {FMT_BF16, {96, 1024, 2560}},
        {FMT_Q4_0, {96, 4160, 8960}}, {FMT_Q4_1, {256, 4096, 8960}}, {FMT_Q5_0, {96, 4160, 8960}},
        {FMT_Q5_1, {256, 4160, 8192}}, {FMT_Q8_0, {96, 4096, 8960}}, {FMT_Q4_K, {256, 4352, 8960}},
        {FMT_Q5_K, {512, 4096, 8960}}, {FMT_Q6_K, {256, 8448, 16640}}};
    std::vector<std::vector<SegSpec>> segsets = {
        {{13, 0, true, false}},
        {{6, 3, false, true}, {9, 0, true, true}},
        {{5, 0, true, false}, {8, 2, false, false}, {11, 0, false, true}}};
    for (auto& w : widths) {
        for (size_t ci = 0; ci < w.cols.size(); ci++) {
            int cols = w.cols[ci];
            for (size_t si = 0; si < segsets.size(); si++) {
                if (quick && si != 2) continue;
                std::vector<int> ns = si == 2 ? std::vector<int>{12, 10, 9, 8, 3, 2, 1} : si == 1 ? std::vector<int>{3, 2} : std::vector<int>{9, 1};
                int ldx = (si == 1) ? cols + 64 : cols;
                product_case(w.fmt, cols, ldx, segsets[si], ns);
            }
        }
    }
    // segments of different formats in one call (a Q4_K_M model's Q4_K / Q6_K / Q8_0 mix)
    product_case(FMT_Q4_K, 4096, 4096, {{7, 0, true, false, FMT_Q4_K}, {6, 1, false, true, FMT_Q6_K}, {9, 0, true, true, FMT_Q8_0}}, {9, 3, 1});
    product_case(FMT_Q5_K, 8448, 8448, {{5, 0, false, false, FMT_Q5_K}, {11, 0, true, false, FMT_Q6_K}}, {8, 2});
    product_case(FMT_F16, 8192, 8192, {{3, 0, true, true, FMT_F16}, {6, 0, false, false, FMT_Q5_1}, {5, 0, false, false, FMT_BF16}}, {9, 1});
    swiglu_case(FMT_Q4_K, 1536, 8960, {1, 3});  // Qwen2.5-Coder-1.5B's gate|up (FUSE_GLU failed there on an H100)
    swiglu_case(FMT_Q8_0, 256, 64, {1, 3, 9});
    swiglu_case(FMT_Q4_K, 4352, 64, {2, 9});
    swiglu_case(FMT_F16, 2048, 32, {1, 8});
    swiglu_case(FMT_Q6_K, 8448, 32, {3});
    swiglu_case(FMT_Q5_0, 96, 96, {9});
    norm_case(FMT_Q8_0, 256, 96, true, {1, 3, 9});
    norm_case(FMT_F32, 1024, 256, false, {2, 8});
    norm_case(FMT_Q4_K, 256, 2560, false, {1, 3});
    norm_case(FMT_Q5_1, 4160, 64, true, {9});
    argmax_case(FMT_Q4_0, 96, 301, true, false, false, {1, 3, 9});
    argmax_case(FMT_Q6_K, 8448, 77, false, true, false, {2, 8});
    argmax_case(FMT_F16, 2048, 50, false, false, false, {9});
    argmax_case(FMT_Q8_0, 4096, 45, false, false, true, {1, 9});
    argmax_case(FMT_Q4_K, 256, 33, false, false, true, {3, 64});
    argmax_case(FMT_BF16, 96, 129, true, true, false, {64});
    printf("%d checks, %d failed; bulk copies %lld (%lld bytes), longest mbarrier wait %lld polls\n", g_checks, g_fails, g_fetches, g_fetch_bytes, g_max_spin);
    return g_fails != 0;
}
