//! GGML's "legacy" 32-value block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) and the int8
//! activation blocks their dot products pair with (Q8_0, Q8_1): exact byte layouts, reference
//! dequantizers and round-to-nearest quantizers.
//!
//! Layouts (little-endian, as in GGUF files; `d` and `m` are IEEE f16):
//! - Q4_0 (18 bytes): `d`, `qs: [u8; 16]`. Value `j < 16` is `d·(qs[j] & 15) − 8d`, value
//!   `j + 16` is `d·((qs[j] >> 4) − 8)`: low nibbles hold the first 16 values.
//! - Q4_1 (20 bytes): `d`, `m`, `qs: [u8; 16]`. Value = `d·q + m`, nibbles as Q4_0.
//! - Q5_0 (22 bytes): `d`, `qh: u32`, `qs: [u8; 16]`. Bit `j` of `qh` is the fifth bit of value
//!   `j`; value = `d·(q − 16)`.
//! - Q5_1 (24 bytes): `d`, `m`, `qh: u32`, `qs: [u8; 16]`. Value = `d·q + m`.
//! - Q8_0 (34 bytes): `d`, `qs: [i8; 32]`. Value = `d·q`.
//! - Q8_1 (36 bytes, activations only): `d`, `s`, `qs: [i8; 32]` with `s = d·Σq`.

use half::f16;

/// Values per block of every legacy format.
pub const QK: usize = 32;
/// Bytes of one Q8_1 block (not a weight format, so not in [`super::DType`]).
pub const Q8_1_BLOCK: usize = 36;

/// Reads the f16 at `at`.
pub fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// Bit 4 (value 16) of the 5-bit code of value `j` in a Q5 block whose high bits are `qh`.
fn high_bit(qh: u32, j: usize) -> u8 {
    (((qh >> j) & 1) << 4) as u8
}

fn check(name: &str, bytes: &[u8], block: usize, out: &[f32]) {
    assert!(
        out.len().is_multiple_of(QK) && bytes.len() == out.len() / QK * block,
        "{name}: {} bytes for {} values",
        bytes.len(),
        out.len()
    );
}

/// The 32 unsigned 4- or 5-bit codes of a Q4/Q5 block, in value order.
fn codes(qs: &[u8], qh: Option<u32>) -> [u8; QK] {
    let mut q = [0u8; QK];
    for j in 0..16 {
        q[j] = qs[j] & 15;
        q[j + 16] = qs[j] >> 4;
        if let Some(h) = qh {
            q[j] |= high_bit(h, j);
            q[j + 16] |= high_bit(h, j + 16);
        }
    }
    q
}

/// The 32 codes of one Q4_0 / Q4_1 / Q5_0 / Q5_1 block (`dtype` given by its block size),
/// unsigned (0..16 or 0..32) before the offset or min is applied.
pub fn block_codes(block: &[u8]) -> [u8; QK] {
    match block.len() {
        18 => codes(&block[2..18], None),
        20 => codes(&block[4..20], None),
        22 => codes(
            &block[6..22],
            Some(u32::from_le_bytes([block[2], block[3], block[4], block[5]])),
        ),
        24 => codes(
            &block[8..24],
            Some(u32::from_le_bytes([block[4], block[5], block[6], block[7]])),
        ),
        n => panic!("block_codes: no 4/5-bit legacy block has {n} bytes"),
    }
}

/// Dequantizes Q4_0 blocks (`bytes.len() == out.len() / 32 * 18`).
pub fn dequantize_q4_0(bytes: &[u8], out: &mut [f32]) {
    check("dequantize_q4_0", bytes, 18, out);
    for (b, y) in bytes.chunks_exact(18).zip(out.chunks_exact_mut(QK)) {
        let d = f16_at(b, 0);
        for (o, q) in y.iter_mut().zip(block_codes(b)) {
            *o = d * (q as i32 - 8) as f32;
        }
    }
}

/// Dequantizes Q4_1 blocks (`bytes.len() == out.len() / 32 * 20`).
pub fn dequantize_q4_1(bytes: &[u8], out: &mut [f32]) {
    check("dequantize_q4_1", bytes, 20, out);
    for (b, y) in bytes.chunks_exact(20).zip(out.chunks_exact_mut(QK)) {
        let (d, m) = (f16_at(b, 0), f16_at(b, 2));
        for (o, q) in y.iter_mut().zip(block_codes(b)) {
            *o = d * q as f32 + m;
        }
    }
}

/// Dequantizes Q5_0 blocks (`bytes.len() == out.len() / 32 * 22`).
pub fn dequantize_q5_0(bytes: &[u8], out: &mut [f32]) {
    check("dequantize_q5_0", bytes, 22, out);
    for (b, y) in bytes.chunks_exact(22).zip(out.chunks_exact_mut(QK)) {
        let d = f16_at(b, 0);
        for (o, q) in y.iter_mut().zip(block_codes(b)) {
            *o = d * (q as i32 - 16) as f32;
        }
    }
}

/// Dequantizes Q5_1 blocks (`bytes.len() == out.len() / 32 * 24`).
pub fn dequantize_q5_1(bytes: &[u8], out: &mut [f32]) {
    check("dequantize_q5_1", bytes, 24, out);
    for (b, y) in bytes.chunks_exact(24).zip(out.chunks_exact_mut(QK)) {
        let (d, m) = (f16_at(b, 0), f16_at(b, 2));
        for (o, q) in y.iter_mut().zip(block_codes(b)) {
            *o = d * q as f32 + m;
        }
    }
}

/// Dequantizes Q8_0 blocks (`bytes.len() == out.len() / 32 * 34`).
pub fn dequantize_q8_0(bytes: &[u8], out: &mut [f32]) {
    check("dequantize_q8_0", bytes, 34, out);
    for (b, y) in bytes.chunks_exact(34).zip(out.chunks_exact_mut(QK)) {
        let d = f16_at(b, 0);
        for (o, &q) in y.iter_mut().zip(&b[2..34]) {
            *o = d * (q as i8) as f32;
        }
    }
}

/// Dequantizes Q8_1 blocks (`bytes.len() == out.len() / 32 * 36`); `s` is not needed.
pub fn dequantize_q8_1(bytes: &[u8], out: &mut [f32]) {
    check("dequantize_q8_1", bytes, Q8_1_BLOCK, out);
    for (b, y) in bytes.chunks_exact(Q8_1_BLOCK).zip(out.chunks_exact_mut(QK)) {
        let d = f16_at(b, 0);
        for (o, &q) in y.iter_mut().zip(&b[4..36]) {
            *o = d * (q as i8) as f32;
        }
    }
}

/// Quantizes 32 values to int8 with a shared scale, as GGML's reference does: `d = max|x| / 127`,
/// `q = round(x / d)` (ties away from zero). Returns `(d, q)`.
fn quantize_block_i8(x: &[f32]) -> (f32, [i8; QK]) {
    let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut q = [0i8; QK];
    for (o, v) in q.iter_mut().zip(x) {
        *o = (v * id).round() as i8;
    }
    (d, q)
}

/// Quantizes `x` (a multiple of 32 values) to Q8_0 blocks in `out` (`x.len() / 32 * 34` bytes).
pub fn quantize_q8_0(x: &[f32], out: &mut [u8]) {
    assert!(
        x.len().is_multiple_of(QK) && out.len() == x.len() / QK * 34,
        "quantize_q8_0: size mismatch"
    );
    for (xb, ob) in x.chunks_exact(QK).zip(out.chunks_exact_mut(34)) {
        let (d, q) = quantize_block_i8(xb);
        ob[0..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
        for (o, v) in ob[2..].iter_mut().zip(q) {
            *o = v as u8;
        }
    }
}

/// Quantizes `x` (a multiple of 32 values) to Q4_0 blocks in `out` (`x.len() / 32 * 18`
/// bytes) by GGML's reference rule: `d = m / −8` with `m` the value of largest magnitude (the
/// first of ties), codes `min(15, trunc(x/d + 8.5))`, so `m` itself gets code 0.
pub fn quantize_q4_0(x: &[f32], out: &mut [u8]) {
    assert!(
        x.len().is_multiple_of(QK) && out.len() == x.len() / QK * 18,
        "quantize_q4_0: size mismatch"
    );
    for (xb, ob) in x.chunks_exact(QK).zip(out.chunks_exact_mut(18)) {
        let (mut amax, mut max) = (0f32, 0f32);
        for &v in xb {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        ob[0..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
        let code = |v: f32| ((v * id + 8.5) as i8).min(15) as u8;
        for j in 0..16 {
            ob[2 + j] = code(xb[j]) | (code(xb[j + 16]) << 4);
        }
    }
}

/// Quantizes `x` (a multiple of 32 values) to Q8_1 blocks in `out` (`x.len() / 32 * 36` bytes):
/// as Q8_0, plus `s = d·Σq` (computed with the f32 `d`, then stored as f16, as GGML does).
pub fn quantize_q8_1(x: &[f32], out: &mut [u8]) {
    assert!(
        x.len().is_multiple_of(QK) && out.len() == x.len() / QK * Q8_1_BLOCK,
        "quantize_q8_1: size mismatch"
    );
    for (xb, ob) in x.chunks_exact(QK).zip(out.chunks_exact_mut(Q8_1_BLOCK)) {
        let (d, q) = quantize_block_i8(xb);
        let sum: i32 = q.iter().map(|&v| v as i32).sum();
        ob[0..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
        ob[2..4].copy_from_slice(&f16::from_f32(sum as f32 * d).to_le_bytes());
        for (o, v) in ob[4..].iter_mut().zip(q) {
            *o = v as u8;
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub use crate::test_util::Rng;

    /// `blocks` random blocks of a legacy format with finite scales of moderate size.
    pub fn random_blocks(rng: &mut Rng, block_bytes: usize, blocks: usize) -> Vec<u8> {
        let mut v = rng.bytes(block_bytes * blocks);
        for b in v.chunks_exact_mut(block_bytes) {
            b[0..2].copy_from_slice(&f16::from_f32(rng.f32() * 0.05).to_le_bytes());
            if block_bytes == 20 || block_bytes == 24 {
                b[2..4].copy_from_slice(&f16::from_f32(rng.f32() * 0.1).to_le_bytes());
            }
        }
        v
    }

    fn h(v: f32) -> [u8; 2] {
        f16::from_f32(v).to_le_bytes()
    }

    // Hand-built blocks: qs[j] = j | (15 - j) << 4, so value j (< 16) has code j and value
    // j + 16 has code 15 - j.
    fn nibbles() -> Vec<u8> {
        (0..16u8).map(|j| j | ((15 - j) << 4)).collect()
    }

    #[test]
    fn q4_0_block_by_hand() {
        let mut b = h(0.5).to_vec();
        b.extend(nibbles());
        let mut y = [0f32; 32];
        dequantize_q4_0(&b, &mut y);
        assert_eq!(y[0], -4.0); // code 0 → (0 - 8)·0.5
        assert_eq!(y[3], -2.5); // code 3
        assert_eq!(y[15], 3.5); // code 15
        assert_eq!(y[16], 3.5); // code 15 - 0
        assert_eq!(y[31], -4.0); // code 0
    }

    #[test]
    fn q4_1_block_by_hand() {
        let mut b = h(0.25).to_vec();
        b.extend(h(-1.0));
        b.extend(nibbles());
        let mut y = [0f32; 32];
        dequantize_q4_1(&b, &mut y);
        assert_eq!(y[0], -1.0);
        assert_eq!(y[5], 0.25);
        assert_eq!(y[16], 2.75);
        assert_eq!(y[30], -0.75);
    }

    #[test]
    fn q5_0_block_by_hand() {
        // High bits set for values 1 and 17 and 31.
        let qh: u32 = (1 << 1) | (1 << 17) | (1 << 31);
        let mut b = h(2.0).to_vec();
        b.extend(qh.to_le_bytes());
        b.extend(nibbles());
        let mut y = [0f32; 32];
        dequantize_q5_0(&b, &mut y);
        assert_eq!(y[0], -32.0); // code 0 → (0 - 16)·2
        assert_eq!(y[1], 2.0); // code 1 + 16 → 1·2
        assert_eq!(y[2], -28.0); // code 2
        assert_eq!(y[16], -2.0); // code 15
        assert_eq!(y[17], 28.0); // code 14 + 16
        assert_eq!(y[31], 0.0); // code 0 + 16
    }

    #[test]
    fn q5_1_block_by_hand() {
        let qh: u32 = 1 << 16;
        let mut b = h(1.0).to_vec();
        b.extend(h(0.5));
        b.extend(qh.to_le_bytes());
        b.extend(nibbles());
        let mut y = [0f32; 32];
        dequantize_q5_1(&b, &mut y);
        assert_eq!(y[0], 0.5);
        assert_eq!(y[15], 15.5);
        assert_eq!(y[16], 31.5); // 15 + 16
        assert_eq!(y[17], 14.5);
    }

    #[test]
    fn q8_0_and_q8_1_blocks_by_hand() {
        let q: Vec<u8> = (0..32).map(|j| (j as i8 - 16) as u8).collect();
        let mut b = h(0.5).to_vec();
        b.extend(&q);
        let mut y = [0f32; 32];
        dequantize_q8_0(&b, &mut y);
        assert_eq!(y[0], -8.0);
        assert_eq!(y[16], 0.0);
        assert_eq!(y[31], 7.5);
        let mut b1 = h(0.5).to_vec();
        b1.extend(h(-8.0));
        b1.extend(&q);
        let mut y1 = [0f32; 32];
        dequantize_q8_1(&b1, &mut y1);
        assert_eq!(y, y1);
    }

    #[test]
    fn q8_quantizers_round_trip_and_sum() {
        let mut rng = Rng(7);
        let x: Vec<f32> = (0..96).map(|_| rng.f32() * 3.0).collect();
        let mut b0 = vec![0u8; 3 * 34];
        let mut b1 = vec![0u8; 3 * 36];
        quantize_q8_0(&x, &mut b0);
        quantize_q8_1(&x, &mut b1);
        let (mut y0, mut y1) = (vec![0f32; 96], vec![0f32; 96]);
        dequantize_q8_0(&b0, &mut y0);
        dequantize_q8_1(&b1, &mut y1);
        for blk in 0..3 {
            let amax = x[blk * 32..blk * 32 + 32]
                .iter()
                .fold(0f32, |a, v| a.max(v.abs()));
            // The largest magnitude maps to ±127.
            assert!(b0[blk * 34 + 2..blk * 34 + 34]
                .iter()
                .any(|&q| (q as i8).unsigned_abs() == 127));
            let d = f16_at(&b1, blk * 36);
            let s = f16_at(&b1, blk * 36 + 2);
            let sum: i32 = b1[blk * 36 + 4..blk * 36 + 36]
                .iter()
                .map(|&q| q as i8 as i32)
                .sum();
            assert!(
                (s - sum as f32 * d).abs() <= 1e-3 * (1.0 + s.abs()),
                "s {s} vs {}",
                sum as f32 * d
            );
            for j in blk * 32..blk * 32 + 32 {
                assert!(
                    (x[j] - y0[j]).abs() <= amax / 127.0 * 0.51 + 1e-3,
                    "{} vs {}",
                    x[j],
                    y0[j]
                );
                assert_eq!(y0[j], y1[j]);
            }
        }
        // All-zero input gives d = 0 and zero codes, not NaN.
        let z = [0f32; 32];
        let mut bz = [0u8; 34];
        quantize_q8_0(&z, &mut bz);
        assert!(bz.iter().all(|&v| v == 0));
    }

    #[test]
    fn block_codes_match_dequantizers() {
        let mut rng = Rng(3);
        for (bb, deq) in [
            (18, dequantize_q4_0 as fn(&[u8], &mut [f32])),
            (20, dequantize_q4_1),
            (22, dequantize_q5_0),
            (24, dequantize_q5_1),
        ] {
            let b = random_blocks(&mut rng, bb, 1);
            let mut y = [0f32; 32];
            deq(&b, &mut y);
            let d = f16_at(&b, 0);
            let (m, off) = match bb {
                18 => (0.0, 8),
                22 => (0.0, 16),
                _ => (f16_at(&b, 2), 0),
            };
            for (v, q) in y.iter().zip(block_codes(&b)) {
                assert_eq!(*v, d * (q as i32 - off) as f32 + m);
            }
        }
    }
}
