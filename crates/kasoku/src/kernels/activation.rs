//! Element-wise activations and the softmax: SiLU, sigmoid, the SwiGLU product
//! `silu(gate) · up`, the sigmoid output gate `x · sigmoid(g)`, and a numerically stable
//! softmax in f32.
//!
//! These run once per activation element (not per weight), so they are a small share of a
//! forward pass; they are portable code that the compiler vectorises where it can, except the
//! SwiGLU product of the MLP (tens of thousands of elements per token), whose `e^x` is a
//! polynomial ([`exp_poly`]) computed by a portable path and an AVX2/FMA path with the same
//! operations in the same order, so both give the same bits.

use super::simd::Isa;

/// `1 / (1 + e^-x)`, stable for large |x|.
#[inline]
pub fn sigmoid(x: f32) -> f32 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

/// `x · sigmoid(x)`.
#[inline]
pub fn silu(x: f32) -> f32 {
    x * sigmoid(x)
}

/// `x[i] = silu(x[i])`.
pub fn silu_inplace(x: &mut [f32]) {
    for v in x {
        *v = silu(*v);
    }
}

/// `out[i] = silu(gate[i]) · up[i]` (the SwiGLU MLP's inner product), as [`swiglu_inplace`].
pub fn swiglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
    assert!(
        gate.len() == up.len() && up.len() == out.len(),
        "swiglu: length mismatch"
    );
    out.copy_from_slice(gate);
    swiglu_inplace(out, up);
}

/// `gate[i] = silu(gate[i]) · up[i]`, in place, with `silu(g) = g / (1 + exp_poly(-g))`
/// (within a few ulp of [`silu`]).
pub fn swiglu_inplace(gate: &mut [f32], up: &[f32]) {
    swiglu_inplace_with(Isa::detect(), gate, up);
}

/// [`swiglu_inplace`] with an explicit instruction set (the paths give the same bits).
fn swiglu_inplace_with(isa: Isa, gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "swiglu: length mismatch");
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        // SAFETY: an `Isa` with AVX2 exists only on CPUs with AVX2, FMA and F16C
        // (`kernels::simd`); the lengths are equal.
        unsafe { avx2::swiglu_inplace(gate, up) };
        return;
    }
    let _ = isa;
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = swiglu_one(*g, u);
    }
}

/// `g / (1 + exp_poly(-g)) · u`: one element of [`swiglu_inplace`].
#[inline]
fn swiglu_one(g: f32, u: f32) -> f32 {
    g / (1.0 + exp_poly(-g)) * u
}

/// `log2(e)`, and `ln 2` split into a part with trailing zero bits and the rest, so that
/// `x - n·ln2` is exact for the `n` that occur.
const LOG2E: f32 = std::f32::consts::LOG2_E;
const LN2_HI: f32 = 0.693_359_4;
const LN2_LO: f32 = -2.121_944_4e-4;
/// Minimax coefficients of `(e^r - 1 - r) / r²` on `|r| ≤ ln2 / 2` (highest power first).
const EXP_POLY: [f32; 6] = [
    1.987_569_1e-4,
    1.398_2e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    0.166_666_65,
    0.5,
];

/// `e^x` to within 2 ulp for normal results: `x = n·ln2 + r`, `e^x = 2^n · (1 + r + r²·p(r))`.
/// Inputs are first clamped to `[-87, 88]` (a NaN becomes -87), so the result is always a
/// finite normal number. The AVX2 path performs exactly these operations.
#[inline]
#[allow(clippy::manual_clamp)] // clamp keeps a NaN; max/min turn it into -87, as the SIMD path does
pub fn exp_poly(x: f32) -> f32 {
    let x = x.max(-87.0).min(88.0);
    let n = (x * LOG2E).round_ties_even();
    let r = n.mul_add(-LN2_HI, x);
    let r = n.mul_add(-LN2_LO, r);
    let mut p = EXP_POLY[0];
    for &c in &EXP_POLY[1..] {
        p = p.mul_add(r, c);
    }
    let y = p.mul_add(r * r, r) + 1.0;
    y * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
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
}

/// `x[i] *= sigmoid(gate[i])` (the output gate of Qwen3.5's gated attention).
pub fn sigmoid_gate(x: &mut [f32], gate: &[f32]) {
    assert_eq!(x.len(), gate.len(), "sigmoid_gate: length mismatch");
    for (v, &g) in x.iter_mut().zip(gate) {
        *v *= sigmoid(g);
    }
}

/// Softmax over `x` in place: `x[i] = e^(x[i] - max) / Σ e^(x[j] - max)`.
/// Entries equal to `-inf` get probability 0; an empty slice is left alone.
pub fn softmax_inplace(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if x.is_empty() || max == f32::NEG_INFINITY {
        return;
    }
    let mut sum = 0f32;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f32, b: f64, tol: f64) -> bool {
        ((a as f64) - b).abs() <= tol * (1.0 + b.abs())
    }

    #[test]
    fn sigmoid_and_silu_match_f64_formulas() {
        for i in -400..=400 {
            let x = i as f32 * 0.1;
            let s = 1.0 / (1.0 + (-(x as f64)).exp());
            assert!(close(sigmoid(x), s, 1e-6), "sigmoid({x})");
            assert!(close(silu(x), x as f64 * s, 1e-6), "silu({x})");
        }
        assert_eq!(sigmoid(-1000.0), 0.0);
        assert_eq!(sigmoid(1000.0), 1.0);
        assert!(silu(-1000.0).abs() < 1e-30 && !silu(-1000.0).is_nan());
    }

    #[test]
    fn swiglu_and_gate_are_elementwise() {
        let g = [-2.0f32, 0.0, 0.5, 3.0];
        let u = [1.5f32, 2.0, -1.0, 0.25];
        let mut out = [0f32; 4];
        swiglu(&g, &u, &mut out);
        for i in 0..4 {
            let s = 1.0 / (1.0 + (-(g[i] as f64)).exp());
            assert!(close(out[i], g[i] as f64 * s * u[i] as f64, 1e-6));
        }
        let mut inplace = g;
        swiglu_inplace(&mut inplace, &u);
        assert_eq!(inplace, out);
        let mut x = u;
        sigmoid_gate(&mut x, &g);
        for i in 0..4 {
            let s = 1.0 / (1.0 + (-(g[i] as f64)).exp());
            assert!(close(x[i], u[i] as f64 * s, 1e-6));
        }
    }

    #[test]
    fn exp_poly_is_within_2_ulp() {
        let mut worst = 0f64;
        for i in -87_000..88_000 {
            let x = i as f32 * 1e-3 + 3.1e-5;
            let exact = (x as f64).exp();
            let ulp = (exact as f32).abs() * f32::EPSILON;
            worst = worst.max((exp_poly(x) as f64 - exact).abs() / ulp as f64);
        }
        assert!(worst <= 2.0, "worst error {worst} ulp");
        assert_eq!(exp_poly(0.0), 1.0);
        assert!(exp_poly(-1000.0) > 0.0 && exp_poly(1000.0).is_finite());
        assert_eq!(exp_poly(f32::NAN), exp_poly(-87.0));
    }

    #[test]
    fn swiglu_simd_path_gives_the_portable_bits() {
        // Lengths that leave a scalar tail; values across exp's whole clamped range.
        for n in [1usize, 7, 8, 9, 100, 1029] {
            let g: Vec<f32> = (0..n)
                .map(|i| ((i * 7919 % 2001) as f32 - 1000.0) * 0.11)
                .collect();
            let u: Vec<f32> = (0..n).map(|i| (i % 13) as f32 * 0.3 - 1.7).collect();
            for isa in Isa::available() {
                let mut fast = g.clone();
                swiglu_inplace_with(isa, &mut fast, &u);
                for i in 0..n {
                    assert_eq!(
                        fast[i].to_bits(),
                        swiglu_one(g[i], u[i]).to_bits(),
                        "n={n} i={i}"
                    );
                    let want = silu(g[i]) as f64 * u[i] as f64;
                    assert!(
                        close(fast[i], want, 1e-6),
                        "n={n} i={i}: {} vs {want}",
                        fast[i]
                    );
                }
            }
        }
    }

    #[test]
    fn softmax_matches_reference_and_handles_masks() {
        let mut x = [1.0f32, 2.0, 3.0, f32::NEG_INFINITY, 100.0, -100.0];
        let src: Vec<f64> = x.iter().map(|&v| v as f64).collect();
        softmax_inplace(&mut x);
        let max = src.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = src.iter().map(|v| (v - max).exp()).sum();
        for (a, s) in x.iter().zip(&src) {
            assert!(close(*a, (s - max).exp() / sum, 1e-6));
        }
        assert_eq!(x[3], 0.0);
        let total: f32 = x.iter().sum();
        assert!((total - 1.0).abs() < 1e-6);
        let mut all_masked = [f32::NEG_INFINITY; 3];
        softmax_inplace(&mut all_masked);
        assert!(all_masked.iter().all(|v| *v == f32::NEG_INFINITY));
    }
}
