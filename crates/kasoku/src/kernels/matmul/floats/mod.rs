//! Products on float weights (F32, F16, BF16): packing and the portable tile kernel (the AVX2
//! one is in `avx2.rs`). Activations stay f32.
//!
//! **Packed layout.** Weight rows in groups of [`GROUP`] = 8 (the last padded with zeros),
//! column-interleaved: element `(c, i)` of group `g` (row `8g + i`) is at
//! `(g·cols + c)·8 + i`, in the weight's own type. One load (and conversion) gives column `c` of
//! eight rows; multiplied by `x[r][c]` broadcast it advances eight outputs of activation row `r`,
//! so each weight is read once for all activation rows and no horizontal sums are needed.
//!
//! **Order of operations** (the same in both paths, so they agree bit for bit, whatever the
//! number of activation rows): for each (row, activation row), two accumulators take the even
//! and the odd columns in order with `fma`, and the result is `acc_even + acc_odd`.

use half::f16;

use super::{Format, PackedBytes, Tile};
use crate::kernels::simd::Isa;
use crate::quant::DType;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(test)]
mod tests;

/// The float formats' kernels.
pub(crate) struct Floats;

/// Weight rows packed together.
pub(crate) const GROUP: usize = 8;
/// Activation rows per kernel call.
const XR_MAX: usize = 4;
/// Activation rows per outer block.
const XB: usize = 64;
/// Columns per chunk (even, so column parity is preserved across chunks).
const KC: usize = 512;
/// Accumulator floats per activation row: two column parities × eight rows.
pub(crate) const ACC: usize = 2 * GROUP;

impl Format for Floats {
    /// Repacks row-major rows into column-interleaved 8-row groups.
    fn pack(&self, dtype: DType, rows: usize, cols: usize, bytes: &[u8]) -> PackedBytes {
        let es = dtype.block_bytes();
        let groups = rows.div_ceil(GROUP);
        let mut out = PackedBytes::zeroed(groups * cols * GROUP * es);
        for row in 0..rows {
            let (g, i) = (row / GROUP, row % GROUP);
            let src = &bytes[row * cols * es..(row + 1) * cols * es];
            for (c, e) in src.chunks_exact(es).enumerate() {
                let at = ((g * cols + c) * GROUP + i) * es;
                out[at..at + es].copy_from_slice(e);
            }
        }
        out.freeze()
    }

    /// Float activations need no conversion: the kernel reads `t.x`.
    fn compute_tile(&self, t: &Tile, tile: &mut [f32], _work: &mut [f32]) {
        let (w, x, n, rows) = (t.w, t.x, t.n, t.rows.clone());
        debug_assert_eq!(rows.start % GROUP, 0);
        let es = w.dtype.block_bytes();
        let cols = w.cols;
        let group_bytes = cols * GROUP * es;
        let len = rows.len();
        let mut acc = [0f32; XB * ACC];
        for xr0 in (0..n).step_by(XB) {
            let xn = XB.min(n - xr0);
            for g in rows.start / GROUP..rows.end.div_ceil(GROUP) {
                acc[..xn * ACC].fill(0.0);
                let gw = &w.packed[g * group_bytes..(g + 1) * group_bytes];
                for c0 in (0..cols).step_by(KC) {
                    let kn = KC.min(cols - c0);
                    let wchunk = &gw[c0 * GROUP * es..(c0 + kn) * GROUP * es];
                    for xt in (0..xn).step_by(XR_MAX) {
                        let xr = XR_MAX.min(xn - xt);
                        let xs = &x[(xr0 + xt) * cols..(xr0 + xt + xr) * cols];
                        let a = &mut acc[xt * ACC..(xt + xr) * ACC];
                        kernel(w.dtype, t.isa, wchunk, kn, xs, cols, c0, xr, a);
                    }
                }
                for r in 0..xn {
                    let a = &acc[r * ACC..(r + 1) * ACC];
                    for i in 0..GROUP {
                        let j = g * GROUP + i;
                        if j < rows.end {
                            tile[(xr0 + r) * len + j - rows.start] = a[i] + a[GROUP + i];
                        }
                    }
                }
            }
        }
    }
}

/// Accumulates columns `c0..c0 + kn` of one weight group (`w`, starting at `c0`) for `xr`
/// activation rows (`x`, full rows of `cols`) into `acc[r][parity][i]`.
#[allow(clippy::too_many_arguments)]
fn kernel(
    dtype: DType,
    isa: Isa,
    w: &[u8],
    kn: usize,
    x: &[f32],
    cols: usize,
    c0: usize,
    xr: usize,
    acc: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        // SAFETY: an `Isa` with AVX2 exists only on CPUs with AVX2, FMA and F16C
        // (`kernels::simd`); the kernel checks the slices' lengths.
        unsafe { avx2::kernel(dtype, w, kn, x, cols, c0, xr, acc) };
        return;
    }
    let _ = isa;
    portable_kernel(dtype, w, kn, x, cols, c0, xr, acc)
}

/// Weight element `k` (in packed order) of a float chunk, as f32.
pub(crate) fn element(dtype: DType, w: &[u8], k: usize) -> f32 {
    match dtype {
        DType::F32 => f32::from_le_bytes([w[4 * k], w[4 * k + 1], w[4 * k + 2], w[4 * k + 3]]),
        DType::F16 => f16::from_le_bytes([w[2 * k], w[2 * k + 1]]).to_f32(),
        DType::BF16 => f32::from_bits((u16::from_le_bytes([w[2 * k], w[2 * k + 1]]) as u32) << 16),
        _ => unreachable!("not a float format: {dtype}"),
    }
}

#[allow(clippy::too_many_arguments)]
fn portable_kernel(
    dtype: DType,
    w: &[u8],
    kn: usize,
    x: &[f32],
    cols: usize,
    c0: usize,
    xr: usize,
    acc: &mut [f32],
) {
    let mut wv = [0f32; GROUP];
    for c in 0..kn {
        for (i, v) in wv.iter_mut().enumerate() {
            *v = element(dtype, w, c * GROUP + i);
        }
        let u = (c0 + c) % 2;
        for r in 0..xr {
            let xv = x[r * cols + c0 + c];
            let a = &mut acc[r * ACC + u * GROUP..r * ACC + (u + 1) * GROUP];
            for (ai, wi) in a.iter_mut().zip(&wv) {
                *ai = wi.mul_add(xv, *ai);
            }
        }
    }
}
