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
//! Format families, one folder each (the portable code in `mod.rs`, SIMD kernels beside it),
//! each implementing [`Format`] (but `kasoku`, see below):
//! - `floats`: F32, F16, BF16 (f32 activations)
//! - `legacy`: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (activations as int8 blocks of 32, the Q8_0 / Q8_1
//!   information)
//! - `k_quants`: Q4_K, Q5_K, Q6_K (activations as Q8_K blocks)
//! - `kasoku`: kasoku's own formats M and L (rotated int8 activations): `KasokuMatrix`, which
//!   a `MatMulWeight` holds and reaches through the [`Format`] of `kasoku_family`; their
//!   activations may also come [`Prepared`] by a fused epilogue ([`matmul_prepared`])
//! - and, for tests, `reference`: any format, dequantized to f32 row by row.
//!
//! Each family's portable, AVX2 and AVX512-VNNI paths compute the same function, bit for bit.
//! The float and legacy families also give an activation row the same bits whatever the batch
//! it comes in (so verifying a draft reproduces plain decoding exactly). Activations and tiles
//! live in memory reused from call to call: a product whose shapes were seen before allocates
//! nothing.

use std::cell::Cell;
use std::ops::Range;

use crate::quant::DType;

use super::scratch;
use super::simd::Isa;
use super::threads::{self, parts::BlockList, parts::MAX_LIST, Blocks, Work};

mod floats;
mod k_quants;
pub mod kasoku;
#[cfg(target_arch = "x86_64")]
mod kasoku_avx2;
mod kasoku_family;
#[cfg(target_arch = "x86_64")]
mod kasoku_vnni;
mod legacy;
mod packed;
#[cfg(test)]
mod reference;
#[cfg(test)]
mod tests;

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
    /// The GGUF element type of the GGUF families' matrices (unused for kasoku's formats:
    /// [`MatMulWeight::format`] says what a matrix is).
    pub(crate) dtype: DType,
    pub rows: usize,
    pub cols: usize,
    /// Format-specific layout produced by the family's [`Format::pack`] (empty for kasoku's
    /// formats, whose packed bytes live in `kasoku`).
    pub(crate) packed: PackedBytes,
    /// A matrix in one of kasoku's formats.
    pub(crate) kasoku: Option<Box<kasoku::KasokuMatrix>>,
    /// The kernels of its format's family.
    format: &'static dyn Format,
}

/// What a packed matrix is stored as: a GGUF element type or one of kasoku's formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightFormat {
    Gguf(DType),
    Kasoku(crate::quant::kasoku::Format),
}

impl std::fmt::Display for WeightFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WeightFormat::Gguf(d) => write!(f, "{d}"),
            WeightFormat::Kasoku(k) => write!(f, "kasoku-{k:?}"),
        }
    }
}

impl std::fmt::Debug for MatMulWeight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "MatMulWeight({} {}x{})",
            self.format(),
            self.rows,
            self.cols
        )
    }
}

/// What a family of weight formats provides: its packed layout, its activations and its tile
/// kernel (as ggml's per-type CPU traits do). Implemented by `floats::Floats`,
/// `legacy::Legacy`, `k_quants::KQuants` and, for tests, `reference::Reference`.
pub(crate) trait Format: Sync {
    /// Packs `rows` rows of `cols` values of `dtype`, stored one after the other in `bytes`
    /// (GGUF or safetensors layout, sizes checked), into the family's layout.
    fn pack(&self, dtype: DType, rows: usize, cols: usize, bytes: &[u8]) -> PackedBytes;

    /// The packed bytes of the first `n ≤ w.rows` rows of `w`: what packing those rows alone
    /// gives. By default rows are packed in groups of [`GROUP`], group after group.
    fn first_rows(&self, w: &MatMulWeight, n: usize) -> PackedBytes {
        let groups = w.rows.div_ceil(GROUP).max(1);
        PackedBytes::copy_of(&w.packed[..w.packed.len() / groups * n.div_ceil(GROUP)])
    }

    /// Converts `n` activation rows `x` for products with `w` into `acts`, reusing its
    /// memory. By default nothing: the kernel reads `x`.
    fn prepare(&self, w: &MatMulWeight, x: &[f32], n: usize, isa: Isa, acts: &mut Acts) {
        let _ = (w, x, n, isa, acts);
    }

    /// The f32 work memory [`Format::compute_tile`] needs for `n` activation rows and a tile
    /// of at most `rows` weight rows of `w`. By default none.
    fn work_len(&self, w: &MatMulWeight, n: usize, rows: usize) -> usize {
        let _ = (w, n, rows);
        0
    }

    /// `out[r][j − t.rows.start] = Σ_c x[r][c]·W[j][c]` for `r < t.n` and `j ∈ t.rows`
    /// (which starts on a packed group), with `work.len() ≥ work_len(..)`.
    fn compute_tile(&self, t: &Tile, out: &mut [f32], work: &mut [f32]);
}

/// One task's share of a product: weight rows `rows` of `w` times `n` activation rows.
pub(crate) struct Tile<'a> {
    pub w: &'a MatMulWeight,
    /// The activation rows as given: `n × w.cols`.
    pub x: &'a [f32],
    /// The activation rows as [`Format::prepare`] converted them for `w`.
    pub acts: &'a Acts,
    pub n: usize,
    pub rows: Range<usize>,
    pub isa: Isa,
}

/// Activations converted for one weight format, in memory reused from call to call; each
/// family uses its own field.
#[derive(Default)]
pub(crate) struct Acts {
    /// Legacy formats: int8 blocks of 32 with their scales and sums.
    pub(crate) q8: legacy::Q8Acts,
    /// K-quant formats: Q8_K blocks.
    pub(crate) q8k: Vec<u8>,
    /// kasoku's formats: rotated int8 blocks of 64.
    pub(crate) kasoku: kasoku::Int8Acts,
}

/// Rows already rotated and int8-quantized for products with matrices of kasoku's formats
/// (all of one rotation and width), written by a fused epilogue (`kernels::fused`) instead of
/// as f32 rows; [`matmul_prepared`] takes them. Its memory is reused from fill to fill.
#[derive(Default)]
pub struct Prepared {
    pub(crate) acts: Acts,
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let a = &self.acts.kasoku;
        write!(f, "Prepared({} x {}, {:?})", a.n, a.cols, a.rotation)
    }
}

impl Prepared {
    /// The int8 activations, to be filled.
    pub(crate) fn kasoku_mut(&mut self) -> &mut kasoku::Int8Acts {
        &mut self.acts.kasoku
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.acts.kasoku.bytes()
    }
}

/// Whether one [`Prepared`] serves every matrix of `ws`: all in kasoku's formats, of one
/// rotation and one width (q, k and v; gate and up).
pub fn shares_prepared(ws: &[&MatMulWeight]) -> bool {
    let key = |w: &MatMulWeight| w.kasoku.as_ref().map(|k| (k.spec.rotation, w.cols));
    match ws.first().map(|w| key(w)) {
        Some(Some(first)) => ws.iter().all(|w| key(w) == Some(first)),
        _ => false,
    }
}

/// Which activations a matrix needs: those of its GGUF type, or for kasoku's formats those
/// rotated with its rotation (M and L of one rotation share them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ActsKey {
    Gguf(DType),
    Kasoku(Option<crate::quant::kasoku::Rotation>),
}

/// Rows per packed group in the layouts of every fast family.
const GROUP: usize = 8;

/// The kernels of `dtype`'s family: the one place where formats meet code.
fn format_of(dtype: DType) -> &'static dyn Format {
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => &floats::Floats,
        DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::Q8_0 => &legacy::Legacy,
        DType::Q4K | DType::Q5K | DType::Q6K => &k_quants::KQuants,
    }
}

impl MatMulWeight {
    /// Packs a `[rows, cols]` matrix whose rows are stored contiguously in `bytes` (GGUF or
    /// safetensors layout) in format `dtype`.
    pub fn new(dtype: DType, rows: usize, cols: usize, bytes: &[u8]) -> Result<Self, MatMulError> {
        MatMulWeight::with_format(format_of(dtype), dtype, rows, cols, bytes)
    }

    /// [`MatMulWeight::new`] with the kernels of `format`.
    fn with_format(
        format: &'static dyn Format,
        dtype: DType,
        rows: usize,
        cols: usize,
        bytes: &[u8],
    ) -> Result<Self, MatMulError> {
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
        Ok(MatMulWeight {
            dtype,
            rows,
            cols,
            packed: format.pack(dtype, rows, cols, bytes),
            kasoku: None,
            format,
        })
    }

    /// Packs a matrix in one of kasoku's formats (its parts checked by the view).
    pub fn kasoku(q: crate::quant::kasoku::QuantizedView) -> MatMulWeight {
        let m = kasoku::KasokuMatrix::new(q);
        MatMulWeight {
            dtype: DType::F32,
            rows: m.rows(),
            cols: m.cols(),
            packed: PackedBytes::copy_of(&[]),
            kasoku: Some(Box::new(m)),
            format: &kasoku_family::KasokuFamily,
        }
    }

    /// What the matrix is stored as.
    pub fn format(&self) -> WeightFormat {
        match &self.kasoku {
            Some(k) => WeightFormat::Kasoku(k.spec.format),
            None => WeightFormat::Gguf(self.dtype),
        }
    }

    /// The GGUF element type (`None` for kasoku's formats).
    pub fn dtype(&self) -> Option<DType> {
        self.kasoku.is_none().then_some(self.dtype)
    }

    /// The spec of a matrix in one of kasoku's formats.
    pub fn kasoku_spec(&self) -> Option<crate::quant::kasoku::TensorSpec> {
        self.kasoku.as_ref().map(|k| k.spec)
    }

    fn acts_key(&self) -> ActsKey {
        match &self.kasoku {
            Some(k) => ActsKey::Kasoku(k.spec.rotation),
            None => ActsKey::Gguf(self.dtype),
        }
    }

    /// The matrix of the first `n` rows (`n ≤ rows`), e.g. an LM head over a reduced
    /// vocabulary for a drafter. Rows keep their packed bytes, so row `j < n` of the result
    /// computes exactly what row `j` of `self` does.
    pub fn first_rows(&self, n: usize) -> MatMulWeight {
        let n = n.min(self.rows);
        if let Some(k) = &self.kasoku {
            return MatMulWeight {
                dtype: self.dtype,
                rows: n,
                cols: self.cols,
                packed: PackedBytes::copy_of(&[]),
                kasoku: Some(Box::new(k.first_rows(n))),
                format: self.format,
            };
        }
        MatMulWeight {
            dtype: self.dtype,
            rows: n,
            cols: self.cols,
            packed: self.format.first_rows(self, n),
            kasoku: None,
            format: self.format,
        }
    }

    /// Bytes the packed weights occupy (what one product reads).
    pub fn size_bytes(&self) -> usize {
        match &self.kasoku {
            Some(k) => k.size_bytes(),
            None => self.packed.len(),
        }
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

/// Several products over the same activations, `ys[i] = x · Wᵢᵀ` (e.g. an attention layer's
/// q, k and v projections when their formats differ), in one parallel job: the pool
/// synchronises once instead of once per matrix, and the small matrices' tasks fill the gaps
/// of the large one's. Each output gets the same bits as [`matmul`] of its matrix alone.
pub fn matmul_many(ws: &[&MatMulWeight], x: &[f32], n: usize, ys: &mut [&mut [f32]]) {
    matmul_parts(ws, x, n, ys, Isa::detect(), threads::num_threads());
}

/// `ys[i] = x · Wᵢᵀ` for rows `x` a fused epilogue prepared for the matrices `ws` (see
/// [`Prepared`]; `n` rows): each output gets the bits [`matmul_many`] of the epilogue's f32
/// rows gives.
pub fn matmul_prepared(ws: &[&MatMulWeight], x: &Prepared, n: usize, ys: &mut [&mut [f32]]) {
    matmul_prepared_with(ws, x, n, ys, Isa::detect(), threads::num_threads());
}

/// [`matmul_prepared`] with a chosen instruction set and thread count.
pub(crate) fn matmul_prepared_with(
    ws: &[&MatMulWeight],
    x: &Prepared,
    n: usize,
    ys: &mut [&mut [f32]],
    isa: Isa,
    threads: usize,
) {
    assert_eq!(ws.len(), ys.len(), "matmul: one output per matrix");
    let a = &x.acts.kasoku;
    assert_eq!(a.n, n, "matmul: prepared rows of another batch");
    for w in ws {
        let k = w
            .kasoku
            .as_ref()
            .expect("matmul: prepared rows for a GGUF matrix");
        assert!(
            a.cols == w.cols && a.rotation == k.spec.rotation,
            "matmul: rows prepared for another rotation or width"
        );
    }
    for (ws, ys) in ws.chunks(MAX_LIST).zip(ys.chunks_mut(MAX_LIST)) {
        matmul_job(ws, Input::Prepared(&x.acts), n, ys, isa, threads);
    }
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
        matmul_job(ws, Input::Rows(x), n, ys, isa, threads);
    }
}

/// What a job multiplies: f32 rows, converted for each format, or rows prepared already.
#[derive(Clone, Copy)]
enum Input<'a> {
    Rows(&'a [f32]),
    Prepared(&'a Acts),
}

thread_local! {
    /// The calling thread's converted activations, one slot per format of a job.
    static ACTS: Cell<Vec<Acts>> = const { Cell::new(Vec::new()) };
    /// The calling thread's work memory for its tasks: their tiles, and their formats' work.
    static TILES: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// [`matmul_parts`] for at most [`MAX_LIST`] matrices: one pool job.
fn matmul_job(
    ws: &[&MatMulWeight],
    input: Input,
    n: usize,
    ys: &mut [&mut [f32]],
    isa: Isa,
    threads: usize,
) {
    scratch::with(&ACTS, |acts| {
        if acts.len() < ws.len() {
            acts.resize_with(ws.len(), Acts::default);
        }
        // The activations in each format the matrices need, prepared once per format into
        // slot `act_of[i]` of `acts`; slot `k` holds `prepared[k]`'s.
        let mut prepared: [Option<ActsKey>; MAX_LIST] = [None; MAX_LIST];
        let mut act_of = [0usize; MAX_LIST];
        // Weight rows per task of each matrix: a task computes one block of its output columns.
        let mut step = [0usize; MAX_LIST];
        let mut work_len = 0;
        let mut outs = BlockList::new();
        for (i, (w, y)) in ws.iter().zip(ys.iter_mut()).enumerate() {
            if let Input::Rows(x) = input {
                assert_eq!(x.len(), n * w.cols, "matmul: x has the wrong length");
            }
            assert_eq!(y.len(), n * w.rows, "matmul: y has the wrong length");
            step[i] = task_rows(w.rows, threads);
            outs.push(Blocks::new(y, n, step[i]));
            if n == 0 || w.rows == 0 {
                continue;
            }
            act_of[i] = match prepared.iter().position(|d| *d == Some(w.acts_key())) {
                Some(k) => k,
                None => {
                    let k = prepared
                        .iter()
                        .position(Option::is_none)
                        .expect("a free slot");
                    if let Input::Rows(x) = input {
                        w.format.prepare(w, x, n, isa, &mut acts[k]);
                    }
                    prepared[k] = Some(w.acts_key());
                    k
                }
            };
            work_len = work_len.max(n * step[i] + w.format.work_len(w, n, step[i]));
        }
        let acts = &acts[..];
        let (x, prepared) = match input {
            Input::Rows(x) => (x, None),
            // The kernels of kasoku's formats read only the prepared rows.
            Input::Prepared(p) => (&[][..], Some(p)),
        };
        let tasks = outs.parts();
        // Each task computes its tile (every activation row × its weight rows) in its thread's
        // work area, then copies the tile's rows into place.
        scratch::with(&TILES, |buf| {
            let work = Work::new(buf, work_len);
            threads::for_each(tasks, outs, work, |_, (i, b, mut out), area| {
                let w = ws[i];
                let rows = b * step[i]..b * step[i] + out.len();
                let (tile, work) = area.split_at_mut(n * rows.len());
                let t = Tile {
                    w,
                    x,
                    acts: prepared.unwrap_or(&acts[act_of[i]]),
                    n,
                    rows: rows.clone(),
                    isa,
                };
                w.format.compute_tile(&t, tile, work);
                for (r, src) in tile.chunks_exact(rows.len()).enumerate() {
                    out.row(r).copy_from_slice(src);
                }
            });
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
