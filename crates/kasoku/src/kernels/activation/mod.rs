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

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(test)]
mod tests;

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
pub(crate) fn swiglu_inplace_with(isa: Isa, gate: &mut [f32], up: &[f32]) {
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
