//! The Gated DeltaNet recurrence (Qwen3.5 / Qwen3-Next linear-attention layers), in f32:
//! input preparation (q/k l2-norm, gates), the token-by-token recurrent form, and the chunked
//! closed form used for long batches. Both forms give the same outputs and final state.
//!
//! Per value head `h` (state `S`: `dk × dv`, key dimension first), for each token `t`:
//! ```text
//! S'  = e^{g_t} · S                      decay first
//! δ_t = β_t · (v_t − S'ᵀ k_t)            delta rule
//! S   = S' + k_t ⊗ δ_t                   rank-1 update
//! o_t = Sᵀ q_t                           read the UPDATED state
//! ```
//! with `q_t, k_t` taken from key head [`GdnDims::key_head`]`(h)`, l2-normalised (and `q`
//! scaled by `1/sqrt(dk)`, see [`l2norm_heads`]), `β = sigmoid(b)` and
//! `g = ssm_a · softplus(a + dt_bias)` where `ssm_a = −exp(A_log)` (see [`gates`]).
//!
//! **Chunked form.** Within a chunk of `c` tokens starting from state `S0`, let `G_i` be the
//! running sum of `g` inside the chunk. Unrolling the recurrence gives
//! `S_i = e^{G_i} S0 + Σ_{j≤i} e^{G_i−G_j} k_j ⊗ u_j`, where the `u_j` (the `δ_j` above) solve
//! the unit lower-triangular system
//! `u_j + β_j Σ_{l<j} e^{G_j−G_l} (k_j·k_l) u_l = β_j (v_j − e^{G_j} S0ᵀ k_j)`.
//! Then `o_i = e^{G_i} S0ᵀ q_i + Σ_{l≤i} e^{G_i−G_l} (q_i·k_l) u_l` and the chunk ends with
//! `S = e^{G_c} S0 + Σ_j e^{G_c−G_j} k_j ⊗ u_j`. Everything except the forward substitution
//! is a small dense matrix product ([`gemm`]). All exponents are of non-positive numbers.
//! A draft-tree verifier generalises exactly this: replace "l ≤ i" by "l is an ancestor of
//! i" and commit by replaying `S ← e^{g_j} S + k_j ⊗ u_j` along the accepted path.
//!
//! Heads are independent and run in parallel on the worker pool. The state-touching loops
//! (the recurrent step and `gemm`) have a portable path and an AVX2/FMA path.

use super::activation::sigmoid;
use super::simd::Isa;
use super::threads::{self, parts::BlockMut, Blocks, Work};

/// Which key head a value head reads when there are more value heads than key heads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadMap {
    /// Hugging Face order (`repeat_interleave`): value head `h` uses key head `h / (nv/nk)`.
    Grouped,
    /// llama.cpp GGUF order (value heads re-ordered at conversion): key head `h % nk`.
    Tiled,
}

/// Head counts and sizes of one Gated DeltaNet layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GdnDims {
    /// Key (and query) heads.
    pub nk: usize,
    /// Value heads (a multiple of `nk`).
    pub nv: usize,
    /// Key head size.
    pub dk: usize,
    /// Value head size.
    pub dv: usize,
    pub map: HeadMap,
}

impl GdnDims {
    /// The key head that value head `h` reads.
    pub fn key_head(&self, h: usize) -> usize {
        match self.map {
            HeadMap::Grouped => h / (self.nv / self.nk),
            HeadMap::Tiled => h % self.nk,
        }
    }

    /// f32 values in the recurrent state: `nv × dk × dv`.
    pub fn state_len(&self) -> usize {
        self.nv * self.dk * self.dv
    }
}

/// Prepared inputs for `n` tokens (token-major, heads inside).
#[derive(Clone, Copy, Debug)]
pub struct GdnInputs<'a> {
    /// `n × nk × dk`, l2-normalised and scaled by `1/sqrt(dk)`.
    pub q: &'a [f32],
    /// `n × nk × dk`, l2-normalised.
    pub k: &'a [f32],
    /// `n × nv × dv`.
    pub v: &'a [f32],
    /// `n × nv` log-decays (≤ 0).
    pub g: &'a [f32],
    /// `n × nv` update strengths in (0, 1).
    pub beta: &'a [f32],
}

/// Normalises each consecutive `d`-vector of `x` to unit l2 norm (`x · rsqrt(Σx² + 1e-6)`,
/// the reference's fixed eps) and multiplies it by `scale`.
pub fn l2norm_heads(x: &mut [f32], d: usize, scale: f32) {
    assert_eq!(x.len() % d, 0, "l2norm_heads: length not a multiple of d");
    for head in x.chunks_exact_mut(d) {
        let ss: f32 = head.iter().map(|v| v * v).sum();
        let f = scale / (ss + 1e-6).sqrt();
        for v in head {
            *v *= f;
        }
    }
}

/// `log(1 + e^x)`, linear above 20 as in PyTorch.
#[inline]
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// Gates for `n` tokens from the projections `a`, `b` (`n × nv` each):
/// `g = ssm_a · softplus(a + dt_bias)` (`ssm_a = −exp(A_log)`, per head) and `β = sigmoid(b)`.
pub fn gates(
    a: &[f32],
    b: &[f32],
    ssm_a: &[f32],
    dt_bias: &[f32],
    g: &mut [f32],
    beta: &mut [f32],
) {
    let nv = ssm_a.len();
    assert_eq!(dt_bias.len(), nv, "gates: dt_bias length");
    assert!(
        a.len() == b.len() && a.len() == g.len() && a.len() == beta.len(),
        "gates: lengths"
    );
    assert_eq!(a.len() % nv.max(1), 0, "gates: length not a multiple of nv");
    for i in 0..a.len() {
        let h = i % nv;
        g[i] = ssm_a[h] * softplus(a[i] + dt_bias[h]);
        beta[i] = sigmoid(b[i]);
    }
}

/// Chunk length of the chunked form. Shorter chunks do less work per token (the O(c) terms)
/// and were fastest here (single thread, dk = dv = 128, AVX2): chunks of 16 / 32 / 64 took
/// 2.8 / 2.9 / 3.6 µs per token and head.
pub const CHUNK: usize = 16;
/// Batches of at least this many tokens use the chunked form when AVX2 is available.
/// Measured with `bench_crossover` (single thread, dk = dv = 128, µs per token and head, a
/// shared 2-core Zen 4 VM, best of 400 short trials): recurrent 5.1 / 3.5 / 3.2 / 3.2 / ~3.1–3.5
/// at n = 1 / 4 / 8 / 16 / ≥32; chunked 4.8 / 3.1 / 2.8 / 2.8 at n = 4 / 8 / 16 / ≥32.
/// The portable chunked form (no hand-written gemm) never beat the portable recurrent one
/// (5.2 vs 4.3), so without AVX2 the recurrent form is always used.
pub const CHUNKED_MIN_TOKENS: usize = 16;

/// Runs `n` tokens through the layer's recurrence: `state` (`nv × dk × dv`) is advanced and
/// `out` (`n × nv × dv`) receives `o_t` for every token and value head. Chooses the chunked
/// form for long batches (AVX2 only), the recurrent form otherwise.
pub fn gated_delta(dims: &GdnDims, inp: &GdnInputs, n: usize, state: &mut [f32], out: &mut [f32]) {
    let isa = Isa::detect();
    if isa.avx2() && n >= CHUNKED_MIN_TOKENS {
        chunked_with(isa, dims, inp, n, CHUNK, state, out);
    } else {
        recurrent_with(isa, dims, inp, n, state, out);
    }
}

/// The token-by-token recurrent form.
pub fn recurrent(dims: &GdnDims, inp: &GdnInputs, n: usize, state: &mut [f32], out: &mut [f32]) {
    recurrent_with(Isa::detect(), dims, inp, n, state, out);
}

/// The chunked closed form with chunks of `chunk` tokens.
pub fn chunked(
    dims: &GdnDims,
    inp: &GdnInputs,
    n: usize,
    chunk: usize,
    state: &mut [f32],
    out: &mut [f32],
) {
    chunked_with(Isa::detect(), dims, inp, n, chunk, state, out);
}

fn check(dims: &GdnDims, inp: &GdnInputs, n: usize, state: &[f32], out: &[f32]) {
    assert!(
        dims.nk > 0 && dims.nv.is_multiple_of(dims.nk),
        "gated_delta: nv must be a multiple of nk"
    );
    assert_eq!(inp.q.len(), n * dims.nk * dims.dk, "gated_delta: q length");
    assert_eq!(inp.k.len(), n * dims.nk * dims.dk, "gated_delta: k length");
    assert_eq!(inp.v.len(), n * dims.nv * dims.dv, "gated_delta: v length");
    assert_eq!(inp.g.len(), n * dims.nv, "gated_delta: g length");
    assert_eq!(inp.beta.len(), n * dims.nv, "gated_delta: beta length");
    assert_eq!(state.len(), dims.state_len(), "gated_delta: state length");
    assert_eq!(out.len(), n * dims.nv * dims.dv, "gated_delta: out length");
}

/// One value head's view of the inputs.
struct HeadIo<'a> {
    inp: &'a GdnInputs<'a>,
    dims: GdnDims,
    h: usize,
    kh: usize,
}

impl HeadIo<'_> {
    fn q(&self, t: usize) -> &[f32] {
        let o = (t * self.dims.nk + self.kh) * self.dims.dk;
        &self.inp.q[o..o + self.dims.dk]
    }
    fn k(&self, t: usize) -> &[f32] {
        let o = (t * self.dims.nk + self.kh) * self.dims.dk;
        &self.inp.k[o..o + self.dims.dk]
    }
    fn v(&self, t: usize) -> &[f32] {
        let o = (t * self.dims.nv + self.h) * self.dims.dv;
        &self.inp.v[o..o + self.dims.dv]
    }
    fn g(&self, t: usize) -> f32 {
        self.inp.g[t * self.dims.nv + self.h]
    }
    fn beta(&self, t: usize) -> f32 {
        self.inp.beta[t * self.dims.nv + self.h]
    }
}

/// Runs `f(head, its state, its output)` for every value head in parallel: head `h` owns
/// `state[h·dk·dv..][..dk·dv]` and columns `h·dv..(h + 1)·dv` of each of the `n` token rows of
/// `out`.
fn for_each_head(
    dims: &GdnDims,
    n: usize,
    state: &mut [f32],
    out: &mut [f32],
    f: impl Fn(usize, &mut [f32], &mut BlockMut<f32>) + Sync,
) {
    let parts = (
        Blocks::chunks(state, dims.dk * dims.dv),
        Blocks::new(out, n, dims.dv),
    );
    threads::for_each(dims.nv, parts, Work::none(), |h, (s, mut o), _| {
        f(h, s.into_slice(), &mut o)
    });
}

/// Recurrent form with an explicit instruction set (tests compare them).
pub(crate) fn recurrent_with(
    isa: Isa,
    dims: &GdnDims,
    inp: &GdnInputs,
    n: usize,
    state: &mut [f32],
    out: &mut [f32],
) {
    check(dims, inp, n, state, out);
    if n == 0 {
        return;
    }
    let d = *dims;
    for_each_head(dims, n, state, out, |h, s, o| {
        let io = HeadIo {
            inp,
            dims: d,
            h,
            kh: d.key_head(h),
        };
        recurrent_head(isa, &io, n, s, o);
    });
}

/// One head's recurrent form on the best path `isa` allows.
fn recurrent_head(isa: Isa, io: &HeadIo, n: usize, s: &mut [f32], out: &mut BlockMut<f32>) {
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() && io.dims.dv.is_multiple_of(8) {
        // SAFETY: an `Isa` with AVX2 exists only on CPUs with AVX2, FMA and F16C
        // (`kernels::simd`); `dv % 8 == 0` and `s` is one head's state (`check`).
        unsafe { avx2::recurrent_head(io, n, s, out) };
        return;
    }
    let _ = isa;
    recurrent_head_portable(io, n, s, out);
}

/// Per token: `kv = Sᵀk`, `sq = Sᵀq` from the old state, then with `α = e^g`:
/// `δ = β(v − α·kv)`, `o = α·sq + (q·k)·δ` (= the updated state read with q) and
/// `S = α·S + k ⊗ δ`.
fn recurrent_head_portable(io: &HeadIo, n: usize, s: &mut [f32], out: &mut BlockMut<f32>) {
    let (dk, dv) = (io.dims.dk, io.dims.dv);
    let mut kv = vec![0f32; dv];
    let mut delta = vec![0f32; dv];
    for t in 0..n {
        let (q, k, v) = (io.q(t), io.k(t), io.v(t));
        let alpha = io.g(t).exp();
        let o = out.row(t);
        portable_step(
            s,
            dk,
            dv,
            (q, k, v),
            alpha,
            io.beta(t),
            &mut kv,
            o,
            &mut delta,
        );
        portable_update(s, dk, dv, alpha, k, &delta);
    }
}

/// One token's outputs from the state before it, portably: `kv = Sᵀk`, `o = Sᵀq` (one pass
/// over S), then `δ = β(v − α·kv)` and `o = α·o + (q·k)·δ`. The recurrent form and the tree
/// form (`tree`) both step through this, so they agree bit for bit.
#[allow(clippy::too_many_arguments)]
fn portable_step(
    s: &[f32],
    dk: usize,
    dv: usize,
    (q, k, v): (&[f32], &[f32], &[f32]),
    alpha: f32,
    beta: f32,
    kv: &mut [f32],
    o: &mut [f32],
    delta: &mut [f32],
) {
    kv.fill(0.0);
    o.fill(0.0);
    for i in 0..dk {
        let row = &s[i * dv..(i + 1) * dv];
        let (ki, qi) = (k[i], q[i]);
        for j in 0..dv {
            kv[j] += row[j] * ki;
            o[j] += row[j] * qi;
        }
    }
    let qk: f32 = q.iter().zip(k).map(|(a, b)| a * b).sum();
    for j in 0..dv {
        delta[j] = beta * (v[j] - alpha * kv[j]);
        o[j] = alpha * o[j] + qk * delta[j];
    }
}

/// `S = α·S + k ⊗ δ`, portably.
fn portable_update(s: &mut [f32], dk: usize, dv: usize, alpha: f32, k: &[f32], delta: &[f32]) {
    for i in 0..dk {
        let row = &mut s[i * dv..(i + 1) * dv];
        let ki = k[i];
        for j in 0..dv {
            row[j] = alpha * row[j] + ki * delta[j];
        }
    }
}

/// Chunked form with an explicit instruction set (tests compare them).
pub(crate) fn chunked_with(
    isa: Isa,
    dims: &GdnDims,
    inp: &GdnInputs,
    n: usize,
    chunk: usize,
    state: &mut [f32],
    out: &mut [f32],
) {
    check(dims, inp, n, state, out);
    assert!(chunk > 0, "gated_delta: chunk of 0 tokens");
    if n == 0 {
        return;
    }
    let d = *dims;
    for_each_head(dims, n, state, out, |h, s, o| {
        let io = HeadIo {
            inp,
            dims: d,
            h,
            kh: d.key_head(h),
        };
        let mut scratch = ChunkScratch::new(chunk, d.dk, d.dv);
        let mut t0 = 0;
        while t0 < n {
            let c = chunk.min(n - t0);
            chunk_head(isa, &io, t0, c, s, &mut scratch, o);
            t0 += c;
        }
    });
}

/// Work buffers of one head's chunk (sized for the longest chunk).
struct ChunkScratch {
    /// `[K; Q]`: `2c × dk`.
    kq: Vec<f32>,
    /// `Kᵀ`: `dk × c` (columns later scaled for the state update).
    kt: Vec<f32>,
    /// `v`, then the right-hand side, then the solution `u`: `c × dv`.
    u: Vec<f32>,
    /// `[K S0; Q S0]`: `2c × dv`.
    ks: Vec<f32>,
    /// `[K Kᵀ; Q Kᵀ]`: `2c × c`, turned in place into the masked, decayed `A` and `P`.
    gram: Vec<f32>,
    /// Outputs: `c × dv`.
    o: Vec<f32>,
    /// Running log-decay `G` and `β`.
    gcum: Vec<f32>,
    beta: Vec<f32>,
}

impl ChunkScratch {
    fn new(chunk: usize, dk: usize, dv: usize) -> Self {
        ChunkScratch {
            kq: vec![0.0; 2 * chunk * dk],
            kt: vec![0.0; dk * chunk],
            u: vec![0.0; chunk * dv],
            ks: vec![0.0; 2 * chunk * dv],
            gram: vec![0.0; 2 * chunk * chunk],
            o: vec![0.0; chunk * dv],
            gcum: vec![0.0; chunk],
            beta: vec![0.0; chunk],
        }
    }
}

/// Advances one head's state over tokens `t0 .. t0 + c` and writes their outputs.
fn chunk_head(
    isa: Isa,
    io: &HeadIo,
    t0: usize,
    c: usize,
    s: &mut [f32],
    w: &mut ChunkScratch,
    out: &mut BlockMut<f32>,
) {
    let (dk, dv) = (io.dims.dk, io.dims.dv);
    // Gather K, Q (rows), Kᵀ, V, G, β.
    let mut run = 0f32;
    for j in 0..c {
        let (k, q) = (io.k(t0 + j), io.q(t0 + j));
        w.kq[j * dk..(j + 1) * dk].copy_from_slice(k);
        w.kq[(c + j) * dk..(c + j + 1) * dk].copy_from_slice(q);
        for (i, &ki) in k.iter().enumerate() {
            w.kt[i * c + j] = ki;
        }
        w.u[j * dv..(j + 1) * dv].copy_from_slice(io.v(t0 + j));
        run += io.g(t0 + j);
        w.gcum[j] = run;
        w.beta[j] = io.beta(t0 + j);
    }
    let (kq, kt, u) = (&w.kq[..2 * c * dk], &mut w.kt[..dk * c], &mut w.u[..c * dv]);
    let (ks, gram, o) = (
        &mut w.ks[..2 * c * dv],
        &mut w.gram[..2 * c * c],
        &mut w.o[..c * dv],
    );
    let (gc, beta) = (&w.gcum[..c], &w.beta[..c]);

    // [K S0; Q S0] and [K Kᵀ; Q Kᵀ].
    gemm(isa, 2 * c, dk, dv, kq, dk, s, dv, ks, dv, false);
    gemm(isa, 2 * c, dk, c, kq, dk, kt, c, gram, c, false);

    // Right-hand side r_j = β_j (v_j − e^{G_j} (S0ᵀ k_j)) and, stored negated,
    // A_jl = β_j e^{G_j−G_l} (k_j·k_l) for l < j.
    for j in 0..c {
        let e = gc[j].exp();
        let (uj, ksj) = (&mut u[j * dv..(j + 1) * dv], &ks[j * dv..(j + 1) * dv]);
        for (x, &y) in uj.iter_mut().zip(ksj) {
            *x = beta[j] * (*x - e * y);
        }
        let arow = &mut gram[j * c..(j + 1) * c];
        for l in 0..c {
            arow[l] = if l < j {
                -beta[j] * (gc[j] - gc[l]).exp() * arow[l]
            } else {
                0.0
            };
        }
    }
    // Forward substitution u_j −= Σ_{l<j} A_jl u_l (unit lower-triangular solve, in place).
    for j in 1..c {
        let (done, rest) = u.split_at_mut(j * dv);
        let uj = &mut rest[..dv];
        gemm(
            isa,
            1,
            j,
            dv,
            &gram[j * c..j * c + j],
            j,
            done,
            dv,
            uj,
            dv,
            true,
        );
    }
    // Outputs: o_i = e^{G_i} (S0ᵀ q_i) + Σ_{l≤i} e^{G_i−G_l} (q_i·k_l) u_l.
    let pgram = &mut gram[c * c..2 * c * c];
    for i in 0..c {
        let e = gc[i].exp();
        let (oi, qsi) = (
            &mut o[i * dv..(i + 1) * dv],
            &ks[(c + i) * dv..(c + i + 1) * dv],
        );
        for (x, &y) in oi.iter_mut().zip(qsi) {
            *x = e * y;
        }
        let prow = &mut pgram[i * c..(i + 1) * c];
        for l in 0..c {
            prow[l] = if l <= i {
                (gc[i] - gc[l]).exp() * prow[l]
            } else {
                0.0
            };
        }
    }
    gemm(isa, c, c, dv, pgram, c, u, dv, o, dv, true);
    for i in 0..c {
        out.row(t0 + i).copy_from_slice(&o[i * dv..(i + 1) * dv]);
    }
    // State: S = e^{G_c} S0 + Σ_j e^{G_c−G_j} k_j ⊗ u_j.
    let glast = gc[c - 1];
    let decay = glast.exp();
    for x in s.iter_mut() {
        *x *= decay;
    }
    let fac: Vec<f32> = gc.iter().map(|&g| (glast - g).exp()).collect();
    for row in kt.chunks_exact_mut(c) {
        for (x, f) in row.iter_mut().zip(&fac) {
            *x *= f;
        }
    }
    gemm(isa, dk, c, dv, kt, c, u, dv, s, dv, true);
}

/// `C (+)= A · B` with `A`: `m × kk` (row stride `lda`), `B`: `kk × nn` (row stride `ldb`),
/// `C`: `m × nn` (row stride `ldc`); `accumulate = false` overwrites `C`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm(
    isa: Isa,
    m: usize,
    kk: usize,
    nn: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    if m == 0 || nn == 0 {
        return;
    }
    assert!(lda >= kk && ldb >= nn && ldc >= nn, "gemm: strides");
    assert!(a.len() >= (m - 1) * lda + kk, "gemm: a too short");
    assert!(
        kk == 0 || b.len() >= (kk - 1) * ldb + nn,
        "gemm: b too short"
    );
    assert!(c.len() >= (m - 1) * ldc + nn, "gemm: c too short");
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        // SAFETY: an `Isa` with AVX2 exists only on CPUs with AVX2, FMA and F16C
        // (`kernels::simd`); the bounds are checked above.
        unsafe { avx2::gemm(m, kk, nn, a, lda, b, ldb, c, ldc, accumulate) };
        return;
    }
    let _ = isa;
    gemm_portable(m, kk, nn, a, lda, b, ldb, c, ldc, accumulate)
}

#[allow(clippy::too_many_arguments)]
fn gemm_portable(
    m: usize,
    kk: usize,
    nn: usize,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
) {
    for i in 0..m {
        let crow = &mut c[i * ldc..i * ldc + nn];
        if !accumulate {
            crow.fill(0.0);
        }
        for p in 0..kk {
            let aip = a[i * lda + p];
            let brow = &b[p * ldb..p * ldb + nn];
            for (x, &y) in crow.iter_mut().zip(brow) {
                *x += aip * y;
            }
        }
    }
}

pub mod tree;

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::HeadIo;
    use crate::kernels::threads::parts::BlockMut;
    use std::arch::x86_64::*;

    /// The recurrent form with one pass over the state per token: the update of token t is
    /// fused with the projections `Sᵀk`, `Sᵀq` that token t+1 needs.
    ///
    /// # Safety
    /// Requires AVX2 and FMA, `dv % 8 == 0`, `s.len() == dk·dv`.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn recurrent_head(io: &HeadIo, n: usize, s: &mut [f32], out: &mut BlockMut<f32>) {
        let (dk, dv) = (io.dims.dk, io.dims.dv);
        debug_assert!(dv % 8 == 0 && s.len() == dk * dv);
        let mut kv = vec![0f32; dv];
        let mut sq = vec![0f32; dv];
        let mut delta = vec![0f32; dv];
        project(s, dk, dv, io.k(0), io.q(0), &mut kv, &mut sq);
        for t in 0..n {
            let (q, k, v) = (io.q(t), io.k(t), io.v(t));
            let alpha = io.g(t).exp();
            let beta = io.beta(t);
            let qk = dot(q, k);
            let o = out.row(t);
            for j in 0..dv {
                delta[j] = beta * (v[j] - alpha * kv[j]);
                o[j] = alpha * sq[j] + qk * delta[j];
            }
            if t + 1 < n {
                update_project(
                    s,
                    dk,
                    dv,
                    alpha,
                    k,
                    &delta,
                    io.k(t + 1),
                    io.q(t + 1),
                    &mut kv,
                    &mut sq,
                );
            } else {
                update(s, dk, dv, alpha, k, &delta);
            }
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
        let mut acc = _mm256_setzero_ps();
        let n8 = a.len() / 8 * 8;
        let mut i = 0;
        while i < n8 {
            acc = _mm256_fmadd_ps(
                _mm256_loadu_ps(a.as_ptr().add(i)),
                _mm256_loadu_ps(b.as_ptr().add(i)),
                acc,
            );
            i += 8;
        }
        let mut tail = 0f32;
        for j in n8..a.len() {
            tail += a[j] * b[j];
        }
        hsum(acc) + tail
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
        _mm_cvtss_f32(s)
    }

    /// `kv = Sᵀk`, `sq = Sᵀq`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn project(
        s: &[f32],
        dk: usize,
        dv: usize,
        k: &[f32],
        q: &[f32],
        kv: &mut [f32],
        sq: &mut [f32],
    ) {
        let sp = s.as_ptr();
        let mut j = 0;
        // 32 columns at a time: eight independent accumulator chains hide the FMA latency.
        while j + 32 <= dv {
            let mut a = [_mm256_setzero_ps(); 4];
            let mut b = [_mm256_setzero_ps(); 4];
            for i in 0..dk {
                let ki = _mm256_set1_ps(*k.get_unchecked(i));
                let qi = _mm256_set1_ps(*q.get_unchecked(i));
                for v in 0..4 {
                    let x = _mm256_loadu_ps(sp.add(i * dv + j + 8 * v));
                    a[v] = _mm256_fmadd_ps(ki, x, a[v]);
                    b[v] = _mm256_fmadd_ps(qi, x, b[v]);
                }
            }
            for v in 0..4 {
                _mm256_storeu_ps(kv.as_mut_ptr().add(j + 8 * v), a[v]);
                _mm256_storeu_ps(sq.as_mut_ptr().add(j + 8 * v), b[v]);
            }
            j += 32;
        }
        while j < dv {
            let (mut a0, mut b0) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            for i in 0..dk {
                let x = _mm256_loadu_ps(sp.add(i * dv + j));
                a0 = _mm256_fmadd_ps(_mm256_set1_ps(*k.get_unchecked(i)), x, a0);
                b0 = _mm256_fmadd_ps(_mm256_set1_ps(*q.get_unchecked(i)), x, b0);
            }
            _mm256_storeu_ps(kv.as_mut_ptr().add(j), a0);
            _mm256_storeu_ps(sq.as_mut_ptr().add(j), b0);
            j += 8;
        }
    }

    /// `S = α·S + k ⊗ δ`, then `kv = Sᵀk'`, `sq = Sᵀq'` with the updated S, in one pass.
    /// Columns go in blocks of 32, then 16 and 8.
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn update_project(
        s: &mut [f32],
        dk: usize,
        dv: usize,
        alpha: f32,
        k: &[f32],
        delta: &[f32],
        kn: &[f32],
        qn: &[f32],
        kv: &mut [f32],
        sq: &mut [f32],
    ) {
        let sp = s.as_mut_ptr();
        let al = _mm256_set1_ps(alpha);
        let mut j = 0;
        while j + 32 <= dv {
            let mut d = [_mm256_setzero_ps(); 4];
            for (v, x) in d.iter_mut().enumerate() {
                *x = _mm256_loadu_ps(delta.as_ptr().add(j + 8 * v));
            }
            let mut a = [_mm256_setzero_ps(); 4];
            let mut b = [_mm256_setzero_ps(); 4];
            for i in 0..dk {
                let ki = _mm256_set1_ps(*k.get_unchecked(i));
                let kni = _mm256_set1_ps(*kn.get_unchecked(i));
                let qni = _mm256_set1_ps(*qn.get_unchecked(i));
                for v in 0..4 {
                    let p = sp.add(i * dv + j + 8 * v);
                    let x = _mm256_fmadd_ps(ki, d[v], _mm256_mul_ps(al, _mm256_loadu_ps(p)));
                    _mm256_storeu_ps(p, x);
                    a[v] = _mm256_fmadd_ps(kni, x, a[v]);
                    b[v] = _mm256_fmadd_ps(qni, x, b[v]);
                }
            }
            for v in 0..4 {
                _mm256_storeu_ps(kv.as_mut_ptr().add(j + 8 * v), a[v]);
                _mm256_storeu_ps(sq.as_mut_ptr().add(j + 8 * v), b[v]);
            }
            j += 32;
        }
        while j + 16 <= dv {
            let d0 = _mm256_loadu_ps(delta.as_ptr().add(j));
            let d1 = _mm256_loadu_ps(delta.as_ptr().add(j + 8));
            let (mut kv0, mut kv1, mut sq0, mut sq1) = (
                _mm256_setzero_ps(),
                _mm256_setzero_ps(),
                _mm256_setzero_ps(),
                _mm256_setzero_ps(),
            );
            for i in 0..dk {
                let ki = _mm256_set1_ps(*k.get_unchecked(i));
                let kni = _mm256_set1_ps(*kn.get_unchecked(i));
                let qni = _mm256_set1_ps(*qn.get_unchecked(i));
                let p = sp.add(i * dv + j);
                let x0 = _mm256_fmadd_ps(ki, d0, _mm256_mul_ps(al, _mm256_loadu_ps(p)));
                let x1 = _mm256_fmadd_ps(ki, d1, _mm256_mul_ps(al, _mm256_loadu_ps(p.add(8))));
                _mm256_storeu_ps(p, x0);
                _mm256_storeu_ps(p.add(8), x1);
                kv0 = _mm256_fmadd_ps(kni, x0, kv0);
                kv1 = _mm256_fmadd_ps(kni, x1, kv1);
                sq0 = _mm256_fmadd_ps(qni, x0, sq0);
                sq1 = _mm256_fmadd_ps(qni, x1, sq1);
            }
            _mm256_storeu_ps(kv.as_mut_ptr().add(j), kv0);
            _mm256_storeu_ps(kv.as_mut_ptr().add(j + 8), kv1);
            _mm256_storeu_ps(sq.as_mut_ptr().add(j), sq0);
            _mm256_storeu_ps(sq.as_mut_ptr().add(j + 8), sq1);
            j += 16;
        }
        while j < dv {
            let d0 = _mm256_loadu_ps(delta.as_ptr().add(j));
            let (mut kv0, mut sq0) = (_mm256_setzero_ps(), _mm256_setzero_ps());
            for i in 0..dk {
                let p = sp.add(i * dv + j);
                let x0 = _mm256_fmadd_ps(
                    _mm256_set1_ps(*k.get_unchecked(i)),
                    d0,
                    _mm256_mul_ps(al, _mm256_loadu_ps(p)),
                );
                _mm256_storeu_ps(p, x0);
                kv0 = _mm256_fmadd_ps(_mm256_set1_ps(*kn.get_unchecked(i)), x0, kv0);
                sq0 = _mm256_fmadd_ps(_mm256_set1_ps(*qn.get_unchecked(i)), x0, sq0);
            }
            _mm256_storeu_ps(kv.as_mut_ptr().add(j), kv0);
            _mm256_storeu_ps(sq.as_mut_ptr().add(j), sq0);
            j += 8;
        }
    }

    /// `S = α·S + k ⊗ δ`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn update(
        s: &mut [f32],
        dk: usize,
        dv: usize,
        alpha: f32,
        k: &[f32],
        delta: &[f32],
    ) {
        let sp = s.as_mut_ptr();
        let al = _mm256_set1_ps(alpha);
        // Column blocks with δ held in registers (streaming δ from memory beside the state
        // stores was measured 2× slower).
        let mut j = 0;
        while j + 32 <= dv {
            let mut d = [_mm256_setzero_ps(); 4];
            for (v, dv_) in d.iter_mut().enumerate() {
                *dv_ = _mm256_loadu_ps(delta.as_ptr().add(j + 8 * v));
            }
            for i in 0..dk {
                let ki = _mm256_set1_ps(*k.get_unchecked(i));
                for (v, dvec) in d.iter().enumerate() {
                    let p = sp.add(i * dv + j + 8 * v);
                    _mm256_storeu_ps(
                        p,
                        _mm256_fmadd_ps(ki, *dvec, _mm256_mul_ps(al, _mm256_loadu_ps(p))),
                    );
                }
            }
            j += 32;
        }
        while j < dv {
            let d0 = _mm256_loadu_ps(delta.as_ptr().add(j));
            for i in 0..dk {
                let p = sp.add(i * dv + j);
                let ki = _mm256_set1_ps(*k.get_unchecked(i));
                _mm256_storeu_ps(
                    p,
                    _mm256_fmadd_ps(ki, d0, _mm256_mul_ps(al, _mm256_loadu_ps(p))),
                );
            }
            j += 8;
        }
    }

    /// `C (+)= A·B`, register-blocked 4 rows × 16 columns, then 1 × 16, 1 × 8 and scalar tails.
    ///
    /// # Safety
    /// Requires AVX2 and FMA; the caller checked that every index is inside the slices.
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gemm(
        m: usize,
        kk: usize,
        nn: usize,
        a: &[f32],
        lda: usize,
        b: &[f32],
        ldb: usize,
        c: &mut [f32],
        ldc: usize,
        accumulate: bool,
    ) {
        let (ap, bp, cp) = (a.as_ptr(), b.as_ptr(), c.as_mut_ptr());
        let mut j = 0;
        while j + 16 <= nn {
            let mut i = 0;
            while i + 6 <= m {
                tile::<6>(
                    kk,
                    ap.add(i * lda),
                    lda,
                    bp.add(j),
                    ldb,
                    cp.add(i * ldc + j),
                    ldc,
                    accumulate,
                );
                i += 6;
            }
            if i + 4 <= m {
                tile::<4>(
                    kk,
                    ap.add(i * lda),
                    lda,
                    bp.add(j),
                    ldb,
                    cp.add(i * ldc + j),
                    ldc,
                    accumulate,
                );
                i += 4;
            }
            while i < m {
                let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
                for p in 0..kk {
                    let av = _mm256_set1_ps(*ap.add(i * lda + p));
                    a0 = _mm256_fmadd_ps(av, _mm256_loadu_ps(bp.add(p * ldb + j)), a0);
                    a1 = _mm256_fmadd_ps(av, _mm256_loadu_ps(bp.add(p * ldb + j + 8)), a1);
                }
                store(cp.add(i * ldc + j), a0, accumulate);
                store(cp.add(i * ldc + j + 8), a1, accumulate);
                i += 1;
            }
            j += 16;
        }
        while j + 8 <= nn {
            for i in 0..m {
                let mut a0 = _mm256_setzero_ps();
                for p in 0..kk {
                    a0 = _mm256_fmadd_ps(
                        _mm256_set1_ps(*ap.add(i * lda + p)),
                        _mm256_loadu_ps(bp.add(p * ldb + j)),
                        a0,
                    );
                }
                store(cp.add(i * ldc + j), a0, accumulate);
            }
            j += 8;
        }
        while j < nn {
            for i in 0..m {
                let mut x = 0f32;
                for p in 0..kk {
                    x += *ap.add(i * lda + p) * *bp.add(p * ldb + j);
                }
                let dst = cp.add(i * ldc + j);
                *dst = if accumulate { *dst + x } else { x };
            }
            j += 1;
        }
    }

    /// `R` rows × 16 columns of `C (+)= A·B`: 2·R accumulators, one broadcast of A per row
    /// and two loads of B per step of the inner dimension.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile<const R: usize>(
        kk: usize,
        ap: *const f32,
        lda: usize,
        bp: *const f32,
        ldb: usize,
        cp: *mut f32,
        ldc: usize,
        accumulate: bool,
    ) {
        let mut acc0 = [_mm256_setzero_ps(); R];
        let mut acc1 = [_mm256_setzero_ps(); R];
        for p in 0..kk {
            let b0 = _mm256_loadu_ps(bp.add(p * ldb));
            let b1 = _mm256_loadu_ps(bp.add(p * ldb + 8));
            for r in 0..R {
                let av = _mm256_set1_ps(*ap.add(r * lda + p));
                acc0[r] = _mm256_fmadd_ps(av, b0, acc0[r]);
                acc1[r] = _mm256_fmadd_ps(av, b1, acc1[r]);
            }
        }
        for r in 0..R {
            store(cp.add(r * ldc), acc0[r], accumulate);
            store(cp.add(r * ldc + 8), acc1[r], accumulate);
        }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn store(dst: *mut f32, v: __m256, accumulate: bool) {
        let v = if accumulate {
            _mm256_add_ps(_mm256_loadu_ps(dst), v)
        } else {
            v
        };
        _mm256_storeu_ps(dst, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Rng(u64);
    impl Rng {
        /// Uniform in [-1, 1).
        fn next(&mut self) -> f32 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        }
        fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
            (0..n).map(|_| self.next() * scale).collect()
        }
    }

    /// Random prepared inputs shaped like a real layer's (unit q/k, g ≤ 0, β in (0, 1)).
    struct Case {
        dims: GdnDims,
        n: usize,
        q: Vec<f32>,
        k: Vec<f32>,
        v: Vec<f32>,
        g: Vec<f32>,
        beta: Vec<f32>,
        s0: Vec<f32>,
    }

    impl Case {
        fn new(dims: GdnDims, n: usize, seed: u64) -> Case {
            let mut r = Rng(seed);
            let mut q = r.vec(n * dims.nk * dims.dk, 1.0);
            let mut k = r.vec(n * dims.nk * dims.dk, 1.0);
            l2norm_heads(&mut q, dims.dk, 1.0 / (dims.dk as f32).sqrt());
            l2norm_heads(&mut k, dims.dk, 1.0);
            let v = r.vec(n * dims.nv * dims.dv, 2.0);
            let a = r.vec(n * dims.nv, 3.0);
            let b = r.vec(n * dims.nv, 3.0);
            let ssm_a: Vec<f32> = (0..dims.nv).map(|h| -(0.2 + h as f32 * 0.3)).collect();
            let dt_bias = r.vec(dims.nv, 1.0);
            let mut g = vec![0f32; n * dims.nv];
            let mut beta = vec![0f32; n * dims.nv];
            gates(&a, &b, &ssm_a, &dt_bias, &mut g, &mut beta);
            let s0 = r.vec(dims.state_len(), 0.5);
            Case {
                dims,
                n,
                q,
                k,
                v,
                g,
                beta,
                s0,
            }
        }
        fn inputs(&self) -> GdnInputs<'_> {
            GdnInputs {
                q: &self.q,
                k: &self.k,
                v: &self.v,
                g: &self.g,
                beta: &self.beta,
            }
        }
        /// Tokens `t0..t1` only.
        fn slice(&self, t0: usize, t1: usize) -> GdnInputs<'_> {
            let (qk, vv, hv) = (
                self.dims.nk * self.dims.dk,
                self.dims.nv * self.dims.dv,
                self.dims.nv,
            );
            GdnInputs {
                q: &self.q[t0 * qk..t1 * qk],
                k: &self.k[t0 * qk..t1 * qk],
                v: &self.v[t0 * vv..t1 * vv],
                g: &self.g[t0 * hv..t1 * hv],
                beta: &self.beta[t0 * hv..t1 * hv],
            }
        }

        /// The recurrence exactly as written in the reference (decay, read, delta, rank-1
        /// update, read the updated state), in f64. Returns (outputs, final state).
        fn reference(&self) -> (Vec<f32>, Vec<f32>) {
            let GdnDims {
                nk,
                nv,
                dk,
                dv,
                map,
            } = self.dims;
            let mut s: Vec<f64> = self.s0.iter().map(|&x| x as f64).collect();
            let mut out = vec![0f32; self.n * nv * dv];
            for t in 0..self.n {
                for h in 0..nv {
                    let kh = match map {
                        HeadMap::Grouped => h / (nv / nk),
                        HeadMap::Tiled => h % nk,
                    };
                    let q = &self.q[(t * nk + kh) * dk..][..dk];
                    let k = &self.k[(t * nk + kh) * dk..][..dk];
                    let v = &self.v[(t * nv + h) * dv..][..dv];
                    let g = self.g[t * nv + h] as f64;
                    let beta = self.beta[t * nv + h] as f64;
                    let st = &mut s[h * dk * dv..(h + 1) * dk * dv];
                    for x in st.iter_mut() {
                        *x *= g.exp();
                    }
                    let mut delta = vec![0f64; dv];
                    for j in 0..dv {
                        let mem: f64 = (0..dk).map(|i| st[i * dv + j] * k[i] as f64).sum();
                        delta[j] = (v[j] as f64 - mem) * beta;
                    }
                    for i in 0..dk {
                        for j in 0..dv {
                            st[i * dv + j] += k[i] as f64 * delta[j];
                        }
                    }
                    for j in 0..dv {
                        let o: f64 = (0..dk).map(|i| st[i * dv + j] * q[i] as f64).sum();
                        out[(t * nv + h) * dv + j] = o as f32;
                    }
                }
            }
            (out, s.iter().map(|&x| x as f32).collect())
        }
    }

    fn max_err(a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len());
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max)
    }

    fn paths() -> Vec<Isa> {
        Isa::available().collect()
    }

    fn dims(nk: usize, nv: usize, dk: usize, dv: usize, map: HeadMap) -> GdnDims {
        GdnDims {
            nk,
            nv,
            dk,
            dv,
            map,
        }
    }

    #[test]
    fn recurrent_matches_reference() {
        for (ci, d) in [
            dims(2, 4, 16, 24, HeadMap::Grouped),
            dims(2, 6, 8, 12, HeadMap::Tiled),
            dims(1, 1, 32, 32, HeadMap::Grouped),
        ]
        .into_iter()
        .enumerate()
        {
            let case = Case::new(d, 9, 100 + ci as u64);
            let (want_o, want_s) = case.reference();
            for path in paths() {
                let mut s = case.s0.clone();
                let mut o = vec![0f32; case.n * d.nv * d.dv];
                recurrent_with(path, &d, &case.inputs(), case.n, &mut s, &mut o);
                let (eo, es) = (max_err(&o, &want_o), max_err(&s, &want_s));
                assert!(
                    eo < 1e-4 && es < 1e-4,
                    "{path:?} {d:?}: out {eo}, state {es}"
                );
            }
        }
    }

    #[test]
    fn head_map_matters() {
        // With nv ≠ nk the two maps read different key heads: a wrong map must change outputs.
        let d = dims(2, 4, 8, 8, HeadMap::Grouped);
        let case = Case::new(d, 3, 5);
        let run = |dd: GdnDims| {
            let mut s = case.s0.clone();
            let mut o = vec![0f32; case.n * d.nv * d.dv];
            recurrent_with(Isa::PORTABLE, &dd, &case.inputs(), case.n, &mut s, &mut o);
            o
        };
        assert!(
            max_err(
                &run(d),
                &run(GdnDims {
                    map: HeadMap::Tiled,
                    ..d
                })
            ) > 1e-3
        );
        assert_eq!(d.key_head(1), 0);
        assert_eq!(
            GdnDims {
                map: HeadMap::Tiled,
                ..d
            }
            .key_head(1),
            1
        );
    }

    #[test]
    fn chunked_matches_reference() {
        let d = dims(2, 4, 16, 24, HeadMap::Grouped);
        let case = Case::new(d, 150, 42);
        let (want_o, want_s) = case.reference();
        for path in paths() {
            for chunk in [1, 7, 16, 64, 200] {
                let mut s = case.s0.clone();
                let mut o = vec![0f32; case.n * d.nv * d.dv];
                chunked_with(path, &d, &case.inputs(), case.n, chunk, &mut s, &mut o);
                let (eo, es) = (max_err(&o, &want_o), max_err(&s, &want_s));
                assert!(
                    eo < 2e-4 && es < 2e-4,
                    "{path:?} chunk {chunk}: out {eo}, state {es}"
                );
            }
        }
        // Odd head sizes (no AVX2 recurrent path; gemm tails) and the tiled map.
        let d = dims(1, 3, 12, 20, HeadMap::Tiled);
        let case = Case::new(d, 37, 43);
        let (want_o, want_s) = case.reference();
        for path in paths() {
            let mut s = case.s0.clone();
            let mut o = vec![0f32; case.n * d.nv * d.dv];
            chunked_with(path, &d, &case.inputs(), case.n, 16, &mut s, &mut o);
            let (eo, es) = (max_err(&o, &want_o), max_err(&s, &want_s));
            assert!(
                eo < 2e-4 && es < 2e-4,
                "{path:?} odd dims: out {eo}, state {es}"
            );
        }
    }

    #[test]
    fn pieces_equal_whole_and_forms_agree() {
        // Prefill in uneven pieces with the dispatcher (mixing both forms) = one recurrent pass.
        let d = dims(2, 4, 16, 16, HeadMap::Grouped);
        let case = Case::new(d, 140, 9);
        let mut s_whole = case.s0.clone();
        let mut o_whole = vec![0f32; case.n * d.nv * d.dv];
        recurrent(&d, &case.inputs(), case.n, &mut s_whole, &mut o_whole);
        let mut s = case.s0.clone();
        let mut o = vec![0f32; case.n * d.nv * d.dv];
        let vv = d.nv * d.dv;
        let mut t0 = 0;
        for p in [1, 70, 3, 15, 16, 35] {
            let t1 = t0 + p;
            gated_delta(&d, &case.slice(t0, t1), p, &mut s, &mut o[t0 * vv..t1 * vv]);
            t0 = t1;
        }
        assert_eq!(t0, case.n);
        let (eo, es) = (max_err(&o, &o_whole), max_err(&s, &s_whole));
        assert!(eo < 2e-4 && es < 2e-4, "out {eo}, state {es}");
    }

    #[test]
    fn strong_decay_and_zero_length() {
        // Very negative g (state forgotten) must stay finite in the chunked form.
        let d = dims(1, 2, 8, 8, HeadMap::Grouped);
        let mut case = Case::new(d, 40, 3);
        for (i, g) in case.g.iter_mut().enumerate() {
            if i % 5 == 0 {
                *g = -200.0;
            }
        }
        let (want_o, want_s) = case.reference();
        for path in paths() {
            let mut s = case.s0.clone();
            let mut o = vec![0f32; case.n * d.nv * d.dv];
            chunked_with(path, &d, &case.inputs(), case.n, 16, &mut s, &mut o);
            assert!(o.iter().chain(&s).all(|x| x.is_finite()));
            assert!(max_err(&o, &want_o) < 2e-4 && max_err(&s, &want_s) < 2e-4);
        }
        let empty = Case::new(d, 0, 1);
        let mut s = empty.s0.clone();
        gated_delta(&d, &empty.inputs(), 0, &mut s, &mut []);
        assert_eq!(s, empty.s0);
    }

    #[test]
    fn gemm_paths_agree() {
        let mut r = Rng(77);
        for &(m, kk, nn) in &[
            (1, 1, 1),
            (4, 16, 16),
            (7, 13, 37),
            (9, 64, 24),
            (130, 5, 8),
            (11, 20, 48),
            (3, 0, 5),
        ] {
            let (lda, ldb, ldc) = (kk + 3, nn + 1, nn + 2);
            let a = r.vec(m * lda, 1.0);
            let b = r.vec(kk.max(1) * ldb, 1.0);
            let c0 = r.vec(m * ldc, 1.0);
            // Direct definition.
            let mut want = c0.clone();
            for i in 0..m {
                for j in 0..nn {
                    let x: f32 = (0..kk).map(|p| a[i * lda + p] * b[p * ldb + j]).sum();
                    want[i * ldc + j] += x;
                }
            }
            for path in paths() {
                let mut c = c0.clone();
                gemm(path, m, kk, nn, &a, lda, &b, ldb, &mut c, ldc, true);
                assert!(max_err(&c, &want) < 1e-4, "{path:?} {m}x{kk}x{nn}");
                let mut c = c0.clone();
                gemm(path, m, kk, nn, &a, lda, &b, ldb, &mut c, ldc, false);
                for i in 0..m {
                    for j in 0..ldc {
                        let w = if j < nn {
                            want[i * ldc + j] - c0[i * ldc + j]
                        } else {
                            c0[i * ldc + j]
                        };
                        assert!(
                            (c[i * ldc + j] - w).abs() < 1e-4,
                            "{path:?} overwrite {m}x{kk}x{nn}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn gates_and_norm() {
        let mut g = [0f32; 4];
        let mut beta = [0f32; 4];
        // a + dt_bias = 0 → softplus = ln 2; = 30 → linear; b = 0 → β = 1/2.
        gates(
            &[0.0, 29.0, -1.0, 1.0],
            &[0.0, 100.0, -100.0, 2.0],
            &[-2.0, -0.5],
            &[0.0, 1.0],
            &mut g,
            &mut beta,
        );
        assert!((g[0] + 2.0 * std::f32::consts::LN_2).abs() < 1e-6);
        assert!((g[1] + 0.5 * 30.0).abs() < 1e-5);
        assert!((g[2] + 2.0 * (1.0f32 + (-1.0f32).exp()).ln()).abs() < 1e-6);
        assert!(
            (beta[0] - 0.5).abs() < 1e-7
                && beta[1] == 1.0
                && beta[2] < 1e-40
                && (beta[3] - 1.0 / (1.0 + (-2.0f32).exp())).abs() < 1e-6
        );
        let mut x = [3.0f32, 4.0, 0.0, 0.0];
        l2norm_heads(&mut x, 2, 0.5);
        assert!((x[0] - 0.3).abs() < 1e-6 && (x[1] - 0.4).abs() < 1e-6 && x[2] == 0.0);
    }

    /// Single-thread timing of one head of Qwen3.5-9B size (dk = dv = 128) in both forms
    /// (run with `--ignored --nocapture`). Best of several trials: the machine is shared.
    #[test]
    #[ignore]
    fn bench_crossover() {
        let d = dims(1, 1, 128, 128, HeadMap::Grouped);
        for &n in &[1usize, 2, 4, 8, 16, 32, 64, 128, 256] {
            let case = Case::new(d, n, 1);
            let inp = case.inputs();
            let io = HeadIo {
                inp: &inp,
                dims: d,
                h: 0,
                kh: 0,
            };
            let mut o = vec![0f32; n * d.dv];
            let mut out = BlockMut::whole(&mut o, n);
            let reps = (16 / n).max(1);
            let time = |f: &mut dyn FnMut(&mut [f32])| {
                let mut s = case.s0.clone();
                f(&mut s);
                (0..400)
                    .map(|_| {
                        let t = std::time::Instant::now();
                        for _ in 0..reps {
                            f(&mut s);
                        }
                        t.elapsed().as_secs_f64() / (reps * n) as f64 * 1e9
                    })
                    .fold(f64::MAX, f64::min)
            };
            let mut line = format!("n={n:4} ns/token/head:");
            for path in paths() {
                let r = time(&mut |s| recurrent_head(path, &io, n, s, &mut out));
                line += &format!("  {path:?} recurrent {r:6.0}");
                for chunk in [16, 32, 64] {
                    if chunk <= n.max(16) {
                        let mut w = ChunkScratch::new(chunk, d.dk, d.dv);
                        let c = time(&mut |s| {
                            let mut t0 = 0;
                            while t0 < n {
                                let c = chunk.min(n - t0);
                                chunk_head(path, &io, t0, c, s, &mut w, &mut out);
                                t0 += c;
                            }
                        });
                        line += &format!(" chunk{chunk} {c:6.0}");
                    }
                }
            }
            println!("{line}");
        }
    }

    /// Single-thread GFLOP/s of `gemm` at the chunked form's shapes (`--ignored --nocapture`).
    #[test]
    #[ignore]
    fn bench_gemm() {
        let mut r = Rng(5);
        for &(m, kk, nn) in &[
            (32usize, 128usize, 128usize),
            (128, 16, 128),
            (32, 128, 16),
            (16, 16, 128),
            (64, 128, 128),
            (128, 64, 128),
        ] {
            let a = r.vec(m * kk, 1.0);
            let b = r.vec(kk * nn, 1.0);
            let mut c = vec![0f32; m * nn];
            for path in paths() {
                let reps = 5;
                let best = (0..2000)
                    .map(|_| {
                        let t = std::time::Instant::now();
                        for _ in 0..reps {
                            gemm(path, m, kk, nn, &a, kk, &b, nn, &mut c, nn, true);
                        }
                        t.elapsed().as_secs_f64() / reps as f64
                    })
                    .fold(f64::MAX, f64::min);
                println!(
                    "{m}x{kk}x{nn} {path:?}: {:.2} µs, {:.1} GFLOP/s",
                    best * 1e6,
                    2.0 * (m * kk * nn) as f64 / best * 1e-9
                );
            }
        }
    }
}
