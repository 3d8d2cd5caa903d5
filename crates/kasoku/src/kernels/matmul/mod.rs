//! Matrix products `y = x · Wᵀ` for 1..64 activation rows, directly on every weight format.
//!
//! `W` is `[rows, cols]` (rows = output features), `x` is `n × cols` and `y` is `n × rows`,
//! both row-major. Weights are packed once at load (`MatMulWeight::new`) into the layout their
//! format family's kernel wants; activations are converted once per call (to int8 blocks where
//! the format's dot product calls for it); output rows are split across the worker pool, and
//! each task computes a tile (all `n` activation rows × a range of weight rows) so that every
//! weight byte is read once per call whatever `n` is.
//!
//! Format families, one file each:
//! - `floats`: F32, F16, BF16
//! - `legacy`: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (activations as Q8_0 / Q8_1 blocks)
//! - `k_quants`: Q4_K, Q5_K, Q6_K (activations as Q8_K blocks)
//!
//! Each family provides `pack`, `prepare` (activations) and `compute_tile`, with a portable
//! path and an AVX2 path that compute the same function.

use std::ops::Range;

use crate::quant::DType;

use super::threads;

/// Errors building a weight matrix.
#[derive(Debug, thiserror::Error)]
pub enum MatMulError {
    #[error("matrix {rows}x{cols} of {dtype}: expected {expected} bytes, got {found}")]
    Size { dtype: DType, rows: usize, cols: usize, expected: usize, found: usize },
    #[error("matrix of {dtype}: {cols} columns is not a multiple of the block size {block}")]
    Columns { dtype: DType, cols: usize, block: usize },
}

/// A weight matrix packed for fast products. Immutable; share it with `Arc`.
pub struct MatMulWeight {
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
    /// Format-specific layout produced by the family's `pack`.
    pub(crate) packed: Vec<u8>,
}

impl std::fmt::Debug for MatMulWeight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MatMulWeight({} {}x{})", self.dtype, self.rows, self.cols)
    }
}

/// Activations converted for one weight format (opaque to callers).
pub(crate) enum Prepared {
    F32(Vec<f32>),
    Bytes(Vec<u8>),
}

impl MatMulWeight {
    /// Packs a `[rows, cols]` matrix whose rows are stored contiguously in `bytes` (GGUF or
    /// safetensors layout) in format `dtype`.
    pub fn new(dtype: DType, rows: usize, cols: usize, bytes: &[u8]) -> Result<Self, MatMulError> {
        if cols % dtype.block_size() != 0 {
            return Err(MatMulError::Columns { dtype, cols, block: dtype.block_size() });
        }
        let expected = dtype.bytes_for(cols).and_then(|r| r.checked_mul(rows)).unwrap_or(usize::MAX);
        if bytes.len() != expected {
            return Err(MatMulError::Size { dtype, rows, cols, expected, found: bytes.len() });
        }
        let packed = reference::pack(dtype, rows, cols, bytes);
        Ok(MatMulWeight { dtype, rows, cols, packed })
    }

    /// Bytes the packed weights occupy (what one product reads).
    pub fn size_bytes(&self) -> usize {
        self.packed.len()
    }
}

/// `y[r][j] = Σ_c x[r][c] · W[j][c]` for `r < n`, `j < w.rows`.
pub fn matmul(w: &MatMulWeight, x: &[f32], n: usize, y: &mut [f32]) {
    assert_eq!(x.len(), n * w.cols, "matmul: x has the wrong length");
    assert_eq!(y.len(), n * w.rows, "matmul: y has the wrong length");
    if n == 0 {
        return;
    }
    let act = reference::prepare(w, x, n);
    let chunks = split_rows(w.rows, threads::num_threads());
    let out = SharedOut(y.as_mut_ptr());
    threads::parallel_for(chunks.len(), |t| {
        let rows = chunks[t].clone();
        let mut tile = vec![0f32; n * rows.len()];
        reference::compute_tile(w, &act, n, rows.clone(), &mut tile);
        for r in 0..n {
            // SAFETY: tasks write disjoint row ranges of y.
            let dst = unsafe { std::slice::from_raw_parts_mut(out.get().add(r * w.rows + rows.start), rows.len()) };
            dst.copy_from_slice(&tile[r * rows.len()..(r + 1) * rows.len()]);
        }
    });
}

#[derive(Clone, Copy)]
struct SharedOut(*mut f32);
// SAFETY: used only to write disjoint ranges from the pool's tasks, within `matmul`'s borrow of y.
unsafe impl Send for SharedOut {}
unsafe impl Sync for SharedOut {}
impl SharedOut {
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// Splits `rows` into about `4 × threads` chunks whose sizes are multiples of 16 where possible.
fn split_rows(rows: usize, threads: usize) -> Vec<Range<usize>> {
    let tasks = (threads * 4).max(1);
    let step = rows.div_ceil(tasks).div_ceil(16) * 16;
    let step = step.max(16);
    (0..rows).step_by(step).map(|s| s..(s + step).min(rows)).collect()
}

/// The simplest correct implementation: dequantize each weight row to f32 and take dot
/// products in f32. The per-family fast kernels replace it and are tested against it.
mod reference {
    use super::*;

    pub fn pack(_dtype: DType, _rows: usize, _cols: usize, bytes: &[u8]) -> Vec<u8> {
        bytes.to_vec()
    }

    pub fn prepare(_w: &MatMulWeight, x: &[f32], _n: usize) -> Prepared {
        Prepared::F32(x.to_vec())
    }

    pub fn compute_tile(w: &MatMulWeight, act: &Prepared, n: usize, rows: Range<usize>, tile: &mut [f32]) {
        let Prepared::F32(x) = act else { unreachable!("reference path prepares f32") };
        let row_bytes = w.dtype.bytes_for(w.cols).unwrap();
        let mut wrow = vec![0f32; w.cols];
        for (i, j) in rows.clone().enumerate() {
            crate::quant::dequantize(w.dtype, &w.packed[j * row_bytes..(j + 1) * row_bytes], &mut wrow);
            for r in 0..n {
                let xr = &x[r * w.cols..(r + 1) * w.cols];
                tile[r * rows.len() + i] = xr.iter().zip(&wrow).map(|(a, b)| a * b).sum();
            }
        }
    }
}
