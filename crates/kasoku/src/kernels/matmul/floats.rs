//! Products on float weights (F32, F16, BF16): packing and the portable tile kernel (the AVX2
//! one is in `floats_avx2.rs`). Activations stay f32.
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

use std::ops::Range;

use half::f16;

use super::{MatMulWeight, PackedBytes, Prepared};
use crate::kernels::simd::Isa;
use crate::quant::DType;

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

/// Repacks row-major rows into column-interleaved 8-row groups.
pub(crate) fn pack(dtype: DType, rows: usize, cols: usize, bytes: &[u8]) -> PackedBytes {
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

/// Float activations need no conversion.
pub(crate) fn prepare(x: &[f32]) -> Prepared {
    Prepared::F32(x.to_vec())
}

/// `tile[r][j - rows.start] = Σ_c x[r][c]·W[j][c]` for weight rows `rows` (starting on a group
/// boundary).
pub(crate) fn compute_tile(
    w: &MatMulWeight,
    act: &Prepared,
    n: usize,
    rows: Range<usize>,
    tile: &mut [f32],
    isa: Isa,
) {
    let Prepared::F32(x) = act else {
        unreachable!("float weights take f32 activations")
    };
    debug_assert_eq!(rows.start % GROUP, 0);
    let es = w.dtype.block_bytes();
    let cols = w.cols;
    let group_bytes = cols * GROUP * es;
    let len = rows.len();
    let mut acc = vec![0f32; XB.min(n) * ACC];
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
                    kernel(w.dtype, isa, wchunk, kn, xs, cols, c0, xr, a);
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
        unsafe { super::floats_avx2::kernel(dtype, w, kn, x, cols, c0, xr, acc) };
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::matmul::matmul_with;
    use crate::quant::legacy::tests::Rng;

    fn encode(dtype: DType, v: &[f32]) -> Vec<u8> {
        match dtype {
            DType::F32 => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            DType::F16 => v
                .iter()
                .flat_map(|x| f16::from_f32(*x).to_le_bytes())
                .collect(),
            _ => v
                .iter()
                .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
                .collect(),
        }
    }

    #[test]
    fn pack_interleaves_columns_of_eight_rows() {
        let (rows, cols) = (9, 3);
        let v: Vec<f32> = (0..rows * cols).map(|k| k as f32).collect();
        let p = pack(DType::F32, rows, cols, &encode(DType::F32, &v));
        assert_eq!(p.len(), 2 * cols * GROUP * 4);
        // Group 0, column 1, row 2 → W[2][1] = 7; group 1, column 2, row 8 → W[8][2] = 26.
        assert_eq!(element(DType::F32, &p, GROUP + 2), 7.0);
        assert_eq!(element(DType::F32, &p, (cols + 2) * GROUP), 26.0);
        // Padding rows are zero.
        assert_eq!(element(DType::F32, &p, (cols + 2) * GROUP + 1), 0.0);
    }

    #[test]
    fn float_products_match_f64_and_paths_agree_bit_for_bit() {
        let mut rng = Rng(21);
        for dtype in [DType::F32, DType::F16, DType::BF16] {
            let (rows, cols, n) = (19, 1031, 6);
            let wv: Vec<f32> = (0..rows * cols).map(|_| rng.f32()).collect();
            let bytes = encode(dtype, &wv);
            let mut wf = vec![0f32; rows * cols];
            crate::quant::dequantize(dtype, &bytes, &mut wf);
            let x: Vec<f32> = (0..n * cols).map(|_| rng.f32()).collect();
            let w = MatMulWeight::new(dtype, rows, cols, &bytes).unwrap();
            let mut ys = Vec::new();
            for isa in Isa::available() {
                let mut y = vec![0f32; n * rows];
                matmul_with(&w, &x, n, &mut y, isa);
                for r in 0..n {
                    for j in 0..rows {
                        let exact: f64 = (0..cols)
                            .map(|c| x[r * cols + c] as f64 * wf[j * cols + c] as f64)
                            .sum();
                        let scale: f64 = (0..cols)
                            .map(|c| (x[r * cols + c] * wf[j * cols + c]).abs() as f64)
                            .sum();
                        let got = y[r * rows + j] as f64;
                        assert!(
                            (got - exact).abs() <= 1e-6 * scale,
                            "{dtype} {isa:?}: {got} vs {exact}"
                        );
                    }
                }
                ys.push(y);
            }
            for y in &ys[1..] {
                assert!(
                    y.iter()
                        .zip(&ys[0])
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{dtype}"
                );
            }
        }
    }
}
