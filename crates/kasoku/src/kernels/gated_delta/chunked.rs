//! The chunked closed form (see the module documentation of `gated_delta`): per chunk of
//! tokens, small dense products ([`gemm`]) and one triangular solve per head.

use super::{check, for_each_head, GdnDims, GdnInputs, HeadIo};
use crate::kernels::simd::Isa;
use crate::kernels::threads::parts::BlockMut;

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
    let work_len = ChunkScratch::len(chunk, d.dk, d.dv);
    for_each_head(dims, n, state, out, work_len, |h, s, o, work| {
        let io = HeadIo {
            inp,
            dims: d,
            h,
            kh: d.key_head(h),
        };
        let mut scratch = ChunkScratch::carve(work, chunk, d.dk, d.dv);
        let mut t0 = 0;
        while t0 < n {
            let c = chunk.min(n - t0);
            chunk_head(isa, &io, t0, c, s, &mut scratch, o);
            t0 += c;
        }
    });
}

/// Work buffers of one head's chunk (sized for the longest chunk), carved from its work
/// memory.
pub(super) struct ChunkScratch<'w> {
    /// `[K; Q]`: `2c × dk`.
    kq: &'w mut [f32],
    /// `Kᵀ`: `dk × c` (columns later scaled for the state update).
    kt: &'w mut [f32],
    /// `v`, then the right-hand side, then the solution `u`: `c × dv`.
    u: &'w mut [f32],
    /// `[K S0; Q S0]`: `2c × dv`.
    ks: &'w mut [f32],
    /// `[K Kᵀ; Q Kᵀ]`: `2c × c`, turned in place into the masked, decayed `A` and `P`.
    gram: &'w mut [f32],
    /// Outputs: `c × dv`.
    o: &'w mut [f32],
    /// Running log-decay `G`, `β`, and the decays `e^{G_c − G_j}` of the state update.
    gcum: &'w mut [f32],
    beta: &'w mut [f32],
    fac: &'w mut [f32],
}

impl<'w> ChunkScratch<'w> {
    /// The values [`ChunkScratch::carve`] takes.
    pub(super) fn len(chunk: usize, dk: usize, dv: usize) -> usize {
        3 * chunk * dk + 4 * chunk * dv + 2 * chunk * chunk + 3 * chunk
    }

    /// The buffers for chunks of up to `chunk` tokens, from `work` (at least
    /// [`ChunkScratch::len`] values).
    pub(super) fn carve(work: &'w mut [f32], chunk: usize, dk: usize, dv: usize) -> Self {
        let (kq, rest) = work.split_at_mut(2 * chunk * dk);
        let (kt, rest) = rest.split_at_mut(dk * chunk);
        let (u, rest) = rest.split_at_mut(chunk * dv);
        let (ks, rest) = rest.split_at_mut(2 * chunk * dv);
        let (gram, rest) = rest.split_at_mut(2 * chunk * chunk);
        let (o, rest) = rest.split_at_mut(chunk * dv);
        let (gcum, rest) = rest.split_at_mut(chunk);
        let (beta, rest) = rest.split_at_mut(chunk);
        let fac = &mut rest[..chunk];
        ChunkScratch {
            kq,
            kt,
            u,
            ks,
            gram,
            o,
            gcum,
            beta,
            fac,
        }
    }
}

/// Advances one head's state over tokens `t0 .. t0 + c` and writes their outputs.
pub(super) fn chunk_head(
    isa: Isa,
    io: &HeadIo,
    t0: usize,
    c: usize,
    s: &mut [f32],
    w: &mut ChunkScratch<'_>,
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
    let fac = &mut w.fac[..c];
    for (f, &g) in fac.iter_mut().zip(gc) {
        *f = (glast - g).exp();
    }
    for row in kt.chunks_exact_mut(c) {
        for (x, f) in row.iter_mut().zip(&*fac) {
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
        unsafe { super::avx2::gemm(m, kk, nn, a, lda, b, ldb, c, ldc, accumulate) };
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
