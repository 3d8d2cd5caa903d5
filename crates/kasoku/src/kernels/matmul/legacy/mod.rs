//! Products on the legacy 32-value formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0): packing, int8
//! activations, the tile loop and the portable kernel (the AVX2 kernels are in `avx2.rs`, the
//! AVX512-VNNI ones in `vnni.rs`).
//!
//! **Packed layout.** Weight rows are taken in groups of [`GROUP`] = 8 (the last group padded
//! with zero rows, whose scale 0 makes them contribute nothing). For each group and each block
//! column `b`, the eight rows' blocks are stored together, `8 × block_bytes` bytes:
//! - `d[8]` (f16), then for Q4_1/Q5_1 `m[8]` (f16): the scales of the eight rows, loaded as one
//!   vector;
//! - Q5 only, `h[32]`: the fifth bits, rearranged so that byte `4i + t` holds, in bit `k`, the
//!   fifth bit of value `4k + t` of row `i`;
//! - the codes as 32-byte registers: for Q4/Q5, register `j < 4` holds in bytes `4i..4i+4` the
//!   GGUF bytes `qs[4j..4j+4]` of row `i` (low nibbles: values `4j..4j+4`, high nibbles: values
//!   `16+4j..20+4j`); for Q8_0, register `k < 8` holds values `4k..4k+4` of row `i` in bytes
//!   `4i..4i+4`.
//!
//! So once unpacked, "group register" `k` holds, in 32-bit lane `i`, values `4k..4k+4` of row
//! `i`, and its product with the activation bytes `4k..4k+4` broadcast to every lane gives all
//! eight rows' partial dot products in one `maddubs`: the weights are read once for every
//! activation row, the scales come as one vector, and no horizontal sums are needed.
//!
//! **Activations** are quantized once per call to int8 blocks of 32 (codes `round(x·127/max|x|)`
//! to nearest even, as GGML's SIMD quantizers do; scale `d = max|x|/127` rounded to f16 as GGML
//! stores it) with their code sums, which turn the unsigned weight codes into the signed or
//! offset formats: Q4_0 and Q5_0 subtract `8·Σq` / `16·Σq` from the integer dot product, Q4_1
//! and Q5_1 add `m·f16(d·Σq)` (Q8_1's `s`). They are stored block-major (block `j` of row `r`
//! at `j·n + r`) so a tile of rows is reached from one pointer.
//!
//! **Tiles.** A task's weight rows are walked group by group; each group is cut into chunks of
//! [`KC`] blocks that stay in L1 while every register tile of activation rows (4, or 8 with
//! VNNI) uses them; very large batches are walked in blocks of [`XB`] rows.
//!
//! **Per block**, each (weight row, activation row) accumulates
//! `acc = fma(d_w·d_x, dot, acc)` (plus `fma(m_w, d_x·Σq_x, acc)` for the formats with a min),
//! blocks in order: the portable, AVX2 and VNNI kernels all do exactly this, so they agree bit
//! for bit, and an activation row's result does not depend on how many rows share the call.

use half::f16;

use super::{Acts, Format, MatMulWeight, PackedBytes, Tile};
use crate::kernels::scratch;
use crate::kernels::simd::Isa;
use crate::kernels::threads::{self, Blocks, Work};
use crate::quant::legacy::QK;
use crate::quant::DType;

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(test)]
mod tests;
#[cfg(target_arch = "x86_64")]
mod vnni;

/// The legacy formats' kernels.
pub(crate) struct Legacy;

impl Format for Legacy {
    fn pack(&self, dtype: DType, rows: usize, cols: usize, bytes: &[u8]) -> PackedBytes {
        pack(dtype, rows, cols, bytes)
    }

    fn prepare(&self, w: &MatMulWeight, x: &[f32], n: usize, isa: Isa, acts: &mut Acts) {
        prepare(w.dtype, x, n, w.cols, isa, &mut acts.q8);
    }

    fn compute_tile(&self, t: &Tile, tile: &mut [f32], _work: &mut [f32]) {
        compute_tile(t, tile);
    }
}

/// Weight rows packed together.
pub(crate) const GROUP: usize = 8;
/// Activation rows per outer block (larger calls loop over blocks of this many rows).
const XB: usize = 64;
/// Blocks per column chunk: the chunk of a weight group stays in L1 while every activation
/// tile of the call uses it.
const KC: usize = 64;

/// Activation rows quantized to int8 blocks for one call, stored block-major: block `j` of
/// row `r` is entry `j·n + r`, so the rows of a tile are adjacent and one pointer reaches them.
/// The memory is reused from call to call.
#[derive(Default)]
pub(crate) struct Q8Acts {
    /// Rows.
    pub n: usize,
    /// `nb × n × 32` codes.
    pub qs: Vec<i8>,
    /// `nb × n` scales (f16-rounded, as GGML stores them).
    pub d: Vec<f32>,
    /// Q4_0 / Q5_0 / Q8_0: `nb × n` integer corrections `−off·Σq` with `off` = 8, 16, 128
    /// (not set otherwise). Q8_0's is used by the VNNI kernel only.
    pub neg_corr: Vec<i32>,
    /// Q4_1 / Q5_1: `nb × n` values `f16(d·Σq)` (not set otherwise).
    pub s: Vec<f32>,
    /// `nb × n` code sums.
    sums: Vec<i32>,
}

/// Byte offsets inside one packed 8-row block: (mins, high bits, codes).
pub(crate) fn offsets(dtype: DType) -> (usize, usize, usize) {
    match dtype {
        DType::Q4_0 | DType::Q8_0 => (0, 0, 16),
        DType::Q4_1 => (16, 0, 32),
        DType::Q5_0 => (0, 16, 48),
        DType::Q5_1 => (16, 32, 64),
        _ => unreachable!("not a legacy format: {dtype}"),
    }
}

/// Repacks GGUF-layout rows into 8-row groups (see the module documentation).
pub(crate) fn pack(dtype: DType, rows: usize, cols: usize, bytes: &[u8]) -> PackedBytes {
    let bb = dtype.block_bytes();
    let nb = cols / QK;
    let row_bytes = nb * bb;
    let groups = rows.div_ceil(GROUP);
    let (m_off, h_off, q_off) = offsets(dtype);
    let mut out = PackedBytes::zeroed(groups * nb * GROUP * bb);
    for (gb, dst) in out.chunks_exact_mut(GROUP * bb).enumerate() {
        let (g, b) = (gb / nb, gb % nb);
        for i in 0..GROUP {
            let row = g * GROUP + i;
            if row >= rows {
                break;
            }
            let src = &bytes[row * row_bytes + b * bb..][..bb];
            dst[2 * i..2 * i + 2].copy_from_slice(&src[0..2]);
            match dtype {
                DType::Q8_0 => {
                    for k in 0..8 {
                        dst[q_off + 32 * k + 4 * i..][..4].copy_from_slice(&src[2 + 4 * k..][..4]);
                    }
                }
                _ => {
                    let mut qs_at = 2;
                    if m_off != 0 {
                        dst[m_off + 2 * i..][..2].copy_from_slice(&src[2..4]);
                        qs_at += 2;
                    }
                    if h_off != 0 {
                        let qh = u32::from_le_bytes([
                            src[qs_at],
                            src[qs_at + 1],
                            src[qs_at + 2],
                            src[qs_at + 3],
                        ]);
                        qs_at += 4;
                        for t in 0..4 {
                            let mut byte = 0u8;
                            for k in 0..8 {
                                byte |= (((qh >> (4 * k + t)) & 1) as u8) << k;
                            }
                            dst[h_off + 4 * i + t] = byte;
                        }
                    }
                    for j in 0..4 {
                        dst[q_off + 32 * j + 4 * i..][..4]
                            .copy_from_slice(&src[qs_at + 4 * j..][..4]);
                    }
                }
            }
        }
    }
    out.freeze()
}

/// Quantizes one block of 32 activations: returns `(d, Σq)` and writes the codes. Rounds
/// `x·(127/max|x|)` to nearest even (the AVX2 path's `cvtps2dq` does the same).
pub(crate) fn quantize_block(x: &[f32], q: &mut [i8]) -> (f32, i32) {
    let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let mut sum = 0i32;
    for (o, v) in q.iter_mut().zip(x) {
        // Adding and removing 1.5·2^23 rounds to the nearest integer, ties to even.
        let r = ((v * id + 12_582_912.0) - 12_582_912.0) as i32;
        *o = r as i8;
        sum += r;
    }
    (d, sum)
}

/// Quantizes `n` activation rows for a product with `dtype` weights into `acts`.
pub(crate) fn prepare(dtype: DType, x: &[f32], n: usize, cols: usize, isa: Isa, acts: &mut Q8Acts) {
    let nb = cols / QK;
    acts.n = n;
    let qs = scratch::sized(&mut acts.qs, n * cols);
    let d = scratch::sized(&mut acts.d, n * nb);
    let sums = scratch::grow(&mut acts.sums, n * nb);
    // Large batches (prefill) are quantized in parallel, by ranges of block columns.
    let per_task = if n * cols >= 1 << 16 {
        nb.div_ceil(4 * threads::num_threads())
    } else {
        nb
    };
    let parts = (
        Blocks::chunks(&mut *qs, per_task * n * QK),
        Blocks::chunks(&mut *d, per_task * n),
        Blocks::chunks(&mut *sums, per_task * n),
    );
    let tasks = nb.div_ceil(per_task.max(1));
    threads::for_each(tasks, parts, Work::none(), |t, (q, d, s), _| {
        let (q, d, s) = (q.into_slice(), d.into_slice(), s.into_slice());
        quantize_blocks(x, n, cols, t * per_task, q, d, s, isa);
    });
    // GGML stores activation scales as f16 (Q8_0 `d`; Q8_1 `d` and `s = d·Σq`, both rounded
    // from the f32 `d`). Rounding them the same way makes kasoku's products equal llama.cpp's
    // on the same file, not merely close to the f32 reference.
    let to_f16 = |v: f32| half::f16::from_f32(v).to_f32();
    let off = match dtype {
        DType::Q4_0 => 8,
        DType::Q5_0 => 16,
        DType::Q8_0 => 128,
        _ => 0,
    };
    if off != 0 {
        acts.neg_corr.clear();
        // Wrapping: a NaN activation (only a broken checkpoint makes one) quantizes to the
        // integer-indefinite code on AVX2, so its block sum is meaningless, and must not trap.
        acts.neg_corr
            .extend(sums.iter().map(|s| s.wrapping_mul(-off)));
    }
    if matches!(dtype, DType::Q4_1 | DType::Q5_1) {
        acts.s.clear();
        acts.s
            .extend(sums.iter().zip(&*d).map(|(&s, &d)| to_f16(d * s as f32)));
    }
    for d in d {
        *d = to_f16(*d);
    }
}

/// Quantizes the blocks `j0..` of every row into block-major slices (entry `(j − j0)·n + r`)
/// holding whole block columns: codes, scales and code sums.
#[allow(clippy::too_many_arguments)]
fn quantize_blocks(
    x: &[f32],
    n: usize,
    cols: usize,
    j0: usize,
    qs: &mut [i8],
    d: &mut [f32],
    sums: &mut [i32],
    isa: Isa,
) {
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        // SAFETY: an `Isa` with AVX2 exists only on CPUs with AVX2, FMA and F16C
        // (`kernels::simd`).
        unsafe { avx2::quantize_blocks(x, n, cols, j0, qs, d, sums) };
        return;
    }
    let _ = isa;
    for (e, ((qb, d), s)) in qs.chunks_exact_mut(QK).zip(d).zip(sums).enumerate() {
        let (j, r) = (j0 + e / n, e % n);
        (*d, *s) = quantize_block(&x[r * cols + j * QK..][..QK], qb);
    }
}

/// A kernel's view of `xr` activation rows starting at row `r0`, from block column `kb` on.
pub(crate) struct XTile<'a> {
    pub acts: &'a Q8Acts,
    pub r0: usize,
    pub kb: usize,
}

impl XTile<'_> {
    /// Index of (row `r0 + r`, block `kb + b`) in the block-major arrays.
    pub fn idx(&self, r: usize, b: usize) -> usize {
        (self.kb + b) * self.acts.n + self.r0 + r
    }
    pub fn qs(&self, r: usize, b: usize) -> &[i8] {
        &self.acts.qs[self.idx(r, b) * QK..][..QK]
    }
}

/// Activation rows one kernel call takes (its register tile): the VNNI kernels have 32
/// vector registers and do eight (measured −10 % time per row at 8–16 rows on Zen 4).
fn tile_rows(isa: Isa) -> usize {
    if isa.vnni() {
        8
    } else {
        4
    }
}

/// `tile[r][j - rows.start] = Σ_c x[r][c]·W[j][c]` for the weight rows `rows` (which start on
/// a group boundary).
fn compute_tile(t: &Tile, tile: &mut [f32]) {
    let (w, acts, n, rows, isa) = (t.w, &t.acts.q8, t.n, t.rows.clone(), t.isa);
    debug_assert_eq!(rows.start % GROUP, 0);
    let bb = w.dtype.block_bytes();
    let nb = w.cols / QK;
    let group_bytes = nb * GROUP * bb;
    let len = rows.len();
    let mut acc = [0f32; XB * GROUP];
    for xr0 in (0..n).step_by(XB) {
        let xn = XB.min(n - xr0);
        for g in rows.start / GROUP..rows.end.div_ceil(GROUP) {
            acc[..xn * GROUP].fill(0.0);
            let gw = &w.packed[g * group_bytes..(g + 1) * group_bytes];
            for kb in (0..nb).step_by(KC) {
                let kn = KC.min(nb - kb);
                let wchunk = &gw[kb * GROUP * bb..(kb + kn) * GROUP * bb];
                for xt in (0..xn).step_by(tile_rows(isa)) {
                    let xr = tile_rows(isa).min(xn - xt);
                    let x = XTile {
                        acts,
                        r0: xr0 + xt,
                        kb,
                    };
                    let a = &mut acc[xt * GROUP..(xt + xr) * GROUP];
                    kernel(w.dtype, isa, wchunk, kn, &x, xr, a);
                }
            }
            for r in 0..xn {
                for i in 0..GROUP {
                    let j = g * GROUP + i;
                    if j < rows.end {
                        tile[(xr0 + r) * len + j - rows.start] = acc[r * GROUP + i];
                    }
                }
            }
        }
    }
}

/// Accumulates `kn` blocks of one weight group into `acc[r][i]` for `xr` activation rows.
fn kernel(dtype: DType, isa: Isa, w: &[u8], kn: usize, x: &XTile, xr: usize, acc: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if isa.vnni() {
        // SAFETY: an `Isa` with VNNI exists only on CPUs with AVX2, FMA, F16C and AVX-512
        // F/VL/VNNI (`kernels::simd`); the kernel checks that `w`, `x` and `acc` cover `kn`
        // blocks and `xr` rows.
        unsafe { vnni::kernel(dtype, w, kn, x, xr, acc) };
        return;
    } else if isa.avx2() {
        // SAFETY: an `Isa` with AVX2 exists only on CPUs with AVX2, FMA and F16C; as above.
        unsafe { avx2::kernel(dtype, w, kn, x, xr, acc) };
        return;
    }
    let _ = isa;
    portable_kernel(dtype, w, kn, x, xr, acc)
}

/// The eight rows' codes of one packed block, as signed integers (unsigned codes for Q4/Q5).
fn unpack_block(dtype: DType, p: &[u8]) -> [[i32; QK]; GROUP] {
    let (_, h_off, q_off) = offsets(dtype);
    let mut q = [[0i32; QK]; GROUP];
    for (i, qi) in q.iter_mut().enumerate() {
        for k in 0..8 {
            for t in 0..4 {
                let v = 4 * k + t;
                qi[v] = if dtype == DType::Q8_0 {
                    p[q_off + 32 * k + 4 * i + t] as i8 as i32
                } else {
                    let byte = p[q_off + 32 * (k % 4) + 4 * i + t];
                    let nib = if k < 4 { byte & 15 } else { byte >> 4 };
                    let high = if h_off != 0 {
                        ((p[h_off + 4 * i + t] >> k) & 1) << 4
                    } else {
                        0
                    };
                    (nib | high) as i32
                };
            }
        }
    }
    q
}

fn portable_kernel(dtype: DType, w: &[u8], kn: usize, x: &XTile, xr: usize, acc: &mut [f32]) {
    let bb8 = dtype.block_bytes() * GROUP;
    let (m_off, _, _) = offsets(dtype);
    let f16_at = |p: &[u8], at: usize| f16::from_le_bytes([p[at], p[at + 1]]).to_f32();
    for b in 0..kn {
        let p = &w[b * bb8..(b + 1) * bb8];
        let q = unpack_block(dtype, p);
        for r in 0..xr {
            let xq = x.qs(r, b);
            let idx = x.idx(r, b);
            let dx = x.acts.d[idx];
            for i in 0..GROUP {
                let mut dot: i32 = q[i].iter().zip(xq).map(|(&a, &b)| a * b as i32).sum();
                if matches!(dtype, DType::Q4_0 | DType::Q5_0) {
                    dot += x.acts.neg_corr[idx];
                }
                let a = &mut acc[r * GROUP + i];
                *a = (f16_at(p, 2 * i) * dx).mul_add(dot as f32, *a);
                if m_off != 0 {
                    *a = f16_at(p, m_off + 2 * i).mul_add(x.acts.s[idx], *a);
                }
            }
        }
    }
}
