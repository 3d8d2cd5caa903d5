//! GGML's K-quant block formats (Q4_K, Q5_K, Q6_K) and their activation partner Q8_K: exact
//! byte layouts, reference dequantizers, and the Q8_K activation quantizer.
//!
//! Every block covers a super-block of [`QK_K`] = 256 values. Layouts (little-endian, as in
//! GGUF files):
//! - Q4_K (144 bytes): `d: f16`, `dmin: f16`, `scales: [u8; 12]` (eight 6-bit scales and eight
//!   6-bit mins, one pair per 32-value sub-block, see [`scale_min_k4`]), `qs: [u8; 128]`.
//!   Each 64-value group `g` uses `qs[32g..32g+32]`: the low nibbles are values `0..32` of the
//!   group (sub-block `2g`), the high nibbles values `32..64` (sub-block `2g+1`).
//!   Value = `d·scale·q − dmin·min`.
//! - Q5_K (176 bytes): as Q4_K plus `qh: [u8; 32]` (between `scales` and `qs`); bit `2g` of
//!   `qh[l]` is the fifth bit of value `l` of group `g`, bit `2g+1` that of value `32+l`.
//! - Q6_K (210 bytes): `ql: [u8; 128]`, `qh: [u8; 64]`, `scales: [i8; 16]` (one per 16 values),
//!   `d: f16`. Value = `d·scale·(q − 32)` with `q` six bits (see [`dequantize_q6_k`]).
//! - Q8_K (activations only, never stored in files): `d: f32`, `qs: [i8; 256]`,
//!   `bsums: [i16; 16]` (sums of each 16 consecutive `qs`).

use half::f16;

/// Values per K-quant super-block.
pub const QK_K: usize = 256;
/// Bytes of one Q4_K block.
pub const Q4K_BLOCK: usize = 144;
/// Bytes of one Q5_K block.
pub const Q5K_BLOCK: usize = 176;
/// Bytes of one Q6_K block.
pub const Q6K_BLOCK: usize = 210;

fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// Scale and min (6 bits each) of sub-block `j` (0..8) from the 12 packed bytes of a Q4_K or
/// Q5_K block: sub-blocks 0..4 keep their low 6 bits in bytes `j` (scale) and `j+4` (min);
/// sub-blocks 4..8 keep their low 4 bits as nibbles of byte `j+4` and their top 2 bits in the
/// top 2 bits of bytes `j-4` (scale) and `j` (min).
pub fn scale_min_k4(j: usize, scales: &[u8]) -> (u8, u8) {
    if j < 4 {
        (scales[j] & 63, scales[j + 4] & 63)
    } else {
        let sc = (scales[j + 4] & 0x0F) | ((scales[j - 4] >> 6) << 4);
        let m = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
        (sc, m)
    }
}

/// Inverse of [`scale_min_k4`]: packs eight 6-bit scales and mins into 12 bytes.
pub fn pack_scale_min_k4(scales: &[u8; 8], mins: &[u8; 8]) -> [u8; 12] {
    let mut out = [0u8; 12];
    for j in 0..4 {
        out[j] = (scales[j] & 63) | ((scales[j + 4] >> 4) << 6);
        out[j + 4] = (mins[j] & 63) | ((mins[j + 4] >> 4) << 6);
        out[j + 8] = (scales[j + 4] & 0x0F) | ((mins[j + 4] & 0x0F) << 4);
    }
    out
}

fn check_len(name: &str, bytes: &[u8], block: usize, out: &[f32]) {
    assert!(
        out.len().is_multiple_of(QK_K) && bytes.len() == out.len() / QK_K * block,
        "{name}: {} bytes for {} values",
        bytes.len(),
        out.len()
    );
}

/// Dequantizes Q4_K blocks: `out.len()` must be a multiple of 256 and `bytes` exactly its blocks.
pub fn dequantize_q4_k(bytes: &[u8], out: &mut [f32]) {
    check_len("dequantize_q4_k", bytes, Q4K_BLOCK, out);
    for (b, y) in bytes
        .chunks_exact(Q4K_BLOCK)
        .zip(out.chunks_exact_mut(QK_K))
    {
        let d = f16_at(b, 0);
        let dmin = f16_at(b, 2);
        let scales = &b[4..16];
        let qs = &b[16..144];
        for g in 0..4 {
            let (s1, m1) = scale_min_k4(2 * g, scales);
            let (s2, m2) = scale_min_k4(2 * g + 1, scales);
            let (d1, m1) = (d * s1 as f32, dmin * m1 as f32);
            let (d2, m2) = (d * s2 as f32, dmin * m2 as f32);
            let q = &qs[32 * g..32 * g + 32];
            let y = &mut y[64 * g..64 * g + 64];
            for l in 0..32 {
                y[l] = d1 * (q[l] & 0x0F) as f32 - m1;
                y[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
            }
        }
    }
}

/// Dequantizes Q5_K blocks: `out.len()` must be a multiple of 256 and `bytes` exactly its blocks.
pub fn dequantize_q5_k(bytes: &[u8], out: &mut [f32]) {
    check_len("dequantize_q5_k", bytes, Q5K_BLOCK, out);
    for (b, y) in bytes
        .chunks_exact(Q5K_BLOCK)
        .zip(out.chunks_exact_mut(QK_K))
    {
        let d = f16_at(b, 0);
        let dmin = f16_at(b, 2);
        let scales = &b[4..16];
        let qh = &b[16..48];
        let qs = &b[48..176];
        for g in 0..4 {
            let (s1, m1) = scale_min_k4(2 * g, scales);
            let (s2, m2) = scale_min_k4(2 * g + 1, scales);
            let (d1, m1) = (d * s1 as f32, dmin * m1 as f32);
            let (d2, m2) = (d * s2 as f32, dmin * m2 as f32);
            let q = &qs[32 * g..32 * g + 32];
            let y = &mut y[64 * g..64 * g + 64];
            for l in 0..32 {
                let h1 = ((qh[l] >> (2 * g)) & 1) << 4;
                let h2 = ((qh[l] >> (2 * g + 1)) & 1) << 4;
                y[l] = d1 * ((q[l] & 0x0F) | h1) as f32 - m1;
                y[l + 32] = d2 * ((q[l] >> 4) | h2) as f32 - m2;
            }
        }
    }
}

/// The unsigned 6-bit quant (0..64) of value `i` (0..256) of a Q6_K block, and its sub-block
/// (0..16). Each 128-value half `h` uses `ql[64h..64h+64]` and `qh[32h..32h+32]`: value
/// `32k + l` (k = 0..4, l = 0..32) has low nibble from `ql[64h + l + 32(k&1)]` (low nibble for
/// k < 2, high for k ≥ 2) and high 2 bits from bits `2k..2k+2` of `qh[32h + l]`.
pub fn q6_k_quant(block: &[u8], i: usize) -> u8 {
    let (h, r) = (i / 128, i % 128);
    let (k, l) = (r / 32, r % 32);
    let ql = block[64 * h + l + 32 * (k & 1)];
    let lo = if k < 2 { ql & 0x0F } else { ql >> 4 };
    let hi = (block[128 + 32 * h + l] >> (2 * k)) & 3;
    lo | (hi << 4)
}

/// Dequantizes Q6_K blocks: `out.len()` must be a multiple of 256 and `bytes` exactly its blocks.
pub fn dequantize_q6_k(bytes: &[u8], out: &mut [f32]) {
    check_len("dequantize_q6_k", bytes, Q6K_BLOCK, out);
    for (b, y) in bytes
        .chunks_exact(Q6K_BLOCK)
        .zip(out.chunks_exact_mut(QK_K))
    {
        let d = f16_at(b, 208);
        for (i, v) in y.iter_mut().enumerate() {
            let sc = b[192 + i / 16] as i8;
            let q = q6_k_quant(b, i) as i32 - 32;
            *v = d * sc as f32 * q as f32;
        }
    }
}

/// One Q8_K activation block: `value[i] ≈ d · qs[i]`.
#[derive(Clone, Debug, PartialEq)]
pub struct BlockQ8K {
    pub d: f32,
    pub qs: [i8; QK_K],
    /// `bsums[k] = Σ qs[16k..16k+16]`.
    pub bsums: [i16; QK_K / 16],
}

/// Rounds to the nearest integer, ties to even, for |v| < 2^22 (GGML's `nearest_int`): adding
/// 1.5·2^23 leaves no fraction bits, so the addition itself rounds.
#[inline]
fn nearest_int(v: f32) -> i32 {
    ((v + 12_582_912.0) - 12_582_912.0) as i32
}

/// Quantizes 256 values to Q8_K exactly as GGML's `quantize_row_q8_K_ref`: the value of
/// largest magnitude `max` maps to −127 (`d = −max/127`), others round half to even and are
/// clamped to 127 (whatever the sign of `max`); an all-zero block gets `d = 0`.
pub fn quantize_block_q8_k(x: &[f32]) -> BlockQ8K {
    assert_eq!(x.len(), QK_K, "quantize_block_q8_k: need 256 values");
    // The first value of largest magnitude (GGML's scan keeps the first on ties); NaNs are
    // skipped as in GGML. Written as a max-reduction, then a search, so that it vectorizes.
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let max = x.iter().copied().find(|v| v.abs() == amax).unwrap_or(0.0);
    let mut out = BlockQ8K {
        d: 0.0,
        qs: [0; QK_K],
        bsums: [0; QK_K / 16],
    };
    if amax == 0.0 {
        return out;
    }
    let iscale = -127.0 / max;
    for (q, &v) in out.qs.iter_mut().zip(x) {
        *q = nearest_int(iscale * v).clamp(-128, 127) as i8;
    }
    for (s, q) in out.bsums.iter_mut().zip(out.qs.chunks_exact(16)) {
        *s = q.iter().map(|&v| v as i16).sum();
    }
    out.d = 1.0 / iscale;
    out
}

/// Quantizes a row (length a multiple of 256) to Q8_K blocks.
pub fn quantize_row_q8_k(x: &[f32]) -> Vec<BlockQ8K> {
    assert_eq!(
        x.len() % QK_K,
        0,
        "quantize_row_q8_k: length not a multiple of 256"
    );
    x.chunks_exact(QK_K).map(quantize_block_q8_k).collect()
}

/// Dequantizes Q8_K blocks (`d · qs`).
pub fn dequantize_q8_k(blocks: &[BlockQ8K], out: &mut [f32]) {
    assert_eq!(
        out.len(),
        blocks.len() * QK_K,
        "dequantize_q8_k: size mismatch"
    );
    for (b, y) in blocks.iter().zip(out.chunks_exact_mut(QK_K)) {
        for (v, &q) in y.iter_mut().zip(&b.qs) {
            *v = b.d * q as f32;
        }
    }
}

/// Reference dot products of K-quant weight rows with Q8_K activations, as GGML's
/// `vec_dot_q*_K_q8_K` define them: exact integer sums per super-block, combined in f32 as
/// `acc -= (dmin·d_x)·Σ_j min_j·(bsums_2j + bsums_2j+1)` (Q4_K, Q5_K) then
/// `acc += (d·d_x)·Σ_j scale_j·Σ q·x` (Q6_K: `Σ_j scale_j·(Σ q·x − 32·bsums_j)` over 16-value
/// sub-blocks), each product and sum rounded separately. The fast kernels reproduce exactly
/// this arithmetic.
pub fn vec_dot(dtype: crate::quant::DType, w: &[u8], x: &[BlockQ8K]) -> f32 {
    use crate::quant::DType;
    let bb = dtype.block_bytes();
    assert_eq!(w.len(), x.len() * bb, "vec_dot: size mismatch");
    let mut acc = 0f32;
    for (b, a) in w.chunks_exact(bb).zip(x) {
        match dtype {
            DType::Q4K | DType::Q5K => {
                let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
                let (qs, qh) = match dtype {
                    DType::Q4K => (&b[16..144], None),
                    _ => (&b[48..176], Some(&b[16..48])),
                };
                let (mut sumi, mut summ) = (0i32, 0i32);
                for j in 0..8 {
                    let (sc, mn) = scale_min_k4(j, &b[4..16]);
                    summ += mn as i32 * (a.bsums[2 * j] as i32 + a.bsums[2 * j + 1] as i32);
                    let mut dot = 0i32;
                    for v in 32 * j..32 * j + 32 {
                        let (g, l) = (v / 64, v % 64);
                        let byte = qs[32 * g + l % 32];
                        let mut q = if l < 32 { byte & 15 } else { byte >> 4 };
                        if let Some(qh) = qh {
                            q |= ((qh[l % 32] >> (2 * g + l / 32)) & 1) << 4;
                        }
                        dot += q as i32 * a.qs[v] as i32;
                    }
                    sumi += sc as i32 * dot;
                }
                acc -= (dmin * a.d) * summ as f32;
                acc += (d * a.d) * sumi as f32;
            }
            DType::Q6K => {
                let d = f16_at(b, 208);
                let mut sumi = 0i32;
                for k in 0..16 {
                    let sc = b[192 + k] as i8 as i32;
                    let dot: i32 = (16 * k..16 * k + 16)
                        .map(|v| q6_k_quant(b, v) as i32 * a.qs[v] as i32)
                        .sum();
                    sumi += sc * (dot - 32 * a.bsums[k] as i32);
                }
                acc += (d * a.d) * sumi as f32;
            }
            _ => panic!("vec_dot: {dtype} is not a K-quant format"),
        }
    }
    acc
}

#[cfg(test)]
#[allow(clippy::needless_range_loop)] // index loops mirror GGML's layout descriptions
mod tests {
    use super::*;

    use crate::test_util::Rng;

    fn put_f16(b: &mut [u8], at: usize, v: f32) {
        b[at..at + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
    }

    #[test]
    fn scale_min_packing_round_trips_all_six_bit_values() {
        // Each (scale, min) value 0..64 in every sub-block position, mixed with neighbours that
        // have all bits set so a leak between fields would show.
        for v in 0..64u8 {
            for j in 0..8 {
                let mut sc = [63u8; 8];
                let mut mn = [63u8; 8];
                sc[j] = v;
                mn[j] = 63 - v;
                let packed = pack_scale_min_k4(&sc, &mn);
                for k in 0..8 {
                    assert_eq!(
                        scale_min_k4(k, &packed),
                        (sc[k], mn[k]),
                        "v={v} j={j} k={k}"
                    );
                }
            }
        }
    }

    #[test]
    fn scale_min_k4_reads_ggml_bit_positions() {
        // Hand-built: sub-block 5 scale = 0b10_0110 (38), min = 0b01_1001 (25).
        let mut s = [0u8; 12];
        s[9] = 0b1001_0110; // low nibbles: scale 0110, min 1001
        s[1] = 0b10 << 6; // scale top bits live in byte j-4
        s[5] = 0b01 << 6; // min top bits live in byte j
        assert_eq!(scale_min_k4(5, &s), (38, 25));
        assert_eq!(scale_min_k4(1, &s), (0, 0)); // top bits are masked off for j < 4
        s[1] |= 0x3F;
        assert_eq!(scale_min_k4(1, &s), (63, 0));
    }

    #[test]
    fn q4_k_hand_built_block() {
        let mut b = [0u8; Q4K_BLOCK];
        put_f16(&mut b, 0, 0.5);
        put_f16(&mut b, 2, 0.25);
        let sc = [1, 2, 3, 4, 60, 61, 62, 63];
        let mn = [0, 10, 20, 30, 40, 50, 63, 5];
        b[4..16].copy_from_slice(&pack_scale_min_k4(&sc, &mn));
        for l in 0..128 {
            b[16 + l] = (l % 16) as u8 | (((l * 7) % 16) as u8) << 4;
        }
        let mut y = [0f32; QK_K];
        dequantize_q4_k(&b, &mut y);
        for g in 0..4 {
            for l in 0..32 {
                let lo = (32 * g + l) % 16;
                let hi = ((32 * g + l) * 7) % 16;
                let e_lo = 0.5 * sc[2 * g] as f32 * lo as f32 - 0.25 * mn[2 * g] as f32;
                let e_hi = 0.5 * sc[2 * g + 1] as f32 * hi as f32 - 0.25 * mn[2 * g + 1] as f32;
                assert_eq!(y[64 * g + l], e_lo, "g={g} l={l}");
                assert_eq!(y[64 * g + 32 + l], e_hi, "g={g} l={l}");
            }
        }
    }

    #[test]
    fn q5_k_hand_built_block() {
        let mut b = [0u8; Q5K_BLOCK];
        put_f16(&mut b, 0, 2.0);
        put_f16(&mut b, 2, 1.0);
        let sc = [1, 1, 1, 1, 1, 1, 1, 1];
        let mn = [0, 1, 2, 3, 4, 5, 6, 7];
        b[4..16].copy_from_slice(&pack_scale_min_k4(&sc, &mn));
        // Value i gets quant (i % 32): low nibble in qs, fifth bit in qh.
        let mut expect = [0f32; QK_K];
        for i in 0..QK_K {
            let q = (i % 32) as u8;
            let (g, r) = (i / 64, i % 64);
            let l = r % 32;
            let upper = r >= 32;
            let byte = &mut b[48 + 32 * g + l];
            *byte |= if upper { (q & 15) << 4 } else { q & 15 };
            if q >= 16 {
                b[16 + l] |= 1 << (2 * g + upper as usize);
            }
            let sub = 2 * g + upper as usize;
            expect[i] = 2.0 * q as f32 - mn[sub] as f32;
        }
        let mut y = [0f32; QK_K];
        dequantize_q5_k(&b, &mut y);
        assert_eq!(y, expect);
    }

    #[test]
    fn q6_k_hand_built_block() {
        let mut b = [0u8; Q6K_BLOCK];
        put_f16(&mut b, 208, 0.125);
        for k in 0..16 {
            b[192 + k] = (k as i32 * 9 - 70) as i8 as u8; // negative and positive scales
        }
        // Value i gets quant q = (i * 5) % 64, written in GGML's order.
        for i in 0..QK_K {
            let q = ((i * 5) % 64) as u8;
            let (h, r) = (i / 128, i % 128);
            let (k, l) = (r / 32, r % 32);
            let ql = &mut b[64 * h + l + 32 * (k & 1)];
            *ql |= if k < 2 { q & 15 } else { (q & 15) << 4 };
            b[128 + 32 * h + l] |= (q >> 4) << (2 * k);
        }
        let mut y = [0f32; QK_K];
        dequantize_q6_k(&b, &mut y);
        for i in 0..QK_K {
            let q = ((i * 5) % 64) as i32 - 32;
            let sc = (i / 16) as i32 * 9 - 70;
            assert_eq!(y[i], 0.125 * sc as f32 * q as f32, "i={i}");
        }
    }

    #[test]
    fn q8_k_matches_ggml_rules() {
        let mut rng = Rng(7);
        let mut x: Vec<f32> = (0..QK_K).map(|_| rng.f32() * 3.0).collect();
        x[17] = 5.0; // largest magnitude, positive: maps to -127
        x[18] = -5.0 * 0.5; // exactly half: -127 * -0.5 = 63.5 rounds to even 64
        let b = quantize_block_q8_k(&x);
        assert_eq!(b.qs[17], -127);
        assert_eq!(b.d, 1.0 / (-127.0 / 5.0));
        assert!(b.d < 0.0);
        assert_eq!(b.qs[18], 64);
        for i in 0..QK_K {
            let exact = x[i] / b.d;
            assert!((b.qs[i] as f32 - exact).abs() <= 0.5 + 1e-4, "i={i}");
        }
        for k in 0..16 {
            let s: i32 = b.qs[16 * k..16 * k + 16].iter().map(|&v| v as i32).sum();
            assert_eq!(b.bsums[k] as i32, s);
        }
        let zero = quantize_block_q8_k(&[0.0; QK_K]);
        assert_eq!(zero.d, 0.0);
        assert!(zero.qs.iter().all(|&q| q == 0) && zero.bsums.iter().all(|&s| s == 0));
        // Negative maximum: also maps to -127, with a positive d.
        let mut y = vec![0.5f32; QK_K];
        y[3] = -2.0;
        let b = quantize_block_q8_k(&y);
        assert_eq!(b.qs[3], -127);
        assert!(b.d > 0.0);
        assert_eq!(b.qs[0], 32); // 0.5 · 63.5 = 31.75
        let mut back = vec![0f32; QK_K];
        dequantize_q8_k(&[b], &mut back);
        assert!((back[3] + 2.0).abs() < 1e-6);
    }

    #[test]
    fn q8_k_picks_the_first_of_tied_maxima_and_rounds_like_ggml() {
        // GGML keeps the first value of largest magnitude: here -3 (so 3 maps to +127).
        let mut x = vec![0.25f32; QK_K];
        x[5] = -3.0;
        x[9] = 3.0;
        let b = quantize_block_q8_k(&x);
        assert_eq!((b.qs[5], b.qs[9]), (-127, 127));
        // A scalar transcription of GGML's loop agrees on random rows.
        let mut rng = Rng(3);
        for _ in 0..50 {
            let x: Vec<f32> = (0..QK_K).map(|_| rng.f32() * 10.0).collect();
            let (mut max, mut amax) = (0f32, 0f32);
            for &v in &x {
                if v.abs() > amax {
                    amax = v.abs();
                    max = v;
                }
            }
            let iscale = -127.0 / max;
            let b = quantize_block_q8_k(&x);
            for (q, v) in b.qs.iter().zip(&x) {
                assert_eq!(*q as i32, ((iscale * v).round_ties_even() as i32).min(127));
            }
        }
        for v in [0.5f32, 1.5, 2.5, -0.5, -1.5, 126.5, -126.5, 3.4999998] {
            assert_eq!(nearest_int(v), v.round_ties_even() as i32, "{v}");
        }
    }

    #[test]
    fn dequantizers_accept_random_blocks_of_several_blocks() {
        let mut rng = Rng(99);
        for (block, f) in [
            (Q4K_BLOCK, dequantize_q4_k as fn(&[u8], &mut [f32])),
            (Q5K_BLOCK, dequantize_q5_k),
            (Q6K_BLOCK, dequantize_q6_k),
        ] {
            let mut bytes = rng.bytes(3 * block);
            // Keep f16 scales finite.
            for c in bytes.chunks_exact_mut(block) {
                if block == Q6K_BLOCK {
                    put_f16(c, 208, 0.01);
                } else {
                    put_f16(c, 0, 0.01);
                    put_f16(c, 2, 0.02);
                }
            }
            let mut y = vec![0f32; 3 * QK_K];
            f(&bytes, &mut y);
            assert!(y.iter().all(|v| v.is_finite()));
            // Block 1 alone gives the same values as inside the row.
            let mut one = vec![0f32; QK_K];
            f(&bytes[block..2 * block], &mut one);
            assert_eq!(&y[QK_K..2 * QK_K], &one[..]);
        }
    }
}
