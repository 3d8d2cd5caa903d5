//! AVX2/FMA loops of the Gated DeltaNet forms: the recurrent step over a head's state (alone
//! and fused with the next token's projections) and the register-blocked `gemm` of the chunked
//! form.

use super::HeadIo;
use crate::kernels::threads::parts::BlockMut;
use std::arch::x86_64::*;

/// The recurrent form with one pass over the state per token: the update of token t is
/// fused with the projections `Sᵀk`, `Sᵀq` that token t+1 needs.
///
/// `kv`, `sq` and `delta` are work vectors of `dv` values.
///
/// # Safety
/// Requires AVX2 and FMA, `dv % 8 == 0`, `s.len() == dk·dv`.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn recurrent_head(
    io: &HeadIo,
    n: usize,
    s: &mut [f32],
    out: &mut BlockMut<f32>,
    kv: &mut [f32],
    sq: &mut [f32],
    delta: &mut [f32],
) {
    let (dk, dv) = (io.dims.dk, io.dims.dv);
    assert!(dv % 8 == 0 && s.len() == dk * dv);
    assert!(kv.len() == dv && sq.len() == dv && delta.len() == dv);
    project(s, dk, dv, io.k(0), io.q(0), kv, sq);
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
            update_project(s, dk, dv, alpha, k, delta, io.k(t + 1), io.q(t + 1), kv, sq);
        } else {
            update(s, dk, dv, alpha, k, delta);
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
