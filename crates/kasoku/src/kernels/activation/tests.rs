//! Tests of the activations against f64 formulas, and of the SIMD path against the portable one.

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
