//! Element-wise activations and the softmax: SiLU, sigmoid, the SwiGLU product
//! `silu(gate) · up`, the sigmoid output gate `x · sigmoid(g)`, and a numerically stable
//! softmax in f32.
//!
//! These run once per activation element (not per weight), so they are a small share of a
//! forward pass; they are portable code that the compiler vectorises where it can.

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

/// `out[i] = silu(gate[i]) · up[i]` (the SwiGLU MLP's inner product).
pub fn swiglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
    assert!(
        gate.len() == up.len() && up.len() == out.len(),
        "swiglu: length mismatch"
    );
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = silu(g) * u;
    }
}

/// `gate[i] = silu(gate[i]) · up[i]`, in place.
pub fn swiglu_inplace(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "swiglu: length mismatch");
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = silu(*g) * u;
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
