//! Epilogues fused with the online rotation and int8 quantization of kasoku's formats: the
//! RMSNorm before q/k/v and gate/up, the SwiGLU product before the down projection and the
//! attention output before `o_proj` write the activations of the next product directly as
//! rotated int8 blocks ([`Prepared`]) when those matrices are M or L, instead of writing f32
//! rows that the product then rotates and quantizes in a pass of its own.
//!
//! Each row is computed chunk by chunk (a rotation block, or 64 values if that is larger): a
//! chunk's values are made on the stack and go at once through the transform of
//! [`Int8Acts::fill_rows`] (signs, Hadamard butterflies, int8 blocks with their scales and
//! sums), so the f32 row is never written out and read back. Batches of prefill size run
//! their rows over the worker pool (the unfused RMSNorm and SwiGLU run on the calling thread).
//!
//! **Bits.** An epilogue computes its values with the very operations of its unfused kernel on
//! the same instruction-set path (RMSNorm: the row's factor from `norm::row_scale`, then
//! `x · scale · w` by `norm::apply`; SwiGLU: `activation::swiglu_inplace_with`; attention: the same tasks and
//! the same merge of their partial results, `attention::attend_rows`) and hands them to the
//! same transform that `matmul` applies to f32 rows, so the prepared activations, and so every
//! product, equal the unfused kernel's followed by the product's own preparation, bit for bit
//! on every path (`tests.rs`); speculative verification stays exact.
//!
//! `KASOKU_UNFUSED=1` in the environment turns the fusion off ([`enabled`]) for A/B
//! comparisons: callers then take the unfused kernels, with the same results.

use std::sync::OnceLock;

use super::attention::{attend_rows, AttnArgs};
use super::matmul::{MatMulWeight, Prepared};
use super::norm::{apply, row_scale};
use super::simd::Isa;

#[cfg(test)]
mod bench;
#[cfg(test)]
mod tests;

/// Whether callers should fuse (unless `KASOKU_UNFUSED` is set; read once per process).
pub fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    #[cfg(test)]
    if let Some(on) = FORCE.with(|f| f.get()) {
        return on;
    }
    *ON.get_or_init(|| std::env::var_os("KASOKU_UNFUSED").is_none())
}

#[cfg(test)]
thread_local! {
    /// Tests set this to choose the fused or the unfused path on their thread.
    static FORCE: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
}

/// Makes [`enabled`] answer `on` on the calling thread (`None`: the process's setting).
#[cfg(test)]
pub(crate) fn force(on: Option<bool>) {
    FORCE.with(|f| f.set(on));
}

/// The rotation signs and width of the activations `w` reads.
fn target(w: &MatMulWeight) -> (Option<&crate::quant::kasoku::Signs>, usize) {
    let k = w
        .kasoku
        .as_ref()
        .expect("fused epilogue: a matrix in one of kasoku's formats");
    (k.signs(), w.cols)
}

/// RMSNorm of the rows of `x` (rows of `weight.len()` values), written into `out` prepared for
/// products with `w` (and every matrix of its rotation and width).
pub fn rmsnorm(x: &[f32], weight: &[f32], eps: f32, w: &MatMulWeight, out: &mut Prepared) {
    rmsnorm_with(Isa::detect(), x, weight, eps, w, out)
}

/// [`rmsnorm`] on the path of `isa`.
pub(crate) fn rmsnorm_with(
    isa: Isa,
    x: &[f32],
    weight: &[f32],
    eps: f32,
    w: &MatMulWeight,
    out: &mut Prepared,
) {
    let (signs, d) = target(w);
    assert!(
        weight.len() == d && x.len().is_multiple_of(d),
        "fused rmsnorm: rows of another width"
    );
    let n = x.len() / d;
    out.kasoku_mut()
        .fill_rows(isa, n, d, signs, 0, |r, row, _| {
            let x = &x[r * d..(r + 1) * d];
            let scale = row_scale(isa, x, eps);
            let c = row.chunk();
            for c0 in (0..d).step_by(c) {
                row.put_with(c0, |v| {
                    apply(isa, &x[c0..c0 + c], &weight[c0..c0 + c], scale, v)
                });
            }
        });
}

/// `silu(gate) · up` (as `activation::swiglu_inplace`; rows of `w.cols()` values), written
/// into `out` prepared for products with `w`; `gate` is left as it is.
pub fn swiglu(gate: &[f32], up: &[f32], w: &MatMulWeight, out: &mut Prepared) {
    swiglu_with(Isa::detect(), gate, up, w, out)
}

/// [`swiglu`] on the path of `isa`.
pub(crate) fn swiglu_with(
    isa: Isa,
    gate: &[f32],
    up: &[f32],
    w: &MatMulWeight,
    out: &mut Prepared,
) {
    let (signs, f) = target(w);
    assert!(
        gate.len() == up.len() && gate.len().is_multiple_of(f),
        "fused swiglu: rows of another width"
    );
    let n = gate.len() / f;
    out.kasoku_mut()
        .fill_rows(isa, n, f, signs, 0, |r, row, _| {
            let c = row.chunk();
            for c0 in (0..f).step_by(c) {
                let at = r * f + c0;
                row.put_with(c0, |v| {
                    v.copy_from_slice(&gate[at..at + c]);
                    crate::kernels::activation::swiglu_inplace_with(isa, v, &up[at..at + c]);
                });
            }
        });
}

/// Attention (as `attention::attend`), its output rows (`n_heads × head_dim` values, which
/// must be `w.cols()`) written into `out` prepared for products with `w`.
pub fn attend(args: &AttnArgs, w: &MatMulWeight, out: &mut Prepared) {
    attend_with(Isa::detect(), args, w, out)
}

/// [`attend`] on the path of `isa`.
pub(crate) fn attend_with(isa: Isa, args: &AttnArgs, w: &MatMulWeight, out: &mut Prepared) {
    let (signs, width) = target(w);
    let q_row = args.geo.n_heads * args.geo.head_dim;
    assert!(
        q_row == width && args.q.len().is_multiple_of(q_row),
        "fused attention: rows of another width"
    );
    let n = args.q.len() / q_row;
    let acts = out.kasoku_mut();
    attend_rows(isa, args, &mut |merger| {
        // Each row merged into the running thread's work memory, then put whole.
        acts.fill_rows(isa, n, q_row, signs, q_row, |r, row, work| {
            merger.row(r, work);
            row.put_row(work);
        })
    });
}
