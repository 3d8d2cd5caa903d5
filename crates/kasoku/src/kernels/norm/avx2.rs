//! AVX2/FMA path of RMSNorm: the sum of squares in f64 lanes, the scaling in f32 ones.

use std::arch::x86_64::*;

/// # Safety
/// The CPU must support AVX2 and FMA; `w` and `y` must be as long as `x`.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn row(x: &[f32], w: &[f32], eps: f32, y: &mut [f32]) {
    let n = x.len();
    assert!(w.len() == n && y.len() == n);
    apply(x, w, scale(x, eps), y);
}

/// `y[i] = x[i] · scale · w[i]`.
///
/// # Safety
/// The CPU must support AVX2 and FMA; `w` and `y` must be as long as `x`.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn apply(x: &[f32], w: &[f32], scale: f32, y: &mut [f32]) {
    let n = x.len();
    assert!(w.len() == n && y.len() == n);
    let (xp, wp, yp) = (x.as_ptr(), w.as_ptr(), y.as_mut_ptr());
    let s = _mm256_set1_ps(scale);
    let mut i = 0;
    while i + 8 <= n {
        let v = _mm256_mul_ps(_mm256_loadu_ps(xp.add(i)), s);
        _mm256_storeu_ps(yp.add(i), _mm256_mul_ps(v, _mm256_loadu_ps(wp.add(i))));
        i += 8;
    }
    while i < n {
        *yp.add(i) = *xp.add(i) * scale * *wp.add(i);
        i += 1;
    }
}

/// The row's factor `1 / sqrt(mean(x²) + eps)`.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn scale(x: &[f32], eps: f32) -> f32 {
    let n = x.len();
    let xp = x.as_ptr();
    // Sum of squares in f64 (as ggml does): the mean is then exact to f32 rounding, so
    // results do not drift with the summation order.
    let mut acc0 = _mm256_setzero_pd();
    let mut acc1 = _mm256_setzero_pd();
    let mut i = 0;
    while i + 8 <= n {
        let a = _mm256_cvtps_pd(_mm_loadu_ps(xp.add(i)));
        let b = _mm256_cvtps_pd(_mm_loadu_ps(xp.add(i + 4)));
        acc0 = _mm256_fmadd_pd(a, a, acc0);
        acc1 = _mm256_fmadd_pd(b, b, acc1);
        i += 8;
    }
    let mut lanes = [0f64; 4];
    _mm256_storeu_pd(lanes.as_mut_ptr(), _mm256_add_pd(acc0, acc1));
    let mut ss = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
    while i < n {
        let v = *xp.add(i) as f64;
        ss += v * v;
        i += 1;
    }
    1.0 / ((ss / n as f64) as f32 + eps).sqrt()
}
