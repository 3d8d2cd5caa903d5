//! Matrix products `y = x · Wᵀ` for any number of activation rows (1 for decode, 2–64 for
//! speculative verification, hundreds for prefill), directly on every weight format.
//!
//! `W` is `[rows, cols]` (rows = output features), `x` is `n × cols` and `y` is `n × rows`,
//! both row-major. Weights are packed once at load (`MatMulWeight::new`) into the layout their
//! format family's kernel wants; activations are converted once per call (to int8 blocks where
//! the format's dot product calls for it); output rows are split across the worker pool, and
//! each task computes a tile (all `n` activation rows × a range of weight rows) so that every
//! weight byte is read from memory once per call whatever `n` is.
//!
//! Format families, one file each (plus `*_avx2.rs` / `*_vnni.rs` beside them):
//! - `floats`: F32, F16, BF16 (f32 activations)
//! - `legacy`: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (activations as int8 blocks of 32, the Q8_0 / Q8_1
//!   information)
//! - `k_quants`: Q4_K, Q5_K, Q6_K (activations as Q8_K blocks)
//! - `kasoku`: kasoku's own formats M and L (rotated int8 activations); its own matrix type
//!   `KasokuMatrix` for now, until the format interface joins them
//!
//! Each family provides `pack`, `prepare` (activations) and `compute_tile`, with a portable
//! path and an AVX2 path (and an AVX512-VNNI one where the CPU has it) that compute the same
//! function, bit for bit. The float and legacy families also give an activation row the same
//! bits whatever the batch it comes in (so verifying a draft reproduces plain decoding exactly).

use std::cell::Cell;

use crate::quant::DType;

use super::scratch;
use super::simd::Isa;
use super::threads::{self, parts::BlockList, parts::MAX_LIST, Blocks, Work};

mod floats;
#[cfg(target_arch = "x86_64")]
mod floats_avx2;
mod k_quants;
pub mod kasoku;
#[cfg(target_arch = "x86_64")]
mod kasoku_avx2;
#[cfg(target_arch = "x86_64")]
mod kasoku_vnni;
mod legacy;
#[cfg(target_arch = "x86_64")]
mod legacy_avx2;
#[cfg(target_arch = "x86_64")]
mod legacy_vnni;
mod packed;

pub(crate) use packed::PackedBytes;

/// Errors building a weight matrix.
#[derive(Debug, thiserror::Error)]
pub enum MatMulError {
    #[error("matrix {rows}x{cols} of {dtype}: expected {expected} bytes, got {found}")]
    Size {
        dtype: DType,
        rows: usize,
        cols: usize,
        expected: usize,
        found: usize,
    },
    #[error("matrix of {dtype}: {cols} columns is not a multiple of the block size {block}")]
    Columns {
        dtype: DType,
        cols: usize,
        block: usize,
    },
}

/// A weight matrix packed for fast products. Immutable; share it with `Arc`.
pub struct MatMulWeight {
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
    /// Format-specific layout produced by the family's `pack`.
    pub(crate) packed: PackedBytes,
}

impl std::fmt::Debug for MatMulWeight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "MatMulWeight({} {}x{})",
            self.dtype, self.rows, self.cols
        )
    }
}

/// Activations converted for one weight format (opaque to callers).
pub(crate) enum Prepared {
    /// Float weights and the reference path.
    F32(Vec<f32>),
    /// Raw activation blocks (the k-quant family's Q8_K).
    #[allow(dead_code)]
    Bytes(Vec<u8>),
    /// Legacy formats: int8 blocks with scales and sums.
    Q8(legacy::Q8Acts),
}

/// The kernel family a format belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Family {
    Floats,
    Legacy,
    KQuants,
    /// Formats without fast kernels yet: the dequantizing reference path.
    #[allow(dead_code)]
    Reference,
}

fn family(dtype: DType) -> Family {
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => Family::Floats,
        DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::Q8_0 => Family::Legacy,
        DType::Q4K | DType::Q5K | DType::Q6K => Family::KQuants,
    }
}

impl MatMulWeight {
    /// The matrix of the first `n` rows (`n ≤ rows`), e.g. an LM head over a reduced
    /// vocabulary for a drafter. Rows keep their packed bytes, so row `j < n` of the result
    /// computes exactly what row `j` of `self` does.
    pub fn first_rows(&self, n: usize) -> MatMulWeight {
        let n = n.min(self.rows);
        let prefix = |bytes: usize| PackedBytes::copy_of(&self.packed[..bytes]);
        let packed = match family(self.dtype) {
            Family::Reference => prefix(self.packed.len() / self.rows.max(1) * n),
            // Packed in groups of 8 rows, group after group.
            Family::Floats | Family::Legacy => {
                let groups = self.rows.div_ceil(8).max(1);
                prefix(self.packed.len() / groups * n.div_ceil(8))
            }
            // In groups of 8 rows, in column panels.
            Family::KQuants => k_quants::first_groups(self, n.div_ceil(k_quants::GROUP)),
        };
        MatMulWeight {
            dtype: self.dtype,
            rows: n,
            cols: self.cols,
            packed,
        }
    }

    /// Packs a `[rows, cols]` matrix whose rows are stored contiguously in `bytes` (GGUF or
    /// safetensors layout) in format `dtype`.
    pub fn new(dtype: DType, rows: usize, cols: usize, bytes: &[u8]) -> Result<Self, MatMulError> {
        if !cols.is_multiple_of(dtype.block_size()) {
            return Err(MatMulError::Columns {
                dtype,
                cols,
                block: dtype.block_size(),
            });
        }
        let expected = dtype
            .bytes_for(cols)
            .and_then(|r| r.checked_mul(rows))
            .unwrap_or(usize::MAX);
        if bytes.len() != expected {
            return Err(MatMulError::Size {
                dtype,
                rows,
                cols,
                expected,
                found: bytes.len(),
            });
        }
        let packed = match family(dtype) {
            Family::Floats => floats::pack(dtype, rows, cols, bytes),
            Family::Legacy => legacy::pack(dtype, rows, cols, bytes),
            Family::KQuants => k_quants::pack(dtype, rows, cols, bytes),
            Family::Reference => reference::pack(dtype, rows, cols, bytes),
        };
        Ok(MatMulWeight {
            dtype,
            rows,
            cols,
            packed,
        })
    }

    /// Bytes the packed weights occupy (what one product reads).
    pub fn size_bytes(&self) -> usize {
        self.packed.len()
    }
}

/// `y[r][j] = Σ_c x[r][c] · W[j][c]` for `r < n`, `j < w.rows`.
pub fn matmul(w: &MatMulWeight, x: &[f32], n: usize, y: &mut [f32]) {
    matmul_with(w, x, n, y, Isa::detect());
}

/// [`matmul`] with a chosen instruction set.
pub(crate) fn matmul_with(w: &MatMulWeight, x: &[f32], n: usize, y: &mut [f32], isa: Isa) {
    matmul_split(w, x, n, y, isa, threads::num_threads());
}

thread_local! {
    /// The calling thread's memory for its tasks' output tiles.
    static TILES: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// Several products over the same activations, `ys[i] = x · Wᵢᵀ` (e.g. an attention layer's
/// q, k and v projections when their formats differ), in one parallel job: the pool
/// synchronises once instead of once per matrix, and the small matrices' tasks fill the gaps
/// of the large one's. Each output gets the same bits as [`matmul`] of its matrix alone.
pub fn matmul_many(ws: &[&MatMulWeight], x: &[f32], n: usize, ys: &mut [&mut [f32]]) {
    matmul_parts(ws, x, n, ys, Isa::detect(), threads::num_threads());
}

/// [`matmul`] with a chosen instruction set, its rows split for `threads` threads.
fn matmul_split(w: &MatMulWeight, x: &[f32], n: usize, y: &mut [f32], isa: Isa, threads: usize) {
    matmul_parts(&[w], x, n, &mut [y], isa, threads);
}

/// The products of [`matmul_many`] with a chosen instruction set, each matrix's rows split
/// for `threads` threads and all the chunks run as the tasks of one job (of up to
/// [`MAX_LIST`] matrices; more are done in several jobs).
fn matmul_parts(
    ws: &[&MatMulWeight],
    x: &[f32],
    n: usize,
    ys: &mut [&mut [f32]],
    isa: Isa,
    threads: usize,
) {
    assert_eq!(ws.len(), ys.len(), "matmul: one output per matrix");
    for (ws, ys) in ws.chunks(MAX_LIST).zip(ys.chunks_mut(MAX_LIST)) {
        matmul_job(ws, x, n, ys, isa, threads);
    }
}

/// [`matmul_parts`] for at most [`MAX_LIST`] matrices: one pool job.
fn matmul_job(
    ws: &[&MatMulWeight],
    x: &[f32],
    n: usize,
    ys: &mut [&mut [f32]],
    isa: Isa,
    threads: usize,
) {
    // The activations in each format the matrices need, prepared once per format: matrix `i`
    // reads `acts[act_of[i]]`.
    let mut acts: Vec<(DType, Prepared)> = Vec::new();
    let mut act_of = [usize::MAX; MAX_LIST];
    // Weight rows per task of each matrix: a task computes one block of its output columns.
    let mut step = [0usize; MAX_LIST];
    let mut outs = BlockList::new();
    for (i, (w, y)) in ws.iter().zip(ys.iter_mut()).enumerate() {
        assert_eq!(x.len(), n * w.cols, "matmul: x has the wrong length");
        assert_eq!(y.len(), n * w.rows, "matmul: y has the wrong length");
        step[i] = task_rows(w.rows, threads);
        outs.push(Blocks::new(y, n, step[i]));
        if n == 0 || w.rows == 0 {
            continue;
        }
        let at = acts
            .iter()
            .position(|(d, _)| *d == w.dtype)
            .unwrap_or_else(|| {
                let act = match family(w.dtype) {
                    Family::Floats => floats::prepare(x),
                    Family::Legacy => Prepared::Q8(legacy::prepare(w.dtype, x, n, w.cols, isa)),
                    Family::KQuants => k_quants::prepare(w, x, n, isa),
                    Family::Reference => reference::prepare(w, x, n),
                };
                acts.push((w.dtype, act));
                acts.len() - 1
            });
        act_of[i] = at;
    }
    let tasks = outs.parts();
    // Each task computes its tile (every activation row × its weight rows) in its thread's
    // work area, then copies the tile's rows into place.
    let tile_len = n * step[..ws.len()].iter().max().copied().unwrap_or(0);
    scratch::with(&TILES, |buf| {
        let work = Work::new(buf, tile_len);
        threads::for_each(tasks, outs, work, |_, (i, b, mut out), tile| {
            let w = ws[i];
            let rows = b * step[i]..b * step[i] + out.len();
            let act = &acts[act_of[i]].1;
            let tile = &mut tile[..n * rows.len()];
            match family(w.dtype) {
                Family::Floats => floats::compute_tile(w, act, n, rows.clone(), tile, isa),
                Family::Legacy => legacy::compute_tile(w, act, n, rows.clone(), tile, isa),
                Family::KQuants => k_quants::compute_tile(w, act, n, rows.clone(), tile, isa),
                Family::Reference => reference::compute_tile(w, act, n, rows.clone(), tile),
            }
            for (r, src) in tile.chunks_exact(rows.len()).enumerate() {
                out.row(r).copy_from_slice(src);
            }
        });
    });
}

/// Weight rows per task when a matrix of `rows` is split for `threads` threads: about
/// `4 × threads` tasks, each a multiple of 16 rows (so every task starts on a packed-group
/// boundary).
fn task_rows(rows: usize, threads: usize) -> usize {
    let tasks = (threads * 4).max(1);
    (rows.div_ceil(tasks).div_ceil(16) * 16).max(16)
}

/// The simplest correct implementation: dequantize each weight row to f32 and take dot
/// products in f32. The per-family fast kernels replace it and are tested against it.
mod reference {
    use std::ops::Range;

    use super::*;

    pub fn pack(_dtype: DType, _rows: usize, _cols: usize, bytes: &[u8]) -> PackedBytes {
        PackedBytes::copy_of(bytes)
    }

    pub fn prepare(_w: &MatMulWeight, x: &[f32], _n: usize) -> Prepared {
        Prepared::F32(x.to_vec())
    }

    pub fn compute_tile(
        w: &MatMulWeight,
        act: &Prepared,
        n: usize,
        rows: Range<usize>,
        tile: &mut [f32],
    ) {
        let Prepared::F32(x) = act else {
            unreachable!("reference path prepares f32")
        };
        let row_bytes = w.dtype.bytes_for(w.cols).unwrap();
        let mut wrow = vec![0f32; w.cols];
        for (i, j) in rows.clone().enumerate() {
            crate::quant::dequantize(
                w.dtype,
                &w.packed[j * row_bytes..(j + 1) * row_bytes],
                &mut wrow,
            );
            for r in 0..n {
                let xr = &x[r * w.cols..(r + 1) * w.cols];
                tile[r * rows.len() + i] = xr.iter().zip(&wrow).map(|(a, b)| a * b).sum();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::legacy::tests::{random_blocks, Rng};

    const ALL: [DType; 8] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
    ];

    fn random_matrix(rng: &mut Rng, dtype: DType, rows: usize, cols: usize) -> Vec<u8> {
        match dtype {
            DType::F32 => (0..rows * cols)
                .flat_map(|_| rng.f32().to_le_bytes())
                .collect(),
            DType::F16 => (0..rows * cols)
                .flat_map(|_| half::f16::from_f32(rng.f32()).to_le_bytes())
                .collect(),
            DType::BF16 => (0..rows * cols)
                .flat_map(|_| half::bf16::from_f32(rng.f32()).to_le_bytes())
                .collect(),
            DType::Q4K | DType::Q5K | DType::Q6K => {
                // Random bytes with finite f16 scales (Q4_K/Q5_K: d, dmin; Q6_K: d at the end).
                let mut b = rng.bytes(rows * dtype.bytes_for(cols).unwrap());
                let at: &[usize] = if dtype == DType::Q6K { &[208] } else { &[0, 2] };
                for blk in b.chunks_exact_mut(dtype.block_bytes()) {
                    for &o in at {
                        blk[o..o + 2]
                            .copy_from_slice(&half::f16::from_f32(rng.f32() * 0.05).to_le_bytes());
                    }
                }
                b
            }
            _ => random_blocks(rng, dtype.block_bytes(), rows * cols / dtype.block_size()),
        }
    }

    /// Checks `y` against f64 products of the dequantized weights: floats to 1e-6 of the sum of
    /// |terms|, int8-activation formats to the activation rounding bound (half a step of
    /// max|x|/127 per value, the step itself rounded to f16) plus float noise.
    fn check(dtype: DType, rows: usize, cols: usize, wb: &[u8], x: &[f32], n: usize, y: &[f32]) {
        let mut wf = vec![0f32; rows * cols];
        crate::quant::dequantize(dtype, wb, &mut wf);
        for r in 0..n {
            let xr = &x[r * cols..(r + 1) * cols];
            for j in 0..rows {
                let wr = &wf[j * cols..(j + 1) * cols];
                let exact: f64 = xr.iter().zip(wr).map(|(a, b)| *a as f64 * *b as f64).sum();
                let scale: f64 = xr
                    .iter()
                    .zip(wr)
                    .map(|(a, b)| (*a as f64 * *b as f64).abs())
                    .sum();
                let tol = if dtype.is_quantized() {
                    let amax = xr.iter().fold(0f32, |a, v| a.max(v.abs())) as f64;
                    let wabs: f64 = wr.iter().map(|v| v.abs() as f64).sum();
                    wabs * amax * (1.0 / 254.0 + 1.0 / 4096.0) + 1e-5 * scale + 1e-6
                } else {
                    1e-6 * scale + 1e-7
                };
                let got = y[r * rows + j] as f64;
                assert!(
                    (got - exact).abs() <= tol,
                    "{dtype} n={n} r={r} j={j}: {got} vs {exact} (tol {tol})"
                );
            }
        }
    }

    #[test]
    fn every_format_and_batch_size_matches_the_reference() {
        let mut rng = Rng(1);
        for dtype in ALL {
            let (rows, cols) = (37, 96);
            let wb = random_matrix(&mut rng, dtype, rows, cols);
            let w = MatMulWeight::new(dtype, rows, cols, &wb).unwrap();
            for n in [1, 2, 3, 4, 7, 8, 16, 64, 100] {
                let x: Vec<f32> = (0..n * cols).map(|_| rng.f32()).collect();
                for isa in Isa::available() {
                    let mut y = vec![f32::NAN; n * rows];
                    matmul_with(&w, &x, n, &mut y, isa);
                    check(dtype, rows, cols, &wb, &x, n, &y);
                }
            }
        }
    }

    #[test]
    fn several_matrices_in_one_job_match_each_alone() {
        let mut rng = Rng(4);
        let cols = 256;
        // Mixed families and heights, one of them empty, two sharing their activations.
        let shapes = [
            (DType::Q4_0, 70),
            (DType::F16, 9),
            (DType::Q6K, 33),
            (DType::Q8_0, 0),
            (DType::Q4_0, 17),
        ];
        let ws: Vec<MatMulWeight> = shapes
            .iter()
            .map(|&(dtype, rows)| {
                let wb = random_matrix(&mut rng, dtype, rows, cols);
                MatMulWeight::new(dtype, rows, cols, &wb).unwrap()
            })
            .collect();
        let refs: Vec<&MatMulWeight> = ws.iter().collect();
        for n in [1, 5] {
            let x: Vec<f32> = (0..n * cols).map(|_| rng.f32()).collect();
            let mut outs: Vec<Vec<f32>> = ws.iter().map(|w| vec![f32::NAN; n * w.rows]).collect();
            let mut slices: Vec<&mut [f32]> = outs.iter_mut().map(|v| v.as_mut_slice()).collect();
            matmul_many(&refs, &x, n, &mut slices);
            for (w, got) in ws.iter().zip(&outs) {
                let mut alone = vec![0f32; n * w.rows];
                matmul(w, &x, n, &mut alone);
                assert!(
                    got.iter()
                        .zip(&alone)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{} n={n}",
                    w.dtype
                );
            }
        }
    }

    #[test]
    fn odd_row_counts() {
        let mut rng = Rng(2);
        for dtype in ALL {
            for rows in [1, 5, 8, 9, 15, 17, 33] {
                let cols = 64;
                let wb = random_matrix(&mut rng, dtype, rows, cols);
                let w = MatMulWeight::new(dtype, rows, cols, &wb).unwrap();
                let n = 3;
                let x: Vec<f32> = (0..n * cols).map(|_| rng.f32()).collect();
                let mut y = vec![f32::NAN; n * rows];
                matmul(&w, &x, n, &mut y);
                check(dtype, rows, cols, &wb, &x, n, &y);
            }
        }
    }

    #[test]
    fn a_row_result_does_not_depend_on_batch_or_split() {
        let mut rng = Rng(3);
        for dtype in ALL {
            let (rows, cols, n) = (203, 320, 11);
            let wb = random_matrix(&mut rng, dtype, rows, cols);
            let w = MatMulWeight::new(dtype, rows, cols, &wb).unwrap();
            let x: Vec<f32> = (0..n * cols).map(|_| rng.f32()).collect();
            let isa = Isa::detect();
            let mut one = vec![0f32; n * rows];
            matmul_split(&w, &x, n, &mut one, isa, 1);
            let mut many = vec![0f32; n * rows];
            matmul_split(&w, &x, n, &mut many, isa, 7);
            assert!(
                one.iter()
                    .zip(&many)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "{dtype}: split"
            );
            // Row r alone gives the same bits as row r in the batch.
            for r in [0, 5, 10] {
                let mut y1 = vec![0f32; rows];
                matmul_with(&w, &x[r * cols..(r + 1) * cols], 1, &mut y1, isa);
                assert!(
                    y1.iter()
                        .zip(&one[r * rows..])
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{dtype}: row {r}"
                );
            }
        }
    }

    #[test]
    fn prefill_sized_batches_equal_single_rows() {
        // Large enough for the parallel activation quantizer and several outer row blocks.
        let mut rng = Rng(4);
        for dtype in [DType::Q4_0, DType::Q5_1, DType::Q8_0, DType::BF16] {
            let (rows, cols, n) = (24, 2048, 70);
            let wb = random_matrix(&mut rng, dtype, rows, cols);
            let w = MatMulWeight::new(dtype, rows, cols, &wb).unwrap();
            let x: Vec<f32> = (0..n * cols).map(|_| rng.f32()).collect();
            let mut y = vec![0f32; n * rows];
            matmul(&w, &x, n, &mut y);
            for r in 0..n {
                let mut y1 = vec![0f32; rows];
                matmul(&w, &x[r * cols..(r + 1) * cols], 1, &mut y1);
                assert!(
                    y1.iter()
                        .zip(&y[r * rows..])
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{dtype}: row {r}"
                );
            }
        }
    }

    #[test]
    fn first_rows_compute_what_the_full_matrix_computes() {
        let mut rng = Rng(9);
        let k_quants = [DType::Q4K, DType::Q5K, DType::Q6K];
        for dtype in ALL.into_iter().chain(k_quants) {
            // 11 K-quant super-blocks per row: more than one column panel.
            let (rows, cols, n) = (37, 11 * 256, 3);
            let row_bytes = dtype.bytes_for(cols).unwrap();
            let wb = random_matrix(&mut rng, dtype, rows, cols);
            let w = MatMulWeight::new(dtype, rows, cols, &wb).unwrap();
            let x: Vec<f32> = (0..n * cols).map(|_| rng.f32()).collect();
            let mut full = vec![0f32; n * rows];
            matmul(&w, &x, n, &mut full);
            for keep in [8, 13, 37] {
                let part = w.first_rows(keep);
                // As large as those rows packed alone.
                let alone = MatMulWeight::new(dtype, keep, cols, &wb[..keep * row_bytes]).unwrap();
                assert_eq!(part.size_bytes(), alone.size_bytes(), "{dtype} keep={keep}");
                let mut y = vec![0f32; n * keep];
                matmul(&part, &x, n, &mut y);
                for r in 0..n {
                    assert_eq!(
                        y[r * keep..(r + 1) * keep],
                        full[r * rows..r * rows + keep],
                        "{dtype}"
                    );
                }
            }
        }
    }

    #[test]
    fn size_errors_are_values() {
        assert!(matches!(
            MatMulWeight::new(DType::Q4_0, 2, 48, &[0; 36]),
            Err(MatMulError::Columns { .. })
        ));
        assert!(matches!(
            MatMulWeight::new(DType::Q4_0, 2, 64, &[0; 71]),
            Err(MatMulError::Size { .. })
        ));
        assert!(MatMulWeight::new(DType::F16, 2, 3, &[0; 12]).is_ok());
    }
}
