// The host emulation's driver: runs gemm_prepare, gemm_<BM>x<BN> and gemm_reduce (the real
// source, see gen.py) on the CPU, each emulated block as one std::thread per CUDA thread, and
// compares with f64 products of the same f16 operands.
struct Grid { unsigned x, y, z; };
template <class F> static void launch_sync(Grid g, int threads, F f) {  // kernels with barriers
  blockDim = {(unsigned)threads, 1, 1}; gridDim = {g.x, g.y, g.z};
  for (unsigned z = 0; z < g.z; z++) for (unsigned y = 0; y < g.y; y++) for (unsigned x = 0; x < g.x; x++) {
    g_block = std::make_unique<std::barrier<>>(threads); g_warp.clear();
    for (int w = 0; w < threads / 32; w++) g_warp.push_back(std::make_unique<std::barrier<>>(32));
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; t++) ts.emplace_back([=] { blockIdx = {x, y, z}; threadIdx = {(unsigned)t, 0, 0}; f(); });
    for (auto& t : ts) t.join();
  }
}
template <class F> static void launch_seq(unsigned blocks, int threads, F f) {  // no barriers
  blockDim = {(unsigned)threads, 1, 1}; gridDim = {blocks, 1, 1};
  for (unsigned b = 0; b < blocks; b++) for (int t = 0; t < threads; t++) { blockIdx = {b, 0, 0}; threadIdx = {(unsigned)t, 0, 0}; f(); }
}
static unsigned rnd() { static unsigned s = 12345; s = s * 1103515245u + 12345u; return s >> 8; }
static float frand() { return ((int)(rnd() % 2001) - 1000) * 0.001f; }
static std::vector<u8> make_weights(int fmt, int rows, int cols, int* row_bytes) {
  int bs, bb;
  switch (fmt) { case FMT_Q4_K: bs = 256; bb = 144; break; case FMT_Q8_0: bs = 32; bb = 34; break;
    case FMT_F16: bs = 1; bb = 2; break; default: bs = 1; bb = 4; }
  *row_bytes = cols / bs * bb;
  std::vector<u8> w((size_t)rows * *row_bytes + 64);
  for (auto& b : w) b = rnd() & 255;
  for (int r = 0; r < rows; r++) {
    u8* row = w.data() + (size_t)r * *row_bytes;
    if (fmt == FMT_F16) for (int c = 0; c < cols; c++) { u16 h = f2h(frand()); memcpy(row + 2 * c, &h, 2); }
    else if (fmt == FMT_F32) for (int c = 0; c < cols; c++) { float v = frand(); memcpy(row + 4 * c, &v, 4); }
    else for (int b = 0; b < cols / bs; b++) { u16 h1 = f2h(0.001f * (rnd() % 100 + 1)), h2 = f2h(0.001f * (rnd() % 100 + 1));
      memcpy(row + b * bb, &h1, 2); if (fmt == FMT_Q4_K) memcpy(row + b * bb + 2, &h2, 2); }
  }
  return w;
}
// Every block format's units from gemm_prepare against common.cuh's dequant_one (the layout
// the embedding check ties to the CPU's dequantize), and the float formats' 8-value units.
static int check_dequant() {
  int fmts[] = {FMT_Q4_0, FMT_Q4_1, FMT_Q5_0, FMT_Q5_1, FMT_Q8_0, FMT_Q4_K, FMT_Q5_K, FMT_Q6_K, FMT_F32, FMT_F16, FMT_BF16};
  int bytes[] = {18, 20, 22, 24, 34, 144, 176, 210, 4, 2, 2};
  int bs[] = {32, 32, 32, 32, 32, 256, 256, 256, 1, 1, 1};
  int fails = 0;
  for (int f = 0; f < 11; f++) {
    int cols = 512, rb = cols / bs[f] * bytes[f];
    std::vector<u8> row(rb + 64);
    for (auto& b : row) b = rnd() & 255;
    if (f < 8) {
      for (int b = 0; b < cols / bs[f]; b++) {  // finite scales
        u8* p = row.data() + b * bytes[f];
        u16 h1 = f2h(0.01f * (rnd() % 100 + 1)), h2 = f2h(0.01f * (rnd() % 100 + 1));
        if (f < 5) { memcpy(p, &h1, 2); if (f == 1 || f == 3) memcpy(p + 2, &h2, 2); }
        else if (f < 7) { memcpy(p, &h1, 2); memcpy(p + 2, &h2, 2); }
        else memcpy(p + 208, &h1, 2);
      }
    } else {
      for (int c = 0; c < cols; c++) {
        float v = frand();
        if (f == 8) memcpy(row.data() + 4 * c, &v, 4);
        else if (f == 9) { u16 h = f2h(v); memcpy(row.data() + 2 * c, &h, 2); }
        else { u32 u; memcpy(&u, &v, 4); u16 b = u >> 16; memcpy(row.data() + 2 * c, &b, 2); }
      }
    }
    u16 out[512];
    if (f < 8) for (int u = 0; u < cols / 32; u++) dequant_unit32(row.data(), fmts[f], u, out + 32 * u);
    else for (int u = 0; u < cols / 8; u++) { uint4 o = float_unit8(row.data(), fmts[f], u); memcpy(out + 8 * u, &o, 16); }
    int bad = 0;
    for (int c = 0; c < cols; c++) {
      float ref = dequant_one(row.data(), fmts[f], c), got = h2f(out[c]);
      if (!(fabsf(got - ref) <= fabsf(ref) * 1e-3f + 1e-6f)) bad++;
    }
    printf("%s gemm_prepare of GGML type %d: %d of %d values off dequant_one beyond f16 rounding\n", bad ? "FAIL" : "ok  ", fmts[f], bad, cols);
    fails += bad != 0;
  }
  return fails;
}
struct SegSpec { int fmt, rows, ldy_extra; bool bias, acc; };
static int run_case(const char* what, std::vector<SegSpec> specs, int cols, int ldx, int n, bool large, int want_splits) {
  std::vector<std::vector<u8>> ws; std::vector<std::vector<float>> ys, inits, biases;
  PrepArgs pa{}; GemmArgs ga{}; int rows = 0;
  for (size_t i = 0; i < specs.size(); i++) {
    int rb; ws.push_back(make_weights(specs[i].fmt, specs[i].rows, cols, &rb));
    pa.seg[i] = {ws.back().data(), rb, specs[i].fmt, specs[i].rows};
    pa.w_units += (long long)specs[i].rows * (cols / ((specs[i].fmt == FMT_F32 || specs[i].fmt == FMT_F16) ? 8 : 32));
    int ldy = specs[i].rows + specs[i].ldy_extra;
    std::vector<float> init((size_t)n * ldy), bias(specs[i].rows);
    for (auto& v : init) v = frand(); for (auto& v : bias) v = frand();
    inits.push_back(init); ys.push_back(init); biases.push_back(bias);
    rows += specs[i].rows;
  }
  std::vector<float> x((size_t)n * ldx); for (auto& v : x) v = frand() * 4;
  std::vector<u16> w16((size_t)rows * cols, 0xffff), x16((size_t)n * cols, 0xffff);
  int slices = (cols + 31) / 32, kper = (slices + want_splits - 1) / want_splits, splits = (slices + kper - 1) / kper;
  std::vector<float> part((size_t)splits * n * rows, NAN);
  pa.w16 = w16.data(); pa.x = x.data(); pa.x16 = x16.data(); pa.x_units = (long long)n * cols / 8;
  pa.nseg = specs.size(); pa.cols = cols; pa.ldx = ldx; pa.w_blocks = (pa.w_units + 255) / 256;
  launch_seq(pa.w_blocks + (pa.x_units + 255) / 256, 256, [&] { gemm_prepare(pa); });
  for (size_t i = 0; i < specs.size(); i++)
    ga.out[i] = {ys[i].data(), specs[i].bias ? biases[i].data() : nullptr, specs[i].rows, specs[i].rows + specs[i].ldy_extra, specs[i].acc, 0};
  ga.w = w16.data(); ga.x = x16.data(); ga.part = part.data(); ga.nseg = specs.size(); ga.rows = rows; ga.cols = cols; ga.n = n;
  ga.splits = splits; ga.kper = kper;
  int bm = large ? 128 : 64;
  Grid g{(unsigned)((n + bm - 1) / bm), (unsigned)((rows + bm - 1) / bm), (unsigned)splits};
  if (large) launch_sync(g, 256, [&] { gemm_128x128(ga); }); else launch_sync(g, 128, [&] { gemm_64x64(ga); });
  if (splits > 1) launch_seq(((long long)n * rows + 255) / 256, 256, [&] { gemm_reduce(ga); });
  // Reference: f64 over the f16 operands (checking the scratch against dequant_one on the way).
  double err = 0, scale = 0; int j0 = 0, bad_scratch = 0;
  for (size_t i = 0; i < specs.size(); i++) {
    int ldy = specs[i].rows + specs[i].ldy_extra;
    for (int j = 0; j < specs[i].rows; j++) for (int c = 0; c < cols; c++) {
      float ref = dequant_one(ws[i].data() + (size_t)j * pa.seg[i].row_bytes, specs[i].fmt, c);
      if (fabsf(h2f(w16[(size_t)(j0 + j) * cols + c]) - ref) > fabsf(ref) * 1e-3f + 1e-6f) bad_scratch++;
    }
    for (int r = 0; r < n; r++) for (int j = 0; j < ldy; j++) {
      double want = inits[i][(size_t)r * ldy + j];
      if (j < specs[i].rows) {
        double s = 0; for (int c = 0; c < cols; c++) s += (double)h2f(x16[(size_t)r * cols + c]) * h2f(w16[(size_t)(j0 + j) * cols + c]);
        want = s + (specs[i].bias ? biases[i][j] : 0) + (specs[i].acc ? want : 0);
      }
      double got = ys[i][(size_t)r * ldy + j];
      err = std::max(err, std::isnan(got) ? INFINITY : fabs(got - want)); scale = std::max(scale, fabs(want));
    }
    j0 += specs[i].rows;
  }
  int bad_x = 0;
  for (int r = 0; r < n; r++) for (int c = 0; c < cols; c++) if (x16[(size_t)r * cols + c] != f2h(x[(size_t)r * ldx + c])) bad_x++;
  bool ok = err / scale < 1e-5 && bad_scratch == 0 && bad_x == 0;
  printf("%s %s n=%d %s splits=%d (kper %d): rel err %.1e, scratch mismatches %d, activation mismatches %d\n",
         ok ? "ok  " : "FAIL", what, n, large ? "128x128" : "64x64", splits, kper, err / scale, bad_scratch, bad_x);
  return ok ? 0 : 1;
}
int main() {
  int fails = check_dequant();
  for (bool late : {false, true}) {
  g_late = late;
  printf("cp.async copies %s\n", late ? "late (at the wait that completes them)" : "early (at once)");
  std::vector<SegSpec> mixed = {{FMT_Q4_K, 40, 0, true, false}, {FMT_Q8_0, 25, 3, true, true}, {FMT_F16, 33, 6, false, true}};
  for (int n : {65, 100}) for (bool large : {true, false}) for (int s : {1, 4})
    fails += run_case("Q4_K+Q8_0+F16 512 cols", mixed, 512, 512, n, large, s);
  std::vector<SegSpec> f32 = {{FMT_F32, 77, 0, false, false}};
  for (bool large : {true, false}) for (int s : {1, 4})
    fails += run_case("F32 77x264, ldx 272", f32, 264, 272, 65, large, s);
  std::vector<SegSpec> big = {{FMT_Q4_K, 130, 0, true, true}};
  fails += run_case("Q4_K 130x768", big, 768, 768, 129, true, 2);
  fails += run_case("Q4_K 130x768", big, 768, 768, 129, false, 3);
  }
  printf("%d failed\n", fails);
  return fails != 0;
}
