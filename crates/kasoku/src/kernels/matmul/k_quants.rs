//! Products on the K-quant formats (Q4_K, Q5_K, Q6_K): load-time repacking, Q8_K activations,
//! and the portable tile kernel (the AVX2 one is in `k_quants_avx2.rs`; both compute the same
//! function bit for bit).
//!
//! **Packed layout.** Weight rows are taken in groups of [`GROUP`] = 8 (the last group padded
//! with zero rows, whose scales 0 make them contribute nothing). For each group and each
//! 256-value super-block column, the eight rows' blocks are stored together ("packed
//! super-block", 8 × the GGUF block size). Inside it the values are stored in *packed order*:
//! position `p` of a unit of `U` values (U = 64 for Q4_K/Q5_K, 32 for Q6_K) holds the value
//! [`natural_index`]`(U, p)`, chosen so that each 4-byte lane chunk holds two values of
//! sub-block `2k` followed by two of sub-block `2k+1`. A `maddubs` of a 32-byte code register
//! (lane `i` = row `i`) with four activation bytes broadcast to every lane then gives, per row,
//! one 16-bit partial sum for each of the two sub-blocks, and one `madd` with the vector of
//! (scale `2k`, scale `2k+1`) pairs applies the scales of all eight rows at once. Activations
//! are stored in the same packed order (see [`prepare`]), so no horizontal sums are needed and
//! every weight byte is read once per call, for all activation rows.
//!
//! - Q4_K (1152 bytes): `d[8]` f16, `dmin[8]` f16; 96 bytes of 6-bit scales and mins (see
//!   [`scale_pos`]); then per 64-value group `g`, eight 32-byte code registers: register `c`,
//!   lane `i`, byte `t` holds positions `64g + 8c + t` (low nibble) and `64g + 8c + 4 + t`
//!   (high nibble) of row `i`.
//! - Q5_K (1408 bytes): as Q4_K, but each group is followed by two 32-byte fifth-bit registers:
//!   register `c / 4`, lane `i`, byte `t`, bit `c % 4` (low nibble) or `4 + c % 4` (high nibble).
//! - Q6_K (1680 bytes): `d[8]` f16; per pair `k` of 16-value sub-blocks, 16 bytes of i8 scales
//!   (row `i`: bytes `2i`, `2i+1` = scales `2k`, `2k+1`); then per 32-value unit `k`, four code
//!   registers (register `v`: positions `32k + 8v + t` / `32k + 8v + 4 + t`) and two registers
//!   of top bits (register `v / 2`, shift `4(v % 2)` for the low nibble, `+2` for the high one).
//!
//! **Activations** become Q8_K blocks (GGML's quantizer) of [`ACT_BLOCK`] bytes: `d` (f32), the
//! 256 codes in packed order, `bsums[16]` (i16, natural order) and the sums of each 32 codes
//! `bsums32[8]` (i16).
//!
//! **Per super-block**, each (weight row, activation row) pair does, in this order,
//! `acc -= (dmin·d_x)·Σ_j min_j·bsums32_j` (Q4_K, Q5_K) and `acc += (d·d_x)·sumi` with the
//! exact integer `sumi = Σ_j scale_j·Σ q·x` (Q6_K: `Σ_j scale_j·(Σ q·x − 32·bsums_j)`), products
//! and sums rounded separately (no fused multiply-add): the same arithmetic as
//! [`crate::quant::k_quants::vec_dot`], so every path agrees bit for bit and an activation
//! row's result does not depend on how many rows share the call.

use std::ops::Range;

use half::f16;

use super::{Isa, MatMulWeight, Prepared};
use crate::quant::k_quants::{self as kq, QK_K};
use crate::quant::DType;

#[cfg(target_arch = "x86_64")]
#[path = "k_quants_avx2.rs"]
mod avx2;

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

/// Bytes of one packed super-block (eight rows).
pub(crate) fn packed_block_bytes(dtype: DType) -> usize {
    GROUP * dtype.block_bytes()
}

/// Values per packing unit: 64 for Q4_K/Q5_K (a pair of 32-value sub-blocks), 32 for Q6_K.
pub(crate) fn unit(dtype: DType) -> usize {
    match dtype {
        DType::Q4K | DType::Q5K => 64,
        DType::Q6K => 32,
        _ => unreachable!("not a K-quant format: {dtype}"),
    }
}

/// The natural (GGUF) index of the value at packed position `p` (0..256) for units of `u`
/// values: 4-byte chunk `q = (p mod u) / 4`, byte `t = p mod 4` holds value `2q + (t & 1)` of
/// the unit's first half (t < 2) or second half (t ≥ 2).
pub(crate) fn natural_index(u: usize, p: usize) -> usize {
    let (base, r) = (p - p % u, p % u);
    let (q, t) = (r / 4, r % 4);
    base + (u / 2) * (t >> 1) + 2 * q + (t & 1)
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
pub(crate) fn pack(dtype: DType, rows: usize, cols: usize, bytes: &[u8]) -> Vec<u8> {
    let bb = dtype.block_bytes();
    let nb = cols / QK_K;
    let groups = rows.div_ceil(GROUP);
    let pbb = packed_block_bytes(dtype);
    let mut out = vec![0u8; groups * nb * pbb];
    for (gi, grp) in out.chunks_exact_mut(nb * pbb).enumerate() {
        for (s, sb) in grp.chunks_exact_mut(pbb).enumerate() {
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
    out
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
    for p in 0..QK_K {
        let code = q45_code(qs, qh, natural_index(64, p));
        let (g, c, h, t) = (p / 64, (p % 64) / 8, (p % 8) / 4, p % 4);
        let at = 128 + g * gstride + 32 * c + 4 * i + t;
        sb[at] |= (code & 15) << (4 * h);
        if qh.is_some() {
            let hb = 128 + g * gstride + 256 + 32 * (c / 4) + 4 * i + t;
            sb[hb] |= (code >> 4) << (c % 4 + 4 * h);
        }
    }
}

fn pack_q6(blk: &[u8], i: usize, sb: &mut [u8]) {
    sb[2 * i..2 * i + 2].copy_from_slice(&blk[208..210]);
    for k in 0..8 {
        sb[16 + 16 * k + 2 * i] = blk[192 + 2 * k];
        sb[16 + 16 * k + 2 * i + 1] = blk[192 + 2 * k + 1];
    }
    for p in 0..QK_K {
        let code = kq::q6_k_quant(blk, natural_index(32, p));
        let (k, v, h, t) = (p / 32, (p % 32) / 8, (p % 8) / 4, p % 4);
        let base = 144 + 192 * k;
        sb[base + 32 * v + 4 * i + t] |= (code & 15) << (4 * h);
        sb[base + 128 + 32 * (v / 2) + 4 * i + t] |= (code >> 4) << (4 * (v % 2) + 2 * h);
    }
}

/// Quantizes `n` activation rows to Q8_K blocks in the packed order of `w`'s format.
pub(crate) fn prepare(w: &MatMulWeight, x: &[f32], n: usize) -> Prepared {
    let u = unit(w.dtype);
    let nb = w.cols / QK_K;
    let mut out = vec![0u8; n * nb * ACT_BLOCK];
    for (blk, xs) in out.chunks_exact_mut(ACT_BLOCK).zip(x.chunks_exact(QK_K)) {
        let q = kq::quantize_block_q8_k(xs);
        blk[0..4].copy_from_slice(&q.d.to_le_bytes());
        for p in 0..QK_K {
            blk[ACT_QS + p] = q.qs[natural_index(u, p)] as u8;
        }
        for (k, s) in q.bsums.iter().enumerate() {
            blk[ACT_BSUMS + 2 * k..ACT_BSUMS + 2 * k + 2].copy_from_slice(&s.to_le_bytes());
        }
        for k in 0..8 {
            let s = q.bsums[2 * k] + q.bsums[2 * k + 1];
            blk[ACT_BSUMS32 + 2 * k..ACT_BSUMS32 + 2 * k + 2].copy_from_slice(&s.to_le_bytes());
        }
    }
    Prepared::Bytes(out)
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
    if len == 0 {
        return;
    }
    let row_acts = nb * ACT_BLOCK;
    let mut buf = [[0f32; GROUP]; 4];
    for x0 in (0..n).step_by(XB) {
        let x1 = (x0 + XB).min(n);
        for g in rows.start / GROUP..rows.end.div_ceil(GROUP) {
            let wg = &w.packed[g * nb * pbb..(g + 1) * nb * pbb];
            let (j0, j1) = (
                (g * GROUP).max(rows.start),
                (g * GROUP + GROUP).min(rows.end),
            );
            let mut r = x0;
            while r < x1 {
                let xr = (x1 - r).min(4);
                let a = &acts[r * row_acts..(r + xr) * row_acts];
                kernel(isa, w.dtype, wg, a, row_acts, &mut buf[..xr]);
                for (k, res) in buf[..xr].iter().enumerate() {
                    let dst = &mut tile[(r + k) * len..(r + k + 1) * len];
                    dst[j0 - rows.start..j1 - rows.start]
                        .copy_from_slice(&res[j0 - g * GROUP..j1 - g * GROUP]);
                }
                r += xr;
            }
        }
    }
}

/// One packed row group (`wg`, all super-blocks) times `out.len()` ≤ 4 activation rows
/// (`acts`, rows of `row_acts` bytes): `out[r][i]` = dot of activation row `r` and weight row `i`.
fn kernel(
    isa: Isa,
    dtype: DType,
    wg: &[u8],
    acts: &[u8],
    row_acts: usize,
    out: &mut [[f32; GROUP]],
) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Isa::Avx2` is only chosen when the CPU has AVX2, FMA and F16C; the slices hold
        // whole packed super-blocks and activation blocks (checked by the caller).
        Isa::Avx2 => unsafe { avx2::kernel(dtype, wg, acts, row_acts, out) },
        Isa::Portable => {
            let pbb = packed_block_bytes(dtype);
            for (r, o) in out.iter_mut().enumerate() {
                let a = &acts[r * row_acts..(r + 1) * row_acts];
                *o = [0.0; GROUP];
                for (sb, ab) in wg.chunks_exact(pbb).zip(a.chunks_exact(ACT_BLOCK)) {
                    match dtype {
                        DType::Q4K => portable_q45(sb, None, ab, o),
                        DType::Q5K => portable_q45(sb, Some(()), ab, o),
                        DType::Q6K => portable_q6(sb, ab, o),
                        _ => unreachable!("not a K-quant format: {dtype}"),
                    }
                }
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
            // Sub-block j = 2g + s: positions 64g + 4q + 2s + (0, 1) for q in 0..16.
            let (g, s) = (j / 2, j % 2);
            let mut dot = 0i32;
            for q in 0..16 {
                let (c, hn) = (q / 2, q % 2);
                for t in 2 * s..2 * s + 2 {
                    let byte = sb[128 + g * gstride + 32 * c + 4 * i + t];
                    let mut code = (byte >> (4 * hn)) & 15;
                    if five.is_some() {
                        let hb = sb[128 + g * gstride + 256 + 32 * (c / 4) + 4 * i + t];
                        code |= ((hb >> (c % 4 + 4 * hn)) & 1) << 4;
                    }
                    dot += code as i32 * xq[64 * g + 4 * q + t] as i8 as i32;
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
            let sc = sb[16 + 16 * (j / 2) + 2 * i + j % 2] as i8 as i32;
            // Sub-block j = 2k + s: positions 32k + 4q + 2s + (0, 1) for q in 0..8.
            let (k, s) = (j / 2, j % 2);
            let base = 144 + 192 * k;
            let mut dot = 0i32;
            for q in 0..8 {
                let (v, hn) = (q / 2, q % 2);
                for t in 2 * s..2 * s + 2 {
                    let lo = (sb[base + 32 * v + 4 * i + t] >> (4 * hn)) & 15;
                    let hi =
                        (sb[base + 128 + 32 * (v / 2) + 4 * i + t] >> (4 * (v % 2) + 2 * hn)) & 3;
                    dot += (lo | (hi << 4)) as i32 * xq[32 * k + 4 * q + t] as i8 as i32;
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
    use crate::kernels::matmul::{matmul, matmul_with};
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

    fn isas() -> Vec<Isa> {
        let mut v = vec![Isa::Portable];
        if Isa::detect() != Isa::Portable {
            v.push(Isa::detect());
        }
        v
    }

    #[test]
    fn natural_index_is_a_permutation_pairing_sub_blocks() {
        for u in [32, 64] {
            let mut seen = [false; QK_K];
            for p in 0..QK_K {
                let v = natural_index(u, p);
                assert!(!seen[v]);
                seen[v] = true;
                // Bytes 0, 1 of a chunk come from the unit's first half, bytes 2, 3 from its second.
                assert_eq!((v % u) / (u / 2), (p % 4) / 2, "u={u} p={p}");
            }
        }
    }

    #[test]
    fn tiles_match_ggml_dot_bit_for_bit_on_every_path() {
        let mut rng = Rng(0x5eed);
        let (rows, cols) = (21, 768); // a partial row group
        for dtype in DTYPES {
            let wb = random_rows(dtype, rows, cols, &mut rng);
            let w = MatMulWeight::new(dtype, rows, cols, &wb).unwrap();
            for n in [1, 2, 3, 4, 5, 7, 9] {
                let x = random_x(n * cols, &mut rng);
                let expect = reference(dtype, &wb, rows, cols, &x, n);
                let act = prepare(&w, &x, n);
                for isa in isas() {
                    // Whole range, and a range that starts and ends inside row groups.
                    for range in [0..rows, 3..19, 8..16, 20..21] {
                        let len = range.len();
                        let mut tile = vec![f32::NAN; n * len];
                        compute_tile(&w, &act, n, range.clone(), &mut tile, isa);
                        for r in 0..n {
                            for (k, j) in range.clone().enumerate() {
                                assert_eq!(
                                    tile[r * len + k].to_bits(),
                                    expect[r * rows + j].to_bits(),
                                    "{dtype} {isa:?} n={n} r={r} j={j}"
                                );
                            }
                        }
                    }
                }
            }
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
                    for isa in isas() {
                        let mut y = vec![0f32; 3 * rows];
                        matmul_with(&w, &x, 3, &mut y, isa);
                        assert_eq!(y, expect, "{dtype} fill={fill:#x} x={xv} {isa:?}");
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
