//! RMSNorm: `y = w · x / sqrt(mean(x²) + eps)`, row by row, in f32.
//!
//! The "(1 + w)" form of Qwen3.5 checkpoints is handled by the caller adding 1 to the weight
//! once at load (as GGUF converters do), so there is one kernel. The sum of squares is taken
//! in f64 (as ggml does), the scale and products in f32. Portable path plus an AVX2/FMA path
//! chosen at run time; both compute the same function (they differ only in f64 summation
//! order).

use super::simd::Isa;

/// Normalises each row of `x` (rows of `weight.len()` values) into `out`.
pub fn rmsnorm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let d = weight.len();
    assert!(
        d > 0 && x.len().is_multiple_of(d),
        "rmsnorm: x is not a whole number of rows"
    );
    assert_eq!(x.len(), out.len(), "rmsnorm: out has the wrong length");
    let isa = Isa::detect();
    for (xr, yr) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        row(isa, xr, weight, eps, yr);
    }
}

/// Normalises each row of `x` in place.
pub fn rmsnorm_inplace(x: &mut [f32], weight: &[f32], eps: f32) {
    let d = weight.len();
    assert!(
        d > 0 && x.len().is_multiple_of(d),
        "rmsnorm: x is not a whole number of rows"
    );
    let isa = Isa::detect();
    let mut tmp = vec![0f32; d];
    for xr in x.chunks_exact_mut(d) {
        row(isa, xr, weight, eps, &mut tmp);
        xr.copy_from_slice(&tmp);
    }
}

fn row(isa: Isa, x: &[f32], w: &[f32], eps: f32, y: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        // SAFETY: an `Isa` with AVX2 exists only on CPUs with AVX2, FMA and F16C
        // (`kernels::simd`).
        unsafe { avx2::row(x, w, eps, y) };
        return;
    }
    let _ = isa;
    portable::row(x, w, eps, y);
}

mod portable {
    pub fn row(x: &[f32], w: &[f32], eps: f32, y: &mut [f32]) {
        let ss: f64 = x.iter().map(|&v| v as f64 * v as f64).sum();
        let scale = 1.0 / ((ss / x.len() as f64) as f32 + eps).sqrt();
        for ((o, &v), &g) in y.iter_mut().zip(x).zip(w) {
            *o = v * scale * g;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    /// # Safety
    /// The CPU must support AVX2 and FMA; `w` and `y` must be as long as `x`.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn row(x: &[f32], w: &[f32], eps: f32, y: &mut [f32]) {
        let n = x.len();
        assert!(w.len() == n && y.len() == n);
        let (xp, wp, yp) = (x.as_ptr(), w.as_ptr(), y.as_mut_ptr());
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
        let scale = 1.0 / ((ss / n as f64) as f32 + eps).sqrt();
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
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic pseudo-random values in [-scale, scale).
    fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
        let mut s = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
            })
            .collect()
    }

    fn reference(x: &[f32], w: &[f32], eps: f32) -> Vec<f64> {
        let d = w.len();
        let mut out = Vec::new();
        for r in x.chunks(d) {
            let ms: f64 = r.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>() / d as f64;
            let s = 1.0 / (ms + eps as f64).sqrt();
            out.extend(r.iter().zip(w).map(|(&v, &g)| v as f64 * s * g as f64));
        }
        out
    }

    #[test]
    fn rmsnorm_matches_f64_reference() {
        for &d in &[1usize, 7, 8, 15, 16, 17, 64, 576, 1000] {
            let x = values(3 * d, d as u64, 4.0);
            let w = values(d, 99 + d as u64, 2.0);
            let want = reference(&x, &w, 1e-5);
            let mut got = vec![0f32; x.len()];
            rmsnorm(&x, &w, 1e-5, &mut got);
            let mut inplace = x.clone();
            rmsnorm_inplace(&mut inplace, &w, 1e-5);
            for i in 0..x.len() {
                assert!(
                    (got[i] as f64 - want[i]).abs() <= 1e-5 * (1.0 + want[i].abs()),
                    "d={d} i={i}"
                );
                assert_eq!(got[i], inplace[i]);
            }
        }
    }

    #[test]
    fn portable_and_avx2_agree() {
        #[cfg(target_arch = "x86_64")]
        if Isa::detect().avx2() {
            for &d in &[3usize, 8, 24, 33, 576, 2048] {
                let x = values(d, 7 * d as u64, 10.0);
                let w = values(d, 3, 1.0);
                let (mut a, mut b) = (vec![0f32; d], vec![0f32; d]);
                portable::row(&x, &w, 1e-6, &mut a);
                // SAFETY: AVX2 and FMA are available.
                unsafe { avx2::row(&x, &w, 1e-6, &mut b) };
                for i in 0..d {
                    assert!(
                        (a[i] - b[i]).abs() <= 1e-5 * (1.0 + a[i].abs()),
                        "d={d} i={i}: {} vs {}",
                        a[i],
                        b[i]
                    );
                }
            }
            return;
        }
        eprintln!("note: AVX2/FMA not available; only the portable path was tested");
    }

    #[test]
    fn zero_row_gives_zero_not_nan() {
        let x = vec![0f32; 16];
        let w = vec![1f32; 16];
        let mut y = vec![1f32; 16];
        rmsnorm(&x, &w, 1e-6, &mut y);
        assert!(y.iter().all(|v| *v == 0.0));
    }
}
