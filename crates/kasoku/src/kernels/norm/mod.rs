//! RMSNorm: `y = w · x / sqrt(mean(x²) + eps)`, row by row, in f32.
//!
//! The "(1 + w)" form of Qwen3.5 checkpoints is handled by the caller adding 1 to the weight
//! once at load (as GGUF converters do), so there is one kernel. The sum of squares is taken
//! in f64 (as ggml does), the scale and products in f32. Portable path plus an AVX2/FMA path
//! chosen at run time; both compute the same function (they differ only in f64 summation
//! order).

use std::cell::Cell;

use super::scratch;
use super::simd::Isa;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(test)]
mod tests;

/// Normalises each row of `x` (rows of `weight.len()` values) into `out`.
pub fn rmsnorm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    rmsnorm_with(Isa::detect(), x, weight, eps, out)
}

/// [`rmsnorm`] on the path of `isa`.
pub(crate) fn rmsnorm_with(isa: Isa, x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let d = weight.len();
    assert!(
        d > 0 && x.len().is_multiple_of(d),
        "rmsnorm: x is not a whole number of rows"
    );
    assert_eq!(x.len(), out.len(), "rmsnorm: out has the wrong length");
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
    scratch::with(&ROW, |buf| {
        let tmp = scratch::grow(buf, d);
        for xr in x.chunks_exact_mut(d) {
            row(isa, xr, weight, eps, tmp);
            xr.copy_from_slice(tmp);
        }
    });
}

thread_local! {
    /// The calling thread's normalised row.
    static ROW: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
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

/// The factor `1 / sqrt(mean(x²) + eps)` of the row `x`, as the path of `isa` computes it
/// (the paths sum the squares in different orders): a normalised value is then
/// `x[i] · scale · w[i]` ([`apply`]), which the fused epilogues (`kernels::fused`) compute
/// chunk by chunk.
pub(crate) fn row_scale(isa: Isa, x: &[f32], eps: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        // SAFETY: as in `row`.
        return unsafe { avx2::scale(x, eps) };
    }
    let _ = isa;
    portable::scale(x, eps)
}

/// `y[i] = x[i] · scale · w[i]` (the second step of a row, `scale` from [`row_scale`]), as
/// every path computes it.
#[inline]
pub(crate) fn apply(isa: Isa, x: &[f32], w: &[f32], scale: f32, y: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        // SAFETY: as in `row`; the lengths are checked there.
        unsafe { avx2::apply(x, w, scale, y) };
        return;
    }
    let _ = isa;
    portable::apply(x, w, scale, y);
}

mod portable {
    pub fn row(x: &[f32], w: &[f32], eps: f32, y: &mut [f32]) {
        apply(x, w, scale(x, eps), y);
    }

    pub fn apply(x: &[f32], w: &[f32], scale: f32, y: &mut [f32]) {
        assert!(w.len() == x.len() && y.len() == x.len());
        for ((o, &v), &g) in y.iter_mut().zip(x).zip(w) {
            *o = v * scale * g;
        }
    }

    pub fn scale(x: &[f32], eps: f32) -> f32 {
        let ss: f64 = x.iter().map(|&v| v as f64 * v as f64).sum();
        1.0 / ((ss / x.len() as f64) as f32 + eps).sqrt()
    }
}
