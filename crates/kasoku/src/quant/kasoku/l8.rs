//! Format L: 8-bit symmetric integers, `w ≈ s·q` with `q ∈ −127..=127`, and one scale per
//! group of 32 columns (f16: 8.5 bits per weight, as Q8_0) or per row (f32: 8 bits per weight
//! plus 32 bits a row).
//!
//! Storage of one row: codes as i8 bytes; scales little-endian (f16 per group, or one f32).
//!
//! **Quantizer**: `s = max|w|/127` (rounded up to f16 for groups, so no code leaves the
//! range), `q = round(w/s)` to nearest, ties to even. Every value is within `s/2` of its
//! grid point.

use half::f16;

use super::m4::{f16_at_least, round_even};

/// The group size of grouped L.
pub const GROUP: usize = 32;
/// Largest code magnitude.
pub const MAX_CODE: i8 = 127;

/// Codes of `w` for step `s` (0 for a zero step).
fn assign(w: &[f32], s: f32, codes: &mut [u8]) {
    let inv = if s > 0.0 { 1.0 / s } else { 0.0 };
    for (q, &v) in codes.iter_mut().zip(w) {
        *q = (round_even(v * inv).clamp(-127.0, 127.0) as i8) as u8;
    }
}

/// Quantizes one (rotated) row in groups of [`GROUP`]: `codes` (`len` bytes), `scales`
/// (`2·len/32` bytes, f16). `None` if a scale exceeds f16's range.
pub fn quantize_row_grouped(values: &[f32], codes: &mut [u8], scales: &mut [u8]) -> Option<()> {
    for (g, w) in values.chunks_exact(GROUP).enumerate() {
        let amax = w.iter().fold(0f32, |a, v| a.max(v.abs()));
        let s = f16_at_least(amax / 127.0)?;
        scales[2 * g..2 * g + 2].copy_from_slice(&s.to_le_bytes());
        assign(w, s.to_f32(), &mut codes[g * GROUP..(g + 1) * GROUP]);
    }
    Some(())
}

/// Quantizes one (rotated) row with one f32 scale: `codes` (`len` bytes), `scale` (4 bytes).
pub fn quantize_row_per_row(values: &[f32], codes: &mut [u8], scale: &mut [u8]) {
    let amax = values.iter().fold(0f32, |a, v| a.max(v.abs()));
    let s = amax / 127.0;
    scale.copy_from_slice(&s.to_le_bytes());
    assign(values, s, codes);
}

/// Code of column `c`.
#[inline]
pub fn code(codes: &[u8], c: usize) -> i8 {
    codes[c] as i8
}

/// Scale of group `g` (grouped L).
#[inline]
pub fn group_scale(scales: &[u8], g: usize) -> f32 {
    f16::from_le_bytes([scales[2 * g], scales[2 * g + 1]]).to_f32()
}

/// The row scale (per-row L).
#[inline]
pub fn row_scale(scale: &[u8]) -> f32 {
    f32::from_le_bytes([scale[0], scale[1], scale[2], scale[3]])
}

/// The (rotated-basis) values of a grouped row, exact in f32.
pub fn dequantize_row_grouped(codes: &[u8], scales: &[u8], out: &mut [f32]) {
    for (c, o) in out.iter_mut().enumerate() {
        *o = group_scale(scales, c / GROUP) * code(codes, c) as f32;
    }
}

/// The (rotated-basis) values of a per-row row (each a rounded product `s·q`).
pub fn dequantize_row_per_row(codes: &[u8], scale: &[u8], out: &mut [f32]) {
    let s = row_scale(scale);
    for (c, o) in out.iter_mut().enumerate() {
        *o = s * code(codes, c) as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_is_within_half_a_step() {
        let mut s = 11u64;
        let w: Vec<f32> = (0..256)
            .map(|i| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let u = (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
                if i == 17 {
                    9.0
                } else {
                    u
                }
            })
            .collect();
        let (mut codes, mut scales) = (vec![0u8; 256], vec![0u8; 16]);
        quantize_row_grouped(&w, &mut codes, &mut scales).unwrap();
        let mut back = vec![0f32; 256];
        dequantize_row_grouped(&codes, &scales, &mut back);
        for (c, (&a, &b)) in w.iter().zip(&back).enumerate() {
            let step = group_scale(&scales, c / GROUP);
            assert!((a - b).abs() <= step / 2.0 * (1.0 + 1e-6), "{c}: {a} {b}");
            assert!(code(&codes, c) >= -127);
        }
        let mut scale = [0u8; 4];
        quantize_row_per_row(&w, &mut codes, &mut scale);
        dequantize_row_per_row(&codes, &scale, &mut back);
        let step = row_scale(&scale);
        assert_eq!(step, 9.0 / 127.0);
        assert_eq!(code(&codes, 17), 127);
        for (&a, &b) in w.iter().zip(&back) {
            assert!((a - b).abs() <= step / 2.0 * (1.0 + 1e-5));
        }
    }
}
