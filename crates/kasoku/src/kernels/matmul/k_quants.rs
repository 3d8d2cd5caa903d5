//! Products on the K-quant formats (Q4_K, Q5_K, Q6_K): load-time repacking, Q8_K activations,
//! and the portable tile kernel. `k_quants_avx2.rs` holds the AVX2 kernels (4 activation rows
//! per tile) and `k_quants_vnni.rs` the AVX512-VNNI ones (8 rows per tile, used for `Isa::Avx2`
//! when the CPU has them); all three compute the same function bit for bit.
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

use super::{MatMulWeight, PackedBytes, Prepared};
use crate::kernels::simd::Isa;
use crate::quant::k_quants::{self as kq, QK_K};
use crate::quant::DType;

#[cfg(target_arch = "x86_64")]
#[path = "k_quants_avx2.rs"]
mod avx2;
#[cfg(target_arch = "x86_64")]
#[path = "k_quants_vnni.rs"]
mod vnni;

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

/// Quantizes `n` activation rows to Q8_K blocks (see the module documentation).
pub(crate) fn prepare(w: &MatMulWeight, x: &[f32], n: usize, isa: Isa) -> Prepared {
    let nb = w.cols / QK_K;
    let mut out = vec![0u8; n * nb * ACT_BLOCK];
    if nb == 0 {
        return Prepared::Bytes(out);
    }
    for (r, xr) in x.chunks_exact(w.cols).enumerate() {
        for (s, xs) in xr.chunks_exact(QK_K).enumerate() {
            let at = (s * n + r) * ACT_BLOCK;
            quantize_act_block(isa, xs, &mut out[at..at + ACT_BLOCK]);
        }
    }
    Prepared::Bytes(out)
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

/// Computes `tile[r][j - rows.start] = Σ_c x[r][c]·W[j][c]` for `r < n`, `j ∈ rows`, on the
/// kernel for `isa`.
pub(crate) fn compute_tile(
    w: &MatMulWeight,
    act: &Prepared,
    n: usize,
    rows: Range<usize>,
    tile: &mut [f32],
    isa: Isa,
) {
    let Prepared::Bytes(acts) = act else {
        unreachable!("K-quant formats prepare Q8_K activations")
    };
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
    SUMS.with(|cell| {
        let mut sums = cell.borrow_mut();
        for x0 in (0..n).step_by(XB) {
            let x1 = (x0 + XB).min(n);
            let xn = x1 - x0;
            // The running sums of every (row group, activation row), group-major.
            sums.clear();
            sums.resize((g1 - g0) * xn, [0.0; GROUP]);
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
    });
}

thread_local! {
    /// Per-thread running sums of a tile, reused across calls.
    static SUMS: std::cell::RefCell<Vec<[f32; GROUP]>> = const { std::cell::RefCell::new(Vec::new()) };
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::matmul::matmul;
    use crate::quant::k_quants::{quantize_row_q8_k, vec_dot, BlockQ8K};

    const DTYPES: [DType; 3] = [DType::Q4K, DType::Q5K, DType::Q6K];

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn f32(&mut self) -> f32 {
            (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        }
    }

    /// Random GGUF rows of `dtype`: random bytes, with finite random f16 scales.
    fn random_rows(dtype: DType, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
        let mut b: Vec<u8> = (0..rows * dtype.bytes_for(cols).unwrap())
            .map(|_| rng.next() as u8)
            .collect();
        for blk in b.chunks_exact_mut(dtype.block_bytes()) {
            let at: &[usize] = if dtype == DType::Q6K { &[208] } else { &[0, 2] };
            for &o in at {
                let v = f16::from_f32(rng.f32() * 0.05);
                blk[o..o + 2].copy_from_slice(&v.to_le_bytes());
            }
        }
        b
    }

    fn random_x(len: usize, rng: &mut Rng) -> Vec<f32> {
        (0..len).map(|_| rng.f32() * 2.0).collect()
    }

    /// GGML's dot of every (activation row, weight row) pair: `n × rows`.
    fn reference(
        dtype: DType,
        w: &[u8],
        rows: usize,
        cols: usize,
        x: &[f32],
        n: usize,
    ) -> Vec<f32> {
        let rb = dtype.bytes_for(cols).unwrap();
        let q: Vec<Vec<BlockQ8K>> = x.chunks_exact(cols).map(quantize_row_q8_k).collect();
        let mut y = vec![0f32; n * rows];
        for r in 0..n {
            for j in 0..rows {
                y[r * rows + j] = vec_dot(dtype, &w[j * rb..(j + 1) * rb], &q[r]);
            }
        }
        y
    }

    #[test]
    fn tiles_match_ggml_dot_bit_for_bit_on_every_path() {
        let mut rng = Rng(0x5eed);
        // A partial row group; one panel, and three (the last partial).
        for (rows, cols, dtype) in DTYPES
            .iter()
            .flat_map(|&d| [(21, 768, d), (21, (2 * PANEL + 3) * QK_K, d)])
        {
            let wb = random_rows(dtype, rows, cols, &mut rng);
            let w = MatMulWeight::new(dtype, rows, cols, &wb).unwrap();
            for n in [1, 2, 3, 4, 5, 7, 8, 9, 13] {
                let x = random_x(n * cols, &mut rng);
                let expect = reference(dtype, &wb, rows, cols, &x, n);
                let act = prepare(&w, &x, n, Isa::detect());
                for path in Isa::available() {
                    // Whole range, and a range that starts and ends inside row groups.
                    for range in [0..rows, 3..19, 8..16, 20..21] {
                        let len = range.len();
                        let mut tile = vec![f32::NAN; n * len];
                        compute_tile(&w, &act, n, range.clone(), &mut tile, path);
                        for r in 0..n {
                            for (k, j) in range.clone().enumerate() {
                                assert_eq!(
                                    tile[r * len + k].to_bits(),
                                    expect[r * rows + j].to_bits(),
                                    "{dtype} {path:?} n={n} r={r} j={j}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn the_layout_places_every_block_once() {
        for nb in [1, PANEL - 1, PANEL, PANEL + 1, 3 * PANEL + 5] {
            let (groups, pbb) = (3, 7);
            let mut seen = vec![false; groups * nb];
            for g in 0..groups {
                for s in 0..nb {
                    let at = block_offset(groups, nb, pbb, g, s);
                    assert_eq!(at % pbb, 0);
                    assert!(!std::mem::replace(&mut seen[at / pbb], true), "nb={nb}");
                }
            }
            assert!(seen.iter().all(|&b| b), "nb={nb}");
        }
    }

    /// Real weights: the first 20 rows of the first Q4_K, Q5_K and Q6_K matrices of the cached
    /// Qwen2.5-Coder-0.5B Q4_K_M file, when it is there (`shared/models/fetch.sh`).
    #[test]
    fn real_gguf_rows_match_ggml_dot() {
        let Some(home) = std::env::var_os("HOME") else {
            return;
        };
        let path = std::path::Path::new(&home)
            .join(".cache/kasoku/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf");
        let Ok(file) = crate::format::gguf::GgufFile::open(&path) else {
            return;
        };
        let mut rng = Rng(11);
        let mut seen = Vec::new();
        for info in file.tensor_infos() {
            if !DTYPES.contains(&info.dtype) || info.shape.len() != 2 || seen.contains(&info.dtype)
            {
                continue;
            }
            seen.push(info.dtype);
            let t = file.tensor(&info.name).unwrap();
            let (rows, cols) = (20.min(info.shape[0]), info.shape[1]);
            let wb = &t.data.as_slice()[..rows * info.dtype.bytes_for(cols).unwrap()];
            let w = MatMulWeight::new(info.dtype, rows, cols, wb).unwrap();
            let n = 3;
            let x = random_x(n * cols, &mut rng);
            let mut y = vec![0f32; n * rows];
            matmul(&w, &x, n, &mut y);
            assert_eq!(
                y,
                reference(info.dtype, wb, rows, cols, &x, n),
                "{}",
                info.name
            );
        }
        assert!(
            seen.contains(&DType::Q4K) && seen.contains(&DType::Q6K),
            "{seen:?}"
        );
    }

    #[test]
    fn simd_activation_quantizer_matches_the_scalar_one() {
        let mut rng = Rng(0xac7);
        let mut blocks: Vec<Vec<f32>> = Vec::new();
        for scale in [1e-30f32, 1e-3, 1.0, 3e4, 1e30] {
            blocks.push((0..QK_K).map(|_| rng.f32() * scale).collect());
        }
        // Ties: max 127 makes iscale −1, so the halves round to even.
        blocks.push(
            (0..QK_K)
                .map(|i| (i % 255) as f32 - 127.0 + 0.5 * (i % 2) as f32)
                .collect(),
        );
        blocks.push(
            (0..QK_K)
                .map(|i| if i == 77 { -3.0 } else { 0.0 })
                .collect(),
        );
        blocks.push(
            (0..QK_K)
                .map(|i| if i % 9 == 0 { 2.5 } else { -2.5 })
                .collect(),
        );
        blocks.push(vec![0.0; QK_K]);
        blocks.push(vec![-0.0; QK_K]);
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut b: Vec<f32> = (0..QK_K).map(|_| rng.f32()).collect();
            b[100] = bad;
            blocks.push(b);
        }
        for (k, xs) in blocks.iter().enumerate() {
            let mut expect = vec![0u8; ACT_BLOCK];
            write_act_block(&kq::quantize_block_q8_k(xs), &mut expect);
            for isa in Isa::available() {
                let mut got = vec![0xA5u8; ACT_BLOCK];
                quantize_act_block(isa, xs, &mut got);
                assert_eq!(got, expect, "block {k} {isa:?}");
            }
        }
    }

    #[test]
    fn zero_columns_give_zeros() {
        for dtype in DTYPES {
            let w = MatMulWeight::new(dtype, 5, 0, &[]).unwrap();
            let mut y = vec![1f32; 2 * 5];
            matmul(&w, &[], 2, &mut y);
            assert!(y.iter().all(|&v| v == 0.0));
        }
    }

    #[test]
    fn extreme_codes_and_scales_do_not_overflow() {
        // Every code and scale at its maximum, activations all at ±127: the 16-bit partial sums
        // are at their largest.
        let (rows, cols) = (8, 512);
        for dtype in DTYPES {
            for fill in [0xFFu8, 0x80, 0x7F] {
                let mut wb = vec![fill; rows * dtype.bytes_for(cols).unwrap()];
                for blk in wb.chunks_exact_mut(dtype.block_bytes()) {
                    let at: &[usize] = if dtype == DType::Q6K { &[208] } else { &[0, 2] };
                    for &o in at {
                        blk[o..o + 2].copy_from_slice(&f16::from_f32(0.01).to_le_bytes());
                    }
                }
                let w = MatMulWeight::new(dtype, rows, cols, &wb).unwrap();
                for xv in [1.0f32, -1.0] {
                    let x = vec![xv; 3 * cols];
                    let expect = reference(dtype, &wb, rows, cols, &x, 3);
                    let act = prepare(&w, &x, 3, Isa::detect());
                    for path in Isa::available() {
                        let mut y = vec![0f32; 3 * rows];
                        compute_tile(&w, &act, 3, 0..rows, &mut y, path);
                        assert_eq!(y, expect, "{dtype} fill={fill:#x} x={xv} {path:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn matmul_matches_dequantized_product() {
        let mut rng = Rng(42);
        let (rows, cols) = (37, 512);
        for dtype in DTYPES {
            let wb = random_rows(dtype, rows, cols, &mut rng);
            let w = MatMulWeight::new(dtype, rows, cols, &wb).unwrap();
            let rb = dtype.bytes_for(cols).unwrap();
            let mut wf = vec![0f32; rows * cols];
            for j in 0..rows {
                crate::quant::dequantize(
                    dtype,
                    &wb[j * rb..(j + 1) * rb],
                    &mut wf[j * cols..(j + 1) * cols],
                );
            }
            for n in [1, 2, 3, 4, 8, 16, 64, 100] {
                let x = random_x(n * cols, &mut rng);
                let mut y = vec![0f32; n * rows];
                matmul(&w, &x, n, &mut y);
                let exact = reference(dtype, &wb, rows, cols, &x, n);
                assert_eq!(y, exact, "{dtype} n={n}: not GGML's dot");
                for r in 0..n {
                    let xr = &x[r * cols..(r + 1) * cols];
                    let q = quantize_row_q8_k(xr);
                    for j in 0..rows {
                        let wr = &wf[j * cols..(j + 1) * cols];
                        let f: f64 = xr.iter().zip(wr).map(|(a, b)| *a as f64 * *b as f64).sum();
                        // Q8_K rounds each activation by at most |d|/2 of its block.
                        let bound: f64 = wr
                            .chunks_exact(QK_K)
                            .zip(&q)
                            .map(|(wb, qb)| {
                                wb.iter().map(|v| v.abs() as f64).sum::<f64>() * qb.d.abs() as f64
                                    / 2.0
                            })
                            .sum();
                        let err = (y[r * rows + j] as f64 - f).abs();
                        assert!(
                            err <= bound * 1.01 + 1e-4,
                            "{dtype} n={n} r={r} j={j}: err {err} bound {bound}"
                        );
                    }
                }
            }
        }
    }
}
