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
//! (the recurrent step and `gemm`) have a portable path and an AVX2/FMA path (`avx2.rs`).
//! Files: the recurrent form (`recurrent.rs`), the chunked form (`chunked.rs`), the tree form
//! and its commit (`tree.rs`); inputs, gates and the dispatch are here.

use std::cell::Cell;

use super::activation::sigmoid;
use super::scratch;
use super::simd::Isa;
use super::threads::{self, parts::BlockMut, Blocks, Work};

#[cfg(target_arch = "x86_64")]
mod avx2;
mod chunked;
mod recurrent;
#[cfg(test)]
mod tests;
pub mod tree;

pub use chunked::chunked;
pub(crate) use chunked::chunked_with;
pub use recurrent::recurrent;
pub(crate) use recurrent::recurrent_with;

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
/// Each head gets `work_len` values of work memory (the calling thread's, reused across calls).
fn for_each_head(
    dims: &GdnDims,
    n: usize,
    state: &mut [f32],
    out: &mut [f32],
    work_len: usize,
    f: impl Fn(usize, &mut [f32], &mut BlockMut<f32>, &mut [f32]) + Sync,
) {
    let parts = (
        Blocks::chunks(state, dims.dk * dims.dv),
        Blocks::new(out, n, dims.dv),
    );
    scratch::with(&WORK, |buf| {
        let work = Work::new(buf, work_len);
        threads::for_each(dims.nv, parts, work, |h, (s, mut o), work| {
            f(h, s.into_slice(), &mut o, work)
        });
    });
}

thread_local! {
    /// The calling thread's work memory for its head tasks.
    static WORK: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}
