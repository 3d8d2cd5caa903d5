//! The simplest correct product, for tests: the matrix kept as stored, each weight row
//! dequantized to f32 and dotted with the activations in f32. The families' fast kernels are
//! tested against it (and against f64).

use super::{Format, MatMulError, MatMulWeight, PackedBytes, Tile};
use crate::quant::DType;

/// The dequantizing reference path (any format).
pub(crate) struct Reference;

impl MatMulWeight {
    /// `bytes` as a matrix computed by the reference path (see [`MatMulWeight::new`]).
    pub(crate) fn reference(
        dtype: DType,
        rows: usize,
        cols: usize,
        bytes: &[u8],
    ) -> Result<Self, MatMulError> {
        MatMulWeight::with_format(&Reference, dtype, rows, cols, bytes)
    }
}

impl Format for Reference {
    fn pack(&self, _dtype: DType, _rows: usize, _cols: usize, bytes: &[u8]) -> PackedBytes {
        PackedBytes::copy_of(bytes)
    }

    fn first_rows(&self, w: &MatMulWeight, n: usize) -> PackedBytes {
        PackedBytes::copy_of(&w.packed[..n * w.dtype.bytes_for(w.cols).unwrap()])
    }

    fn work_len(&self, w: &MatMulWeight, _n: usize, _rows: usize) -> usize {
        w.cols
    }

    fn compute_tile(&self, t: &Tile, tile: &mut [f32], work: &mut [f32]) {
        let w = t.w;
        let row_bytes = w.dtype.bytes_for(w.cols).unwrap();
        let wrow = &mut work[..w.cols];
        for (i, j) in t.rows.clone().enumerate() {
            let bytes = &w.packed[j * row_bytes..(j + 1) * row_bytes];
            crate::quant::dequantize(w.dtype, bytes, wrow);
            for r in 0..t.n {
                let xr = &t.x[r * w.cols..(r + 1) * w.cols];
                tile[r * t.rows.len() + i] = xr.iter().zip(&*wrow).map(|(a, b)| a * b).sum();
            }
        }
    }
}
