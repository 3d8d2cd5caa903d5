// The host emulation's driver: runs attention.cu's kernels (the real source, see gen.py) with
// their parameters as Kernels::attention fills them (grid, partial buffers, arrival counts)
// and checks
//   (a) attn_group and attn_partial against an f64 reference on chains and trees, contexts
//       crossing chunk boundaries up to more chunks than a row has blocks, GQA groups of 1, 4,
//       6, 7 and 14 (two blocks of query heads), head_dim 64/96/128/256, int8 blocks on and off;
//   (b) attn_group's bits do not depend on the batch, the row's index, the blocks launched,
//       the order blocks run in (which one merges) or the threads' schedule, and a tree node
//       gets the bits of the chain row of its path;
//   (c) the fused q/k/v epilogue: attention with post on gives the bits of qkv_post followed
//       by attention (output, int8 blocks, both caches), for both kernels;
//   (d) attn_rows (several rows a block) gives attn_partial's bits row for row.
// Shared memory starts poisoned (NaN) in every block and the partial buffers start NaN, so a
// read of something not written shows.
#define ATT_BLOCKS 32
// pre.h's per-block hooks (matvec_emulate's emu_ptx.h keeps mbarrier state in them): here a
// block's shared memory starts poisoned, nothing more.
static void block_start() { for (auto& s : g_shared) memset(s.first, 0xFF, s.second); }
static void block_end() {}
#define KERNEL_ATTG_HEADS 8
static unsigned g_seed = 4242;
static unsigned rnd() { g_seed = g_seed * 1103515245u + 12345u; return g_seed >> 8; }
static float frand() { return ((int)(rnd() % 2001) - 1000) * 0.001f; }
typedef std::vector<float> V;
typedef std::vector<unsigned short> H;

static int g_fails = 0, g_checks = 0;
static void report(bool ok, const std::string& what) {
    g_checks++;
    if (!ok) g_fails++;
    printf("%s %s\n", ok ? "ok  " : "FAIL", what.c_str());
}
static bool same(const void* a, const void* b, size_t n) { return memcmp(a, b, n) == 0; }

struct Meta { Batch b; std::vector<int> pos, path; int n; };
static Meta chain_meta(int past, int n) {
    Meta m; m.b = {past, n, 1, 0}; m.n = n;
    for (int i = 0; i < n; i++) m.pos.push_back(past + i);
    m.path.assign(1, 0);
    return m;
}
static std::vector<int> depths(const std::vector<int>& parents) {
    std::vector<int> d(parents.size(), 0);
    for (size_t i = 0; i < parents.size(); i++) d[i] = parents[i] < 0 ? 0 : d[parents[i]] + 1;
    return d;
}
static Meta tree_meta(int past, const std::vector<int>& parents) {
    int n = parents.size();
    auto depth = depths(parents);
    int md = *std::max_element(depth.begin(), depth.end());
    Meta m; m.b = {past, n, 0, md}; m.n = n;
    m.path.assign((size_t)n * (md + 1), 0);
    for (int i = 0; i < n; i++) {
        m.pos.push_back(past + depth[i]);
        for (int a = i; a >= 0; a = parents[a]) m.path[(size_t)i * (md + 1) + depth[a]] = a;
    }
    return m;
}
static int slot_of(const Meta& m, int i, int v) {
    if (v < m.b.past || m.b.is_chain) return v;
    return m.b.past + m.path[(size_t)i * (m.b.max_depth + 1) + (v - m.b.past)];
}

struct Shape { int nh, nkv, hd; };
struct Cache { H k, v; int slots; };
static Cache random_cache(const Shape& s, int slots) {
    Cache c; c.slots = slots;
    c.k.resize((size_t)s.nkv * slots * s.hd); c.v.resize(c.k.size());
    for (auto& x : c.k) x = f2h(frand());
    for (auto& x : c.v) x = f2h(frand());
    return c;
}
struct Result { V out; std::vector<int8_t> xq; V xs; Cache cache; };

// One attention call as Kernels::attention makes it: attn_partial, attn_group (`grouped`),
// or attn_rows with `rows` rows a block (rows > 0).
static Result attend(bool grouped, const Shape& s, const Meta& m, const V& q, Cache cache, int chunks, bool quant,
                     PostArgs post = PostArgs{}, int order = 0, int rows = 0) {
    int n = m.n, q_dim = s.nh * s.hd;
    Result r;
    r.out.assign((size_t)n * q_dim, NAN);
    r.xq.assign(quant ? (size_t)n * q_dim : 0, 0);
    r.xs.assign(quant ? (size_t)n * q_dim / 32 * 4 : 0, NAN);
    V part_ml((size_t)n * s.nh * chunks * 2, NAN), part_o((size_t)n * s.nh * chunks * s.hd, NAN);
    std::vector<int> arrivals((size_t)n * s.nh, 0);
    int group = s.nh / s.nkv;
    unsigned gx = rows > 0 ? (n + rows - 1) / rows : n;
    unsigned gy = grouped ? s.nkv * ((group + KERNEL_ATTG_HEADS - 1) / KERNEL_ATTG_HEADS) : s.nh;
    unsigned gz = std::min(chunks, ATT_BLOCKS);
    std::vector<unsigned> ord(gx * gy * gz);
    for (size_t k = 0; k < ord.size(); k++) ord[k] = k;
    if (order == 1) std::reverse(ord.begin(), ord.end());
    if (order == 2) for (size_t k = ord.size(); k > 1; k--) std::swap(ord[k - 1], ord[rnd() % k]);
    V qc = q;
    float scale = 1.0f / sqrtf((float)s.hd);
    // The caches are what the kernels may read with __ldg (exactly their slots).
    g_weights = {{(const unsigned char*)cache.k.data(), cache.k.size() * 2},
                 {(const unsigned char*)cache.v.data(), cache.v.size() * 2}};
    launch3(gx, gy, gz, 128, ord, [&] {
        i8* xq = quant ? r.xq.data() : nullptr;
        float4* xs = quant ? (float4*)r.xs.data() : nullptr;
        if (rows > 0) {
            attn_rows(qc.data(), q_dim, cache.k.data(), cache.v.data(), cache.slots, s.nh, s.nkv, s.hd, scale, &m.b,
                      m.pos.data(), m.path.data(), part_ml.data(), part_o.data(), chunks, arrivals.data(),
                      r.out.data(), q_dim, xq, xs, n, rows);
            return;
        }
        auto f = grouped ? attn_group : attn_partial;
        f(qc.data(), q_dim, cache.k.data(), cache.v.data(), cache.slots, s.nh, s.nkv, s.hd, scale, &m.b, m.pos.data(),
          m.path.data(), part_ml.data(), part_o.data(), chunks, arrivals.data(), r.out.data(), q_dim, xq, xs, post);
    });
    g_weights.clear();
    for (int a : arrivals) if (a) { report(false, "an arrival count left non-zero"); break; }
    if (g_bad_reads) {
        report(false, "a cache read outside the caches");
        g_bad_reads = 0;
    }
    r.cache = std::move(cache);
    return r;
}

// f64 attention of row i over its virtual positions (keys and values as the cache holds them).
static std::vector<double> reference(const Shape& s, const Meta& m, const V& q, const Cache& c) {
    int n = m.n, q_dim = s.nh * s.hd, group = s.nh / s.nkv;
    std::vector<double> out((size_t)n * q_dim);
    double scale = 1.0 / sqrt((double)s.hd);
    for (int i = 0; i < n; i++) {
        int seen = m.pos[i] + 1;
        for (int h = 0; h < s.nh; h++) {
            int kh = h / group;
            std::vector<double> sc(seen);
            double mx = -INFINITY;
            for (int v = 0; v < seen; v++) {
                size_t at = ((size_t)kh * c.slots + slot_of(m, i, v)) * s.hd;
                double a = 0;
                for (int d = 0; d < s.hd; d++) a += (double)q[(size_t)i * q_dim + h * s.hd + d] * h2f(c.k[at + d]);
                sc[v] = a * scale;
                mx = std::max(mx, sc[v]);
            }
            double l = 0;
            for (auto& x : sc) { x = exp(x - mx); l += x; }
            for (int d = 0; d < s.hd; d++) {
                double o = 0;
                for (int v = 0; v < seen; v++) o += sc[v] * h2f(c.v[((size_t)kh * c.slots + slot_of(m, i, v)) * s.hd + d]);
                out[(size_t)i * q_dim + h * s.hd + d] = o / l;
            }
        }
    }
    return out;
}
static double rel(const V& a, const std::vector<double>& b) {
    double mx = 0, d = 0;
    for (size_t i = 0; i < a.size(); i++) {
        mx = std::max(mx, fabs(b[i]));
        d = std::max(d, std::isnan(a[i]) ? INFINITY : fabs(a[i] - b[i]));
    }
    return d / std::max(mx, 1e-30);
}
// quant_block32's result from the output (its definition, on the host).
static bool quant_matches(const Result& r) {
    for (size_t b = 0; b < r.out.size() / 32; b++) {
        float amax = 0;
        for (int j = 0; j < 32; j++) amax = std::max(amax, fabsf(r.out[32 * b + j]));
        float d = amax / 127.0f;
        int s0 = 0, s1 = 0;
        for (int j = 0; j < 32; j++) {
            int qi = d == 0.0f ? 0 : (int)rintf(r.out[32 * b + j] / d);
            if (r.xq[32 * b + j] != (int8_t)qi) return false;
            (j < 16 ? s0 : s1) += qi;
        }
        const float* x = &r.xs[4 * b];
        if (x[0] != d || x[1] != d * (float)s0 || x[2] != d * (float)s1) return false;
    }
    return true;
}
static V random_q(int n, const Shape& s) {
    V q((size_t)n * s.nh * s.hd);
    for (auto& x : q) x = 2.0f * frand();
    return q;
}
static int chunks_for(int max_slots) { return max_slots / 64 + 1; }
static std::string name(const Shape& s) {
    char b[64]; snprintf(b, sizeof b, "%d/%d heads, hd %d", s.nh, s.nkv, s.hd); return b;
}

// (a) both kernels against f64; (b) attn_group's invariances.
static void check_shape(const Shape& s, int past, int n_chain, bool quant) {
    int max_slots = past + 80, chunks = chunks_for(max_slots);
    Cache c = random_cache(s, max_slots);
    Meta m = chain_meta(past, n_chain);
    V q = random_q(n_chain, s);
    auto want = reference(s, m, q, c);
    char what[160];
    for (int grouped = 0; grouped < 2; grouped++) {
        Result r = attend(grouped, s, m, q, c, chunks, quant);
        double e = rel(r.out, want);
        bool qok = !quant || quant_matches(r);
        snprintf(what, sizeof what, "%s: chain of %d at %d cached (%d chunks), %s: rel err %.1e, int8 %s", name(s).c_str(),
                 n_chain, past, (past + n_chain + 63) / 64, grouped ? "attn_group" : "attn_partial", e,
                 quant ? (qok ? "equal" : "DIFFER") : "off");
        report(e < 1e-5 && qok, what);
        if (!grouped) continue;
        // Invariances: block order, thread schedule, blocks launched (chunks), the row alone.
        bool ok = true;
        Result r1 = attend(true, s, m, q, c, chunks, quant, PostArgs{}, 1);
        Result r2 = attend(true, s, m, q, c, chunks, quant, PostArgs{}, 2);
        g_reverse = true;
        Result r3 = attend(true, s, m, q, c, chunks, quant, PostArgs{}, 0);
        g_reverse = false;
        Result r4 = attend(true, s, m, q, c, chunks + 37, quant);
        for (auto* x : {&r1, &r2, &r3, &r4})
            ok &= same(x->out.data(), r.out.data(), r.out.size() * 4) && x->xq == r.xq &&
                  same(x->xs.data(), r.xs.data(), r.xs.size() * 4);
        int last = n_chain - 1, q_dim = s.nh * s.hd;
        Meta m1 = chain_meta(past + last, 1);
        V q1(q.begin() + (size_t)last * q_dim, q.end());
        Result r5 = attend(true, s, m1, q1, c, chunks, quant);
        ok &= same(r5.out.data(), r.out.data() + (size_t)last * q_dim, q_dim * 4);
        snprintf(what, sizeof what, "%s: chain of %d at %d cached: the same bits in any block order, schedule, grid, alone",
                 name(s).c_str(), n_chain, past);
        report(ok, what);
    }
}

// A tree: every node against f64, and each node's bits equal the chain row of its path.
static void check_tree(const Shape& s, int past, bool quant) {
    std::vector<int> parents = {-1, 0, 1, 2, 1, 0, 5, 5, 0, 8, 9, 10};
    int n = parents.size(), q_dim = s.nh * s.hd;
    int max_slots = past + 80, chunks = chunks_for(max_slots);
    Cache c = random_cache(s, max_slots);
    Meta m = tree_meta(past, parents);
    V q = random_q(n, s);
    auto want = reference(s, m, q, c);
    char what[200];
    for (int grouped = 0; grouped < 2; grouped++) {
        Result r = attend(grouped, s, m, q, c, chunks, quant);
        double e = rel(r.out, want);
        bool qok = !quant || quant_matches(r);
        snprintf(what, sizeof what, "%s: tree of %d at %d cached, %s: rel err %.1e, int8 %s", name(s).c_str(), n, past,
                 grouped ? "attn_group" : "attn_partial", e, quant ? (qok ? "equal" : "DIFFER") : "off");
        report(e < 1e-5 && qok, what);
        // Each node against plain decoding of its path (the path's keys moved to the chain's
        // slots, its queries as the chain's rows), in a grid of another size.
        auto depth = depths(parents);
        bool ok = true;
        for (int i = 0; i < n; i++) {
            std::vector<int> path;
            for (int a = i; a >= 0; a = parents[a]) path.insert(path.begin(), a);
            Cache cc = c;
            V qq;
            for (size_t d = 0; d < path.size(); d++) {
                for (int h = 0; h < s.nkv; h++)
                    for (int x = 0; x < s.hd; x++) {
                        size_t to = ((size_t)h * max_slots + past + d) * s.hd + x, from = ((size_t)h * max_slots + past + path[d]) * s.hd + x;
                        cc.k[to] = c.k[from];
                        cc.v[to] = c.v[from];
                    }
                qq.insert(qq.end(), q.begin() + (size_t)path[d] * q_dim, q.begin() + (size_t)(path[d] + 1) * q_dim);
            }
            Result rc = attend(grouped, s, chain_meta(past, path.size()), qq, cc, chunks + 5, quant);
            int row = depth[i];
            ok &= same(rc.out.data() + (size_t)row * q_dim, r.out.data() + (size_t)i * q_dim, q_dim * 4);
            if (quant) ok &= same(rc.xq.data() + (size_t)row * q_dim, r.xq.data() + (size_t)i * q_dim, q_dim);
        }
        snprintf(what, sizeof what, "%s: tree of %d at %d cached, %s: every node has the bits of its path's chain row",
                 name(s).c_str(), n, past, grouped ? "attn_group" : "attn_partial");
        report(ok, what);
    }
}

// (d) attn_rows gives attn_partial's bits, row for row (outputs and int8 blocks), for chains
// and trees, whatever the rows a block, the grid, the block order and the thread schedule.
static void check_rows(const Shape& s, int past, const std::vector<int>& parents, bool quant) {
    Meta m = parents.empty() ? chain_meta(past, 17) : tree_meta(past, parents);
    int n = m.n, max_slots = past + 80, chunks = chunks_for(max_slots);
    Cache c = random_cache(s, max_slots);
    V q = random_q(n, s);
    Result want = attend(false, s, m, q, c, chunks, quant);
    bool ok = true;
    int tries = 0;
    for (int rows : {2, 3, 4, 16, 64})
        for (int order = 0; order < 3; order++) {
            g_reverse = order == 1 && rows == 4;
            Result r = attend(false, s, m, q, c, rows == 3 ? chunks + 9 : chunks, quant, PostArgs{}, order, rows);
            g_reverse = false;
            ok &= same(r.out.data(), want.out.data(), want.out.size() * 4) && r.xq == want.xq &&
                  same(r.xs.data(), want.xs.data(), want.xs.size() * 4);
            tries++;
        }
    char what[200];
    snprintf(what, sizeof what, "%s: %s of %d at %d cached (%d chunks): attn_rows has attn_partial's bits (%d grids and orders)",
             name(s).c_str(), parents.empty() ? "chain" : "tree", n, past, (m.pos.back() + 64) / 64, tries);
    report(ok, what);
}

// (c) the fused epilogue against qkv_post + attention, bit for bit.
static void check_post(const Shape& s, int rot, bool interleaved, bool qk_norm, int past, bool quant) {
    int max_slots = past + 70, chunks = chunks_for(max_slots), q_dim = s.nh * s.hd, kv_dim = s.nkv * s.hd;
    Cache c = random_cache(s, max_slots);
    V q = random_q(1, s), k(kv_dim), v(kv_dim), qn(s.hd), kn(s.hd), inv(rot / 2);
    for (auto& x : k) x = 2.0f * frand();
    for (auto& x : v) x = 2.0f * frand();
    for (auto& x : qn) x = 1.0f + 0.5f * frand();
    for (auto& x : kn) x = 1.0f + 0.5f * frand();
    for (int t = 0; t < rot / 2; t++) inv[t] = powf(10000.0f, -2.0f * t / rot);
    Meta m = chain_meta(past, 1);
    char what[200];
    for (int grouped = 0; grouped < 2; grouped++) {
        // The pair: qkv_post (grid (1, heads + kv heads), block 128), then attention.
        Cache c1 = c;
        V q1 = q;
        std::vector<unsigned> ord(s.nh + s.nkv);
        for (size_t x = 0; x < ord.size(); x++) ord[x] = x;
        launch3(1, s.nh + s.nkv, 1, 128, ord, [&] {
            qkv_post(q1.data(), k.data(), v.data(), q_dim, kv_dim, s.nh, s.nkv, s.hd, rot, interleaved, inv.data(),
                     qk_norm ? qn.data() : nullptr, qk_norm ? kn.data() : nullptr, 1e-6f, &m.b, m.pos.data(), c1.k.data(),
                     c1.v.data(), max_slots);
        });
        Result plain = attend(grouped, s, m, q1, c1, chunks, quant);
        PostArgs post{k.data(), v.data(), inv.data(), qk_norm ? qn.data() : nullptr, qk_norm ? kn.data() : nullptr,
                      kv_dim, rot, interleaved, 1e-6f, 1, 0};
        Result fused = attend(grouped, s, m, q, c, chunks, quant, post, 2);
        auto want = reference(s, m, q1, plain.cache);
        double e = rel(plain.out, want);
        bool ok = same(plain.out.data(), fused.out.data(), q_dim * 4) && plain.xq == fused.xq &&
                  same(plain.xs.data(), fused.xs.data(), plain.xs.size() * 4) && plain.cache.k == fused.cache.k &&
                  plain.cache.v == fused.cache.v;
        snprintf(what, sizeof what,
                 "%s: fused epilogue (rot %d%s%s) at %d cached, %s: output, int8 blocks and caches equal the pair's (pair rel err %.1e)",
                 name(s).c_str(), rot, interleaved ? ", interleaved" : "", qk_norm ? ", qk-norm" : "", past,
                 grouped ? "attn_group" : "attn_partial", e);
        report(ok && e < 1e-5, what);
    }
}

int main(int argc, char** argv) {
    bool quick = argc > 1 && !strcmp(argv[1], "quick");
    Shape h16{4, 2, 16}, h32{4, 2, 32};  // the tiny fixtures' heads (4 lanes a key row)
    check_shape(h16, 70, 3, false);  // (int8 blocks need head_dim a multiple of 32)
    check_shape(h32, 130, 2, true);
    check_tree(h16, 20, false);
    Shape q15{12, 2, 128}, mha{4, 4, 64}, big{8, 2, 256}, g14{28, 2, 64}, q05{14, 2, 64}, g6{6, 1, 64}, h96{6, 2, 96};
    // Contexts: one chunk, a chunk's edge, several chunks, more chunks than blocks (2,100 > 32 * 64).
    for (int past : {0, 5, 60, 63, 64, 130, 300}) check_shape(q15, past, 3, past % 2 == 0);
    check_shape(q15, 2100, 2, true);
    check_shape(mha, 190, 4, true);
    check_shape(big, 70, 2, true);
    check_shape(g14, 100, 2, true);
    check_shape(q05, 33, 2, false);
    check_shape(g6, 2049, 1, true);
    check_shape(h96, 140, 2, true);  // lanes of a key row past head_dim (12 of 16 hold values)
    if (!quick) {
        check_shape(big, 2090, 1, true);
        check_shape(mha, 2200, 2, false);
    }
    check_tree(q15, 200, true);
    check_tree(mha, 50, false);
    check_tree(big, 61, true);
    check_tree(g14, 130, true);
    check_tree(h96, 64, true);
    std::vector<int> tree16 = {-1, 0, 1, 2, 3, 4, 5, 6, 1, 8, 0, 10, 11, 2, 13, 14};  // depths up to 7
    check_rows(h16, 20, {}, false);
    for (int past : {0, 30, 64, 120, 500}) check_rows(q15, past, tree16, past % 2 == 0);
    check_rows(q15, 57, {}, true);  // a chain whose rows cross a chunk's edge
    check_rows(mha, 190, tree16, false);
    check_rows(big, 61, tree16, true);
    check_rows(g14, 130, {}, true);
    check_rows(h96, 64, tree16, true);
    if (!quick) check_rows(q15, 2100, tree16, true);
    check_post(q15, 128, false, false, 300, true);
    check_post(q15, 128, false, true, 10, true);
    check_post(big, 64, false, true, 70, true);
    check_post(mha, 64, true, false, 63, false);
    check_post(g14, 32, true, true, 1000, true);
    check_post(g6, 64, false, true, 2100, true);
    printf("%d checks, %d failed\n", g_checks, g_fails);
    return g_fails ? 1 : 0;
}
