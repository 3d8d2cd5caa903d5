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
pub(super) struct ChunkScratch {
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
    pub(super) fn new(chunk: usize, dk: usize, dv: usize) -> Self {
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
pub(super) fn chunk_head(
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
