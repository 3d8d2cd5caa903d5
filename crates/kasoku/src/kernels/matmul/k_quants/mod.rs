//! Products on the K-quant formats (Q4_K, Q5_K, Q6_K): load-time repacking, Q8_K activations,
//! and the portable tile kernel. `avx2.rs` holds the AVX2 kernels (4 activation rows per tile)
//! and `vnni.rs` the AVX512-VNNI ones (8 rows per tile); all three compute the same function
//! bit for bit.
//!
//! **Packed layout.** Weight rows are taken in groups of [`GROUP`] = 8 (the last group padded
//! with zero rows, whose scales 0 make them contribute nothing). For each group and each
//! 256-value super-block column, the eight rows' blocks are stored together ("packed
//! super-block", 8 × the GGUF block size). The super-block columns are cut into panels of
//! [`PANEL`]; panel after panel, each holds every group's packed super-blocks of its columns,
//! group after group (a matrix of at most `PANEL` super-block columns is simply group after
//! group). A tile works through a panel's groups, then the next panel's, so that the
//! activation blocks of one panel stay in L1 while its weights stream past them: with whole
//! rows per group, a row longer than L1 (e.g. 8960 columns: 40 KiB of Q4_K per group)
//! evicted the activations before the next group used them (measured on one thread with
//! weights from memory, one activation row: 20.5 GB/s at 8960 columns, against 30 GB/s at up
//! to 4096). Each row still adds its super-blocks in column order, so the sums are the same.
//! Inside a packed super-block, a 32-byte register holds four consecutive
//! codes of one sub-block for each of the eight rows (32-bit lane `i` = row `i`): multiplied
//! with the four matching activation bytes broadcast to every lane (`maddubs`, or `vpdpbusd`
//! with VNNI) it gives the partial dot products of all eight rows, and one multiply by the
//! vector of the eight rows' sub-block scales finishes them: no horizontal sums, and every
//! weight byte is read once per call for all activation rows.
//! - Q4_K (1152 bytes): `d[8]` f16, `dmin[8]` f16; 96 bytes of 6-bit scales and mins (see
//!   [`scale_pos`]); then per 64-value group `g`, eight code registers: register `c`, lane `i`,
//!   byte `t` is the GGUF byte `qs[32g + 4c + t]` of row `i` (low nibble: value `64g + 4c + t`,
//!   sub-block `2g`; high nibble: value `64g + 32 + 4c + t`, sub-block `2g + 1`).
//! - Q5_K (1408 bytes): as Q4_K, but each group is followed by two fifth-bit registers:
//!   register `c / 4`, lane `i`, byte `t`, bit `c % 4` (low nibble) or `4 + c % 4` (high).
//! - Q6_K (1680 bytes): `d[8]` f16; 128 bytes of i8 scales (`16 + 8k + i`: sub-block `k`, row
//!   `i`); then per 32-value unit `p`, four code registers (register `v`, lane `i`, byte `t`:
//!   low 4 bits of value `32p + 4v + t` (sub-block `2p`) in the low nibble, of value
//!   `32p + 16 + 4v + t` (sub-block `2p + 1`) in the high nibble) and two registers of top bits
//!   (register `v / 2`, shift `4(v % 2)` for the low nibble's value, `+2` for the high one's).
//!
//! **Activations** become Q8_K blocks (GGML's quantizer) of [`ACT_BLOCK`] bytes: `d` (f32), the
//! 256 codes, `bsums[16]` (i16) and the sums of each 32 codes `bsums32[8]` (i16), stored
//! super-block by super-block (block of row `r`, column `s` at `(s·n + r)·ACT_BLOCK`), so that a
//! tile's rows are adjacent and one pointer per super-block reaches them all. On AVX2 CPUs an
//! AVX2 quantizer writes them (the same bits as the scalar one; blocks with infinities or NaNs
//! go to the scalar one).
//!
//! **Per super-block**, each (weight row, activation row) pair does, in this order,
//! `acc -= (dmin·d_x)·Σ_j min_j·bsums32_j` (Q4_K, Q5_K) and `acc += (d·d_x)·sumi` with the
//! exact integer `sumi = Σ_j scale_j·Σ q·x` (Q6_K: `Σ_j scale_j·(Σ q·x − 32·bsums_j)`), products
//! and sums rounded separately (no fused multiply-add): the same arithmetic as
//! [`crate::quant::k_quants::vec_dot`], so every path agrees bit for bit and an activation
//! row's result does not depend on how many rows share the call.

use std::ops::Range;

use half::f16;

use super::{Acts, Format, MatMulWeight, PackedBytes, Tile};
use crate::kernels::scratch;
use crate::kernels::simd::Isa;
use crate::quant::k_quants::{self as kq, QK_K};
use crate::quant::DType;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(test)]
mod tests;
#[cfg(target_arch = "x86_64")]
mod vnni;

/// The K-quant formats' kernels.
pub(crate) struct KQuants;

impl Format for KQuants {
    fn pack(&self, dtype: DType, rows: usize, cols: usize, bytes: &[u8]) -> PackedBytes {
        pack(dtype, rows, cols, bytes)
    }

    fn first_rows(&self, w: &MatMulWeight, n: usize) -> PackedBytes {
        first_groups(w, n.div_ceil(GROUP))
    }

    fn prepare(&self, w: &MatMulWeight, x: &[f32], n: usize, isa: Isa, acts: &mut Acts) {
        prepare(w, x, n, isa, &mut acts.q8k);
    }

    fn work_len(&self, _w: &MatMulWeight, n: usize, rows: usize) -> usize {
        sums_len(n, rows)
    }

    fn compute_tile(&self, t: &Tile, tile: &mut [f32], work: &mut [f32]) {
        let acts = &t.acts.q8k[..t.n * (t.w.cols / QK_K) * ACT_BLOCK];
        compute_tile(t.w, acts, t.n, t.rows.clone(), tile, work, t.isa);
    }
}

/// Weight rows packed together.
pub(crate) const GROUP: usize = 8;
/// Bytes of one activation block: d, 256 codes, bsums[16], bsums32[8].
pub(crate) const ACT_BLOCK: usize = 4 + QK_K + 32 + 16;
/// Offsets inside an activation block.
pub(crate) const ACT_QS: usize = 4;
pub(crate) const ACT_BSUMS: usize = ACT_QS + QK_K;
pub(crate) const ACT_BSUMS32: usize = ACT_BSUMS + 32;
/// Activation rows per outer block: larger calls loop over blocks of this many rows so that
/// the activations in use stay in L2.
const XB: usize = 32;
/// Super-block columns per panel of the packed layout (a group's panel: 9–13 KiB).
pub(crate) const PANEL: usize = 8;

/// The panels of a row of `nb` super-blocks: (first super-block, width).
fn panels(nb: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..nb)
        .step_by(PANEL)
        .map(move |s0| (s0, PANEL.min(nb - s0)))
}

/// Where packed super-block `s` of row group `g` starts, in a matrix of `groups` row groups
/// and `nb` super-blocks per row of `pbb` bytes each.
fn block_offset(groups: usize, nb: usize, pbb: usize, g: usize, s: usize) -> usize {
    let s0 = s / PANEL * PANEL;
    let width = PANEL.min(nb - s0);
    (groups * s0 + g * width + (s - s0)) * pbb
}

/// Bytes of one packed super-block (eight rows).
pub(crate) fn packed_block_bytes(dtype: DType) -> usize {
    GROUP * dtype.block_bytes()
}

/// Where scale/min `j` (sub-block 0..8) of row `i` lives in the 96 scale bytes of a packed
/// Q4_K/Q5_K super-block: returns (`h`, `pos`). The low 4 bits of scale and min are the low
/// and high nibble of byte `32h + pos`; their top 2 bits are bits `4h..4h+2` and
/// `4h+2..4h+4` of byte `64 + pos`. `pos = 16·(i/4) + 4·(j%4) + i%4`, so one 128-bit lane
/// holds rows 0..4 or 4..8.
pub(crate) fn scale_pos(i: usize, j: usize) -> (usize, usize) {
    (j / 4, 16 * (i / 4) + 4 * (j % 4) + i % 4)
}

/// The natural 4- or 5-bit code of value `v` of a Q4_K (`qh` = None) or Q5_K block.
fn q45_code(qs: &[u8], qh: Option<&[u8]>, v: usize) -> u8 {
    let (g, l) = (v / 64, v % 64);
    let byte = qs[32 * g + l % 32];
    let lo = if l < 32 { byte & 15 } else { byte >> 4 };
    match qh {
        Some(qh) => lo | (((qh[l % 32] >> (2 * g + l / 32)) & 1) << 4),
        None => lo,
    }
}

/// Repacks GGUF-layout rows into 8-row groups (see the module documentation).
pub(crate) fn pack(dtype: DType, rows: usize, cols: usize, bytes: &[u8]) -> PackedBytes {
    let bb = dtype.block_bytes();
    let nb = cols / QK_K;
    let groups = rows.div_ceil(GROUP);
    let pbb = packed_block_bytes(dtype);
    let mut out = PackedBytes::zeroed(groups * nb * pbb);
    for gi in 0..groups {
        for s in 0..nb {
            let at = block_offset(groups, nb, pbb, gi, s);
            let sb = &mut out[at..at + pbb];
            for i in 0..GROUP {
                let row = gi * GROUP + i;
                if row >= rows {
                    break; // padding rows stay zero
                }
                let blk = &bytes[(row * nb + s) * bb..(row * nb + s + 1) * bb];
                match dtype {
                    DType::Q4K | DType::Q5K => pack_q45(dtype, blk, i, sb),
                    DType::Q6K => pack_q6(blk, i, sb),
                    _ => unreachable!("not a K-quant format: {dtype}"),
                }
            }
        }
    }
    out.freeze()
}

/// The packed bytes of the first `groups` row groups of `w` (their rows unchanged): what
/// packing those rows alone gives, padding rows aside.
pub(crate) fn first_groups(w: &MatMulWeight, groups: usize) -> PackedBytes {
    let nb = w.cols / QK_K;
    let pbb = packed_block_bytes(w.dtype);
    let all = w.rows.div_ceil(GROUP);
    let mut out = PackedBytes::zeroed(groups * nb * pbb);
    for (s0, width) in panels(nb) {
        let from = block_offset(all, nb, pbb, 0, s0);
        let to = block_offset(groups, nb, pbb, 0, s0);
        let len = groups * width * pbb;
        out[to..to + len].copy_from_slice(&w.packed[from..from + len]);
    }
    out.freeze()
}

fn pack_q45(dtype: DType, blk: &[u8], i: usize, sb: &mut [u8]) {
    sb[2 * i..2 * i + 2].copy_from_slice(&blk[0..2]);
    sb[16 + 2 * i..16 + 2 * i + 2].copy_from_slice(&blk[2..4]);
    for j in 0..8 {
        let (sc, mn) = kq::scale_min_k4(j, &blk[4..16]);
        let (h, pos) = scale_pos(i, j);
        sb[32 + 32 * h + pos] = (sc & 15) | ((mn & 15) << 4);
        sb[96 + pos] |= ((sc >> 4) << (4 * h)) | ((mn >> 4) << (4 * h + 2));
    }
    let (qs, qh, gstride) = match dtype {
        DType::Q4K => (&blk[16..144], None, 256),
        _ => (&blk[48..176], Some(&blk[16..48]), 320),
    };
    for g in 0..4 {
        for c in 0..8 {
            for t in 0..4 {
                sb[128 + g * gstride + 32 * c + 4 * i + t] = qs[32 * g + 4 * c + t];
                if qh.is_some() {
                    let lo = q45_code(qs, qh, 64 * g + 4 * c + t) >> 4;
                    let hi = q45_code(qs, qh, 64 * g + 32 + 4 * c + t) >> 4;
                    sb[128 + g * gstride + 256 + 32 * (c / 4) + 4 * i + t] |=
                        (lo << (c % 4)) | (hi << (4 + c % 4));
                }
            }
        }
    }
}

fn pack_q6(blk: &[u8], i: usize, sb: &mut [u8]) {
    sb[2 * i..2 * i + 2].copy_from_slice(&blk[208..210]);
    for k in 0..16 {
        sb[16 + 8 * k + i] = blk[192 + k];
    }
    for p in 0..8 {
        let base = 144 + 192 * p;
        for v in 0..4 {
            for t in 0..4 {
                for h in 0..2 {
                    let code = kq::q6_k_quant(blk, 32 * p + 16 * h + 4 * v + t);
                    sb[base + 32 * v + 4 * i + t] |= (code & 15) << (4 * h);
                    sb[base + 128 + 32 * (v / 2) + 4 * i + t] |=
                        (code >> 4) << (4 * (v % 2) + 2 * h);
                }
            }
        }
    }
}

/// Quantizes `n` activation rows to Q8_K blocks (see the module documentation) into the first
/// `n · cols / 256` blocks of `buf` (which grows if it is shorter).
fn prepare(w: &MatMulWeight, x: &[f32], n: usize, isa: Isa, buf: &mut Vec<u8>) {
    let nb = w.cols / QK_K;
    let out = scratch::grow(buf, n * nb * ACT_BLOCK);
    if nb == 0 {
        return;
    }
    for (r, xr) in x.chunks_exact(w.cols).enumerate() {
        for (s, xs) in xr.chunks_exact(QK_K).enumerate() {
            let at = (s * n + r) * ACT_BLOCK;
            quantize_act_block(isa, xs, &mut out[at..at + ACT_BLOCK]);
        }
    }
}

/// Quantizes 256 activations into one activation block, on AVX2 where `isa` has it (which
/// then leaves blocks with infinities or NaNs to the scalar quantizer: the same bits).
fn quantize_act_block(isa: Isa, xs: &[f32], blk: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: an `Isa` with AVX2 exists only on CPUs with AVX2, FMA and F16C
    // (`kernels::simd`); the lengths are checked inside.
    if isa.avx2() && unsafe { avx2::quantize_act_block(xs, blk) } {
        return;
    }
    let _ = isa;
    write_act_block(&kq::quantize_block_q8_k(xs), blk);
}

fn write_act_block(q: &kq::BlockQ8K, blk: &mut [u8]) {
    blk[0..4].copy_from_slice(&q.d.to_le_bytes());
    for (o, &v) in blk[ACT_QS..ACT_QS + QK_K].iter_mut().zip(&q.qs) {
        *o = v as u8;
    }
    for (k, s) in q.bsums.iter().enumerate() {
        blk[ACT_BSUMS + 2 * k..ACT_BSUMS + 2 * k + 2].copy_from_slice(&s.to_le_bytes());
    }
    for k in 0..8 {
        let s = q.bsums[2 * k] + q.bsums[2 * k + 1];
        blk[ACT_BSUMS32 + 2 * k..ACT_BSUMS32 + 2 * k + 2].copy_from_slice(&s.to_le_bytes());
    }
}

/// Activation rows per kernel call.
fn tile_rows(isa: Isa) -> usize {
    #[cfg(target_arch = "x86_64")]
    if isa.vnni() {
        return vnni::TILE;
    } else if isa.avx2() {
        return avx2::TILE;
    }
    let _ = isa;
    4
}

/// The work memory of a tile of `n` activation rows and at most `rows` weight rows (starting
/// anywhere): the running sums of every (row group, activation row) of a block of [`XB`]
/// activation rows.
fn sums_len(n: usize, rows: usize) -> usize {
    (rows / GROUP + 2) * n.min(XB) * GROUP
}

/// The running sums `[f32; GROUP]` in `work`.
fn as_groups(work: &mut [f32]) -> &mut [[f32; GROUP]] {
    let len = work.len() / GROUP;
    // SAFETY: `[f32; GROUP]` has the alignment of `f32` and the size of `GROUP` of them, and
    // the `len` groups lie inside `work`, which is borrowed mutably for the result's life.
    unsafe { std::slice::from_raw_parts_mut(work.as_mut_ptr().cast::<[f32; GROUP]>(), len) }
}

/// Computes `tile[r][j - rows.start] = Σ_c x[r][c]·W[j][c]` for `r < n`, `j ∈ rows`, on the
/// kernel for `isa`, from the activation blocks `acts` of [`prepare`], with `work` of at least
/// [`sums_len`] values.
fn compute_tile(
    w: &MatMulWeight,
    acts: &[u8],
    n: usize,
    rows: Range<usize>,
    tile: &mut [f32],
    work: &mut [f32],
    isa: Isa,
) {
    let nb = w.cols / QK_K;
    let pbb = packed_block_bytes(w.dtype);
    let len = rows.len();
    assert_eq!(
        tile.len(),
        n * len,
        "compute_tile: tile has the wrong length"
    );
    assert!(rows.end <= w.rows && acts.len() == n * nb * ACT_BLOCK);
    if len == 0 || nb == 0 {
        tile.fill(0.0);
        return;
    }
    let stride = n * ACT_BLOCK;
    let groups = w.rows.div_ceil(GROUP);
    let (g0, g1) = (rows.start / GROUP, rows.end.div_ceil(GROUP));
    let xt = tile_rows(isa);
    let sums = as_groups(work);
    for x0 in (0..n).step_by(XB) {
        let x1 = (x0 + XB).min(n);
        let xn = x1 - x0;
        // The running sums of every (row group, activation row), group-major.
        let sums = &mut sums[..(g1 - g0) * xn];
        sums.fill([0.0; GROUP]);
        for (s0, width) in panels(nb) {
            for g in g0..g1 {
                let at = block_offset(groups, nb, pbb, g, s0);
                let wg = &w.packed[at..at + width * pbb];
                let mut r = x0;
                while r < x1 {
                    let xr = (x1 - r).min(xt);
                    let a = &acts[s0 * stride + r * ACT_BLOCK
                        ..(s0 + width - 1) * stride + (r + xr) * ACT_BLOCK];
                    let out = &mut sums[(g - g0) * xn + r - x0..][..xr];
                    kernel(isa, w.dtype, wg, a, stride, out);
                    r += xr;
                }
            }
        }
        for g in g0..g1 {
            let (j0, j1) = (
                (g * GROUP).max(rows.start),
                (g * GROUP + GROUP).min(rows.end),
            );
            for (k, res) in sums[(g - g0) * xn..][..xn].iter().enumerate() {
                let dst = &mut tile[(x0 + k) * len..(x0 + k + 1) * len];
                dst[j0 - rows.start..j1 - rows.start]
                    .copy_from_slice(&res[j0 - g * GROUP..j1 - g * GROUP]);
            }
        }
    }
}

/// One packed row group's run of super-blocks (`wg`) times `out.len()` ≤ `tile_rows(isa)`
/// activation rows (`acts`: the block of row `r` for super-block `s` at `s·stride +
/// r·ACT_BLOCK`): adds to `out[r][i]` the dot of activation row `r` and weight row `i` over
/// those super-blocks, one super-block after the other.
fn kernel(isa: Isa, dtype: DType, wg: &[u8], acts: &[u8], stride: usize, out: &mut [[f32; GROUP]]) {
    #[cfg(target_arch = "x86_64")]
    if isa.vnni() {
        // SAFETY: an `Isa` with VNNI exists only on CPUs with AVX2, FMA, F16C and AVX-512
        // F/VL/VNNI (`kernels::simd`); the slices hold whole packed super-blocks and
        // activation blocks (checked by the caller).
        unsafe { vnni::kernel(dtype, wg, acts, stride, out) };
        return;
    } else if isa.avx2() {
        // SAFETY: an `Isa` with AVX2 exists only on CPUs with AVX2, FMA and F16C; slices as
        // above.
        unsafe { avx2::kernel(dtype, wg, acts, stride, out) };
        return;
    }
    let _ = isa;
    let pbb = packed_block_bytes(dtype);
    for (r, o) in out.iter_mut().enumerate() {
        for (s, sb) in wg.chunks_exact(pbb).enumerate() {
            let ab = &acts[s * stride + r * ACT_BLOCK..s * stride + (r + 1) * ACT_BLOCK];
            match dtype {
                DType::Q4K => portable_q45(sb, None, ab, o),
                DType::Q5K => portable_q45(sb, Some(()), ab, o),
                DType::Q6K => portable_q6(sb, ab, o),
                _ => unreachable!("not a K-quant format: {dtype}"),
            }
        }
    }
}

fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

fn i16_at(b: &[u8], at: usize) -> i32 {
    i16::from_le_bytes([b[at], b[at + 1]]) as i32
}

/// One packed Q4_K (`five` = None) or Q5_K super-block times one activation block.
fn portable_q45(sb: &[u8], five: Option<()>, ab: &[u8], acc: &mut [f32; GROUP]) {
    let gstride = if five.is_some() { 320 } else { 256 };
    let da = f32::from_le_bytes([ab[0], ab[1], ab[2], ab[3]]);
    let xq = &ab[ACT_QS..ACT_QS + QK_K];
    for (i, acc) in acc.iter_mut().enumerate() {
        let mut sumi = 0i32;
        let mut summ = 0i32;
        for j in 0..8 {
            let (h, pos) = scale_pos(i, j);
            let lo = sb[32 + 32 * h + pos];
            let hi = sb[96 + pos] >> (4 * h);
            let sc = ((lo & 15) | ((hi & 3) << 4)) as i32;
            let mn = ((lo >> 4) | (((hi >> 2) & 3) << 4)) as i32;
            summ += mn * i16_at(ab, ACT_BSUMS32 + 2 * j);
            // Sub-block j = 2g + h: nibble h of the group's code registers.
            let (g, h) = (j / 2, j % 2);
            let mut dot = 0i32;
            for c in 0..8 {
                for t in 0..4 {
                    let byte = sb[128 + g * gstride + 32 * c + 4 * i + t];
                    let mut code = (byte >> (4 * h)) & 15;
                    if five.is_some() {
                        let hb = sb[128 + g * gstride + 256 + 32 * (c / 4) + 4 * i + t];
                        code |= ((hb >> (c % 4 + 4 * h)) & 1) << 4;
                    }
                    dot += code as i32 * xq[64 * g + 32 * h + 4 * c + t] as i8 as i32;
                }
            }
            sumi += sc * dot;
        }
        let d = f16_at(sb, 2 * i);
        let dmin = f16_at(sb, 16 + 2 * i);
        *acc -= (dmin * da) * summ as f32;
        *acc += (d * da) * sumi as f32;
    }
}

/// One packed Q6_K super-block times one activation block.
fn portable_q6(sb: &[u8], ab: &[u8], acc: &mut [f32; GROUP]) {
    let da = f32::from_le_bytes([ab[0], ab[1], ab[2], ab[3]]);
    let xq = &ab[ACT_QS..ACT_QS + QK_K];
    for (i, acc) in acc.iter_mut().enumerate() {
        let mut sumi = 0i32;
        for j in 0..16 {
            let sc = sb[16 + 8 * j + i] as i8 as i32;
            // Sub-block j = 2p + h: nibble h of unit p's code registers.
            let (p, h) = (j / 2, j % 2);
            let base = 144 + 192 * p;
            let mut dot = 0i32;
            for v in 0..4 {
                for t in 0..4 {
                    let lo = (sb[base + 32 * v + 4 * i + t] >> (4 * h)) & 15;
                    let hi =
                        (sb[base + 128 + 32 * (v / 2) + 4 * i + t] >> (4 * (v % 2) + 2 * h)) & 3;
                    dot += (lo | (hi << 4)) as i32 * xq[32 * p + 16 * h + 4 * v + t] as i8 as i32;
                }
            }
            sumi += sc * (dot - 32 * i16_at(ab, ACT_BSUMS + 2 * j));
        }
        let d = f16_at(sb, 2 * i);
        *acc += (d * da) * sumi as f32;
    }
}
