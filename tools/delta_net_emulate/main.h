// The host emulation's driver: runs delta_net.cu's kernels (the real source, see gen.py) as a
// pass of the GPU model runs them (gdn_conv, gdn_recurrence, gdn_out; the
// commit's two kernels) on random projections, against an f64 reference written from
// qwen35.md §5, and checks bit-for-bit batch invariance: chains split anywhere, tree nodes
// against decoding their paths, a committed path against decoding it.
struct Grid { unsigned x, y, z; };
template <class F> static void launch(Grid g, int threads, F f) {
  blockDim = {(unsigned)threads, 1, 1}; gridDim = {g.x, g.y, g.z};
  for (unsigned z = 0; z < g.z; z++) for (unsigned y = 0; y < g.y; y++) for (unsigned x = 0; x < g.x; x++) {
    g_block = std::make_unique<std::barrier<>>(threads); g_warp.clear();
    for (int w = 0; w < threads / 32; w++) g_warp.push_back(std::make_unique<std::barrier<>>(32));
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; t++) ts.emplace_back([=] { blockIdx = {x, y, z}; threadIdx = {(unsigned)t, 0, 0}; f(); });
    for (auto& t : ts) t.join();
  }
}
static unsigned rnd() { static unsigned s = 2024; s = s * 1103515245u + 12345u; return s >> 8; }
static float frand() { return ((int)(rnd() % 2001) - 1000) * 0.001f; }
typedef std::vector<float> V;

static int g_fails = 0;
static void report(bool ok, const char* what, double err = -1) {
  if (!ok) g_fails++;
  if (err >= 0) printf("%s %s (rel err %.1e)\n", ok ? "ok  " : "FAIL", what, err);
  else printf("%s %s\n", ok ? "ok  " : "FAIL", what);
}
static double rel(const V& a, const std::vector<double>& b) {
  double m = 0, d = 0;
  for (size_t i = 0; i < a.size(); i++) { m = std::max(m, fabs(b[i])); d = std::max(d, std::isnan(a[i]) ? INFINITY : fabs(a[i] - b[i])); }
  return d / std::max(m, 1e-30);
}
static bool same_bits(const V& a, const V& b) { return a.size() == b.size() && memcmp(a.data(), b.data(), a.size() * 4) == 0; }

// One layer's model inputs per token (what the projections would give) and its weights.
struct Layer {
  GdnShape s;
  int cd, kd, vd;
  V taps, ssm_a, dt_bias, norm;
  Layer(GdnShape sh) : s(sh) {
    cd = 2 * s.nk * s.dk + s.nv * s.dv; kd = s.nk * s.dk; vd = s.nv * s.dv;
    taps.resize((size_t)cd * s.kernel); for (auto& t : taps) t = 0.6f * frand();
    ssm_a.resize(s.nv); for (auto& a : ssm_a) a = -expf(frand());
    dt_bias.resize(s.nv); for (auto& d : dt_bias) d = frand();
    norm.resize(s.dv); for (auto& w : norm) w = 1.0f + 0.5f * frand();
  }
};
struct Tokens { V mixed, ba, z; int n = 0; };
static Tokens random_tokens(const Layer& L, int n) {
  Tokens t; t.n = n;
  t.mixed.resize((size_t)n * L.cd); for (auto& v : t.mixed) v = 2.0f * frand();
  t.ba.resize((size_t)n * 2 * L.s.nv); for (auto& v : t.ba) v = 2.0f * frand();
  t.z.resize((size_t)n * L.vd); for (auto& v : t.z) v = 2.0f * frand();
  return t;
}
static Tokens pick(const Layer& L, const Tokens& t, const std::vector<int>& rows) {
  Tokens o; o.n = rows.size();
  for (int r : rows) {
    o.mixed.insert(o.mixed.end(), t.mixed.begin() + (size_t)r * L.cd, t.mixed.begin() + (size_t)(r + 1) * L.cd);
    o.ba.insert(o.ba.end(), t.ba.begin() + (size_t)r * 2 * L.s.nv, t.ba.begin() + (size_t)(r + 1) * 2 * L.s.nv);
    o.z.insert(o.z.end(), t.z.begin() + (size_t)r * L.vd, t.z.begin() + (size_t)(r + 1) * L.vd);
  }
  return o;
}
struct State { V ssm, conv; };
static State fresh(const Layer& L) { return {V((size_t)L.s.nv * L.s.dv * L.s.dk, 0.0f), V((size_t)(L.s.kernel - 1) * L.cd, 0.0f)}; }

// The batch description: a chain at `past`, or a tree (parents[i] < i, -1 for the root).
struct Meta { Batch b; std::vector<int> pos, path; };
static Meta chain_meta(int past, int n) {
  Meta m; m.b = {past, n, 1, 0};
  for (int i = 0; i < n; i++) m.pos.push_back(past + i);
  m.path.assign(1, 0);
  return m;
}
static Meta tree_meta(int past, const std::vector<int>& parents) {
  int n = parents.size();
  std::vector<int> depth(n, 0);
  for (int i = 0; i < n; i++) depth[i] = parents[i] < 0 ? 0 : depth[parents[i]] + 1;
  int md = *std::max_element(depth.begin(), depth.end());
  Meta m; m.b = {past, n, 0, md};
  m.path.assign((size_t)n * (md + 1), 0);
  for (int i = 0; i < n; i++) {
    m.pos.push_back(past + depth[i]);
    for (int a = i; a >= 0; a = parents[a]) m.path[(size_t)i * (md + 1) + depth[a]] = a;
  }
  return m;
}

// What a pass leaves: the prepared rows, gates, deltas (a tree's commit data) and outputs.
struct Pass { V qkv, gates, deltas, y; std::vector<int8_t> q; V qs; };
static Pass run_pass(const Layer& L, State& st, const Tokens& t, const Meta& m) {
  const GdnShape s = L.s; int n = t.n;
  Pass p; p.qkv.assign((size_t)n * L.cd, NAN); p.gates.assign((size_t)n * 2 * s.nv, NAN);
  p.deltas.assign((size_t)n * L.vd, NAN); p.y.assign((size_t)n * L.vd, NAN);
  p.q.assign((size_t)n * L.vd, 0); p.qs.assign((size_t)n * L.vd / 32 * 4, 0);
  const Batch* b = &m.b; const int* pos = m.pos.data(); const int* path = m.path.data();
  float q_scale = 1.0f / sqrtf((float)s.dk);
  launch({(unsigned)n, (unsigned)(2 * s.nk + s.nv), 1}, 128, [&] {
    gdn_conv(s, t.mixed.data(), L.taps.data(), st.conv.data(), t.ba.data(), L.ssm_a.data(), L.dt_bias.data(), q_scale, b, pos, path, p.qkv.data(), p.gates.data());
  });
  launch({(unsigned)s.nv + 1, (unsigned)((s.dv + 3) / 4), 1}, 128, [&] {
    gdn_recurrence(s, p.qkv.data(), p.gates.data(), st.ssm.data(), b, pos, path, p.y.data(), p.deltas.data(),
                   t.mixed.data(), st.conv.data());
  });
  // As the launcher: a block per head where heads hold whole int8 blocks, else per row.
  launch({(unsigned)n, s.dv % 32 == 0 ? (unsigned)s.nv : 1u, 1}, 128, [&] {
    // int8 blocks only of whole blocks (the launcher refuses others).
    bool blocks = L.vd % 32 == 0;
    gdn_out(s, p.y.data(), t.z.data(), L.norm.data(), 1e-6f, blocks ? (i8*)p.q.data() : nullptr, blocks ? (float4*)p.qs.data() : nullptr);
  });
  return p;
}
static void commit(const Layer& L, State& st, const Tokens& t, const Pass& p, const std::vector<int>& path) {
  const GdnShape s = L.s; int len = path.size();
  launch({(unsigned)s.nv, (unsigned)((s.dv + 3) / 4), 1}, 128, [&] {
    gdn_commit_state(s, st.ssm.data(), 0, p.qkv.data(), 0, p.gates.data(), 0, p.deltas.data(), 0, path.data(), len);
  });
  launch({(unsigned)((L.cd + 127) / 128), 1, 1}, 128, [&] { gdn_commit_conv(s, st.conv.data(), 0, t.mixed.data(), 0, path.data(), len); });
}

// qwen35.md §5 in f64 over a chain from `st` (GPU layouts), outputs after the gated norm.
struct RefOut { std::vector<double> y, ssm, conv; };
static RefOut reference(const Layer& L, const State& st, const Tokens& t) {
  const GdnShape s = L.s; int K = s.kernel, hist = K - 1, dk = s.dk, dv = s.dv;
  RefOut r;
  std::vector<double> S((size_t)s.nv * dk * dv);  // [h][i][j]
  for (int h = 0; h < s.nv; h++) for (int j = 0; j < dv; j++) for (int i = 0; i < dk; i++)
    S[((size_t)h * dk + i) * dv + j] = st.ssm[((size_t)h * dv + j) * dk + i];
  std::vector<std::vector<double>> rows;  // [conv state | tokens]
  for (int a = 0; a < hist; a++) rows.emplace_back(st.conv.begin() + (size_t)a * L.cd, st.conv.begin() + (size_t)(a + 1) * L.cd);
  for (int tt = 0; tt < t.n; tt++) rows.emplace_back(t.mixed.begin() + (size_t)tt * L.cd, t.mixed.begin() + (size_t)(tt + 1) * L.cd);
  for (int tt = 0; tt < t.n; tt++) {
    std::vector<double> c(L.cd);
    for (int ch = 0; ch < L.cd; ch++) {
      double a = 0; for (int j = 0; j < K; j++) a += (double)L.taps[(size_t)ch * K + j] * rows[tt + j][ch];
      c[ch] = a / (1 + exp(-a));
    }
    auto l2 = [&](int at, double scale) { double ss = 0; for (int i = 0; i < dk; i++) ss += c[at + i] * c[at + i];
      for (int i = 0; i < dk; i++) c[at + i] *= scale / sqrt(ss + 1e-6); };
    for (int kh = 0; kh < s.nk; kh++) { l2(kh * dk, 1 / sqrt((double)dk)); l2(L.kd + kh * dk, 1); }
    for (int h = 0; h < s.nv; h++) {
      int kh = s.grouped ? h / (s.nv / s.nk) : h % s.nk;
      const double* q = &c[kh * dk]; const double* k = &c[L.kd + kh * dk]; const double* v = &c[2 * L.kd + h * dv];
      double bb = t.ba[(size_t)tt * 2 * s.nv + h], aa = t.ba[(size_t)tt * 2 * s.nv + s.nv + h] + L.dt_bias[h];
      double beta = 1 / (1 + exp(-bb)), g = L.ssm_a[h] * (aa > 20 ? aa : log1p(exp(aa)));
      double* Sh = &S[(size_t)h * dk * dv];
      for (size_t e = 0; e < (size_t)dk * dv; e++) Sh[e] *= exp(g);
      std::vector<double> o(dv);
      for (int j = 0; j < dv; j++) { double kv = 0; for (int i = 0; i < dk; i++) kv += Sh[i * dv + j] * k[i];
        double d = (v[j] - kv) * beta; for (int i = 0; i < dk; i++) Sh[i * dv + j] += k[i] * d; }
      for (int j = 0; j < dv; j++) { double a = 0; for (int i = 0; i < dk; i++) a += Sh[i * dv + j] * q[i]; o[j] = a; }
      double ms = 0; for (int j = 0; j < dv; j++) ms += o[j] * o[j]; ms /= dv;
      for (int j = 0; j < dv; j++) { double zz = t.z[(size_t)tt * L.vd + h * dv + j];
        r.y.push_back(L.norm[j] * o[j] / sqrt(ms + 1e-6) * zz / (1 + exp(-zz))); }
    }
  }
  for (int h = 0; h < s.nv; h++) for (int j = 0; j < dv; j++) for (int i = 0; i < dk; i++) r.ssm.push_back(S[((size_t)h * dk + i) * dv + j]);
  for (int a = 0; a < hist; a++) for (int ch = 0; ch < L.cd; ch++) r.conv.push_back(rows[t.n + a][ch]);
  return r;
}
static V row_of(const V& v, int r, int w) { return V(v.begin() + (size_t)r * w, v.begin() + (size_t)(r + 1) * w); }

static void check_shape(GdnShape s, const char* name) {
  char line[256];
  Layer L(s);
  int n = 11;
  Tokens all = random_tokens(L, n);
  // A chain from zero against the f64 reference.
  State st = fresh(L);
  RefOut want = reference(L, st, all);
  Pass one = run_pass(L, st, all, chain_meta(0, n));
  double e = rel(one.y, want.y), es = rel(st.ssm, want.ssm), ec = rel(st.conv, want.conv);
  snprintf(line, sizeof line, "%s: a chain of %d rows vs f64 qwen35.md §5: outputs, recurrent state %.1e, conv state %.1e", name, n, es, ec);
  report(e < 1e-4 && es < 1e-4 && ec == 0, line, e);
  // Its int8 blocks (gdn_out's tail) stand for the outputs.
  double qe = 0, qm = 1e-30;
  for (size_t c = 0; c < one.y.size(); c++) { qe = std::max(qe, (double)fabs(one.qs[c / 32 * 4] * one.q[c] - one.y[c])); qm = std::max(qm, (double)fabs(one.y[c])); }
  if (L.vd % 32 == 0) {
    snprintf(line, sizeof line, "%s: gdn_out's int8 blocks against its outputs", name);
    report(qe / qm < 1e-2, line, qe / qm);
  }
  // The same rows in passes of 3, 1 and 7: the same bits.
  State st2 = fresh(L);
  V ys;
  int at = 0;
  for (int len : {3, 1, 7}) {
    std::vector<int> rows; for (int i = 0; i < len; i++) rows.push_back(at + i);
    Pass p = run_pass(L, st2, pick(L, all, rows), chain_meta(at, len));
    ys.insert(ys.end(), p.y.begin(), p.y.end());
    at += len;
  }
  snprintf(line, sizeof line, "%s: passes of 3, 1 and 7 rows give one pass's bits (outputs and states)", name);
  report(same_bits(ys, one.y) && same_bits(st2.ssm, st.ssm) && same_bits(st2.conv, st.conv), line);
  // Trees after a committed prefix of 5: each node against decoding its path (a branching
  // tree, whose nodes step from the running state or rebuild it; a chain of nodes).
  State base = fresh(L);
  Tokens prefix = random_tokens(L, 5);
  run_pass(L, base, prefix, chain_meta(0, 5));
  std::vector<int> chain_tree = {-1, 0, 1, 2, 3, 4};
  for (const std::vector<int>& shape : {std::vector<int>{-1, 0, 0, 1, 1, 2, 3, 6, 4, 7}, chain_tree}) {
    int count = shape.size();
    Tokens tt = random_tokens(L, count);
    State ts = base;
    Pass p = run_pass(L, ts, tt, tree_meta(5, shape));
    report(same_bits(ts.ssm, base.ssm) && same_bits(ts.conv, base.conv),
           (std::string(name) + ": a tree pass leaves the states as they were").c_str());
    bool same = true;
    for (int i = 0; i < count; i++) {
      std::vector<int> path; for (int a = i; a >= 0; a = shape[a]) path.insert(path.begin(), a);
      State dec = base;
      V last;
      for (int r : path) { Pass q = run_pass(L, dec, pick(L, tt, {r}), chain_meta(0, 1)); last = q.y; }
      if (!same_bits(row_of(p.y, i, L.vd), last)) { same = false; printf("     node %d differs from decoding its path\n", i); }
    }
    snprintf(line, sizeof line, "%s: each of a %d-node %s's outputs has the bits of decoding its path one row at a time", name, count, shape == chain_tree ? "chain tree" : "branching tree");
    report(same, line);
  }
  std::vector<int> parents = {-1, 0, 0, 1, 1, 2, 3, 6, 4, 7};
  Tokens tree_tokens = random_tokens(L, parents.size());
  State tree_state = base;
  Pass tp = run_pass(L, tree_state, tree_tokens, tree_meta(5, parents));
  // Commits: a deep path, and one shorter than the conv's history (reaching into the old state).
  for (std::vector<int> path : {std::vector<int>{0, 1, 3, 6, 7, 9}, std::vector<int>{0, 2}, std::vector<int>{0}}) {
    State c = base;
    commit(L, c, tree_tokens, tp, path);
    State dec = base;
    run_pass(L, dec, pick(L, tree_tokens, path), chain_meta(0, path.size()));
    snprintf(line, sizeof line, "%s: committing a path of %zu nodes gives decoding's states bit for bit", name, path.size());
    report(same_bits(c.ssm, dec.ssm) && same_bits(c.conv, dec.conv), line);
  }
}

static void check_gate() {
  int len = 96;
  V x(len), g(len), want(len);
  for (int i = 0; i < len; i++) { x[i] = 3 * frand(); g[i] = 30 * frand(); }
  std::vector<double> ref(len);
  for (int i = 0; i < len; i++) ref[i] = x[i] / (1 + exp(-(double)g[i]));
  std::vector<int8_t> q(len); V qs(len / 32 * 4);
  launch({1, 1, 1}, 128, [&] { sigmoid_gate(x.data(), g.data(), len / 32, (i8*)q.data(), (float4*)qs.data()); });
  report(rel(x, ref) < 1e-6, "sigmoid_gate of 96 values against f64", rel(x, ref));
}

int main() {
  check_shape({2, 4, 16, 16, 4, 0}, "tiny fixture shape (nk 2, nv 4, dk = dv = 16, GGUF head order)");
  check_shape({1, 2, 128, 24, 4, 1}, "dk 128, dv 24 (no int8 blocks), grouped head order");
  check_shape({2, 2, 32, 64, 3, 0}, "dk 32, dv 64, conv of 3 taps");
  check_gate();
  printf("%d failed\n", g_fails);
  return g_fails ? 1 : 0;
}
