//! AVX2/FMA path of the SwiGLU product: [`super::exp_poly`] on eight lanes, operation for
//! operation, so it gives the portable path's bits.

use std::arch::x86_64::*;

use super::{swiglu_one, EXP_POLY, LN2_HI, LN2_LO, LOG2E};

/// Eight lanes of [`super::exp_poly`], operation for operation.
#[target_feature(enable = "avx2,fma")]
unsafe fn exp_poly(x: __m256) -> __m256 {
    // max(x, lo) returns lo for a NaN x, as f32::max does.
    let x = _mm256_min_ps(
        _mm256_max_ps(x, _mm256_set1_ps(-87.0)),
        _mm256_set1_ps(88.0),
    );
    let n = _mm256_round_ps(
        _mm256_mul_ps(x, _mm256_set1_ps(LOG2E)),
        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC,
    );
    let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_HI), x);
    let r = _mm256_fmadd_ps(n, _mm256_set1_ps(-LN2_LO), r);
    let mut p = _mm256_set1_ps(EXP_POLY[0]);
    for &c in &EXP_POLY[1..] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    let y = _mm256_add_ps(
        _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r),
        _mm256_set1_ps(1.0),
    );
    let e = _mm256_slli_epi32::<23>(_mm256_add_epi32(
        _mm256_cvtps_epi32(n),
        _mm256_set1_epi32(127),
    ));
    _mm256_mul_ps(y, _mm256_castsi256_ps(e))
}

/// # Safety
/// The CPU must support AVX2 and FMA; `up` must be as long as `gate`.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn swiglu_inplace(gate: &mut [f32], up: &[f32]) {
    let n = gate.len();
    assert_eq!(up.len(), n);
    let (gp, up_p) = (gate.as_mut_ptr(), up.as_ptr());
    let one = _mm256_set1_ps(1.0);
    let sign = _mm256_set1_ps(-0.0);
    let mut i = 0;
    while i + 8 <= n {
        let g = _mm256_loadu_ps(gp.add(i));
        let e = exp_poly(_mm256_xor_ps(g, sign));
        let s = _mm256_div_ps(g, _mm256_add_ps(one, e));
        _mm256_storeu_ps(gp.add(i), _mm256_mul_ps(s, _mm256_loadu_ps(up_p.add(i))));
        i += 8;
    }
    for j in i..n {
        *gp.add(j) = swiglu_one(*gp.add(j), *up_p.add(j));
    }
}
