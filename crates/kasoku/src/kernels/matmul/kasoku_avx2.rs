//! AVX2 kernels for kasoku's formats (CPUs without AVX512-VNNI): the same integer sums and
//! float epilogue as `kasoku.rs`'s portable kernel, so the results are identical.
//!
//! - M: `maddubs` multiplies the unsigned 4-bit codes with the signed activation bytes and
//!   adds pairs into 16-bit lanes (|pair| ≤ 2·15·127); eight such products are summed in 16
//!   bits (≤ 30480) before `madd` widens them, so a group of 64 needs two 16-bit sums per row.
//! - L: the codes come back to signed (`xor 0x80`) and use the sign trick (`maddubs(|w|,
//!   sign(a, w))`, |pair| ≤ 2·127·127 < 2¹⁵), widened after every register.
//!
//! Tiles of up to four activation rows (16 vector registers).

#![cfg(target_arch = "x86_64")]
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::kasoku::{Kind, XTile, ACT_BLOCK, GROUP};

/// Whether this CPU runs these kernels.
pub(crate) fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("f16c")
}

const PREFETCH: usize = 2048;

#[inline(always)]
unsafe fn prefetch(p: *const u8, len: usize) {
    let mut off = 0;
    while off < len {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH + off) as *const i8);
        off += 64;
    }
}

#[inline(always)]
unsafe fn bcast4(p: *const i8) -> __m256i {
    _mm256_set1_epi32(std::ptr::read_unaligned(p as *const i32))
}

/// See `kasoku_vnni::kernel` (tiles of 1..=4 rows).
///
/// # Safety
/// [`available`] must be true; `w`, `x` and `acc` as for `kasoku_vnni::kernel`, `xr ≤ 4`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn kernel(
    kind: Kind,
    w: &[u8],
    kn: usize,
    x: &XTile,
    xr: usize,
    acc: &mut [f32],
) {
    let a = x.acts;
    assert!((1..=4).contains(&xr) && acc.len() == xr * GROUP && kn > 0);
    assert!(w.len() == kn * ACT_BLOCK / kind.block_cols() * kind.block_bytes());
    assert!(x.r0 + xr <= a.n && (x.b0 + kn) * ACT_BLOCK <= a.cols);
    macro_rules! tiles {
        ($f:ident $(, $g:literal)?) => {
            match xr {
                1 => $f::<1 $(, $g)?>(w, kn, x, acc),
                2 => $f::<2 $(, $g)?>(w, kn, x, acc),
                3 => $f::<3 $(, $g)?>(w, kn, x, acc),
                _ => $f::<4 $(, $g)?>(w, kn, x, acc),
            }
        };
    }
    match kind {
        Kind::M(32) => tiles!(m, 32),
        Kind::M(64) => tiles!(m, 64),
        Kind::M(128) => tiles!(m, 128),
        Kind::M(g) => unreachable!("M group {g}"),
        Kind::L32 => tiles!(l, 32),
        Kind::LRow => tiles!(l, 64),
    }
}

#[inline(always)]
unsafe fn m<const XR: usize, const G: usize>(w: &[u8], kn: usize, x: &XTile, acc: &mut [f32]) {
    let bb = 20 + 4 * G;
    let acts = x.acts;
    let n = acts.n;
    let e0 = acts.idx(x.r0, x.b0);
    let xq = acts.qs.as_ptr().add(e0 * ACT_BLOCK);
    let xd = acts.d.as_ptr().add(e0);
    let ns32 = acts.nsum32.as_ptr().add(2 * e0);
    let ns64 = acts.nsum64.as_ptr().add(e0);
    let m4 = _mm256_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    let fifteen = _mm256_set1_epi32(15);
    let zshift = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    let mut out: [__m256; XR] =
        std::array::from_fn(|r| _mm256_loadu_ps(acc.as_ptr().add(r * GROUP)));
    let wp = w.as_ptr();
    for k in 0..kn * ACT_BLOCK / G {
        let p = wp.add(k * bb);
        prefetch(p, bb);
        let s = _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
        let zw = std::ptr::read_unaligned(p.add(16) as *const i32);
        let z = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(zw), zshift), fifteen);
        let segments = if G == 128 { 2 } else { 1 };
        for seg in 0..segments {
            let col = k * G + seg * ACT_BLOCK;
            let (b, off) = (col / ACT_BLOCK, col % ACT_BLOCK);
            // Two 16-bit sums per row, eight products each.
            let mut s16 = [[_mm256_setzero_si256(); 2]; XR];
            let mut u = 0;
            macro_rules! step {
                ($g:expr, $at:expr) => {{
                    let (g, at) = ($g, $at);
                    for r in 0..XR {
                        let xb = bcast4(xq.add((b * n + r) * ACT_BLOCK + at));
                        let h = u / 8;
                        s16[r][h] = _mm256_add_epi16(s16[r][h], _mm256_maddubs_epi16(g, xb));
                    }
                    u += 1;
                }};
            }
            for j in 0..G / 8 {
                let raw = _mm256_loadu_si256(p.add(20 + 32 * j) as *const __m256i);
                let lo = _mm256_and_si256(raw, m4);
                let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(raw), m4);
                if G == 128 {
                    step!(if seg == 0 { lo } else { hi }, 4 * j);
                } else {
                    step!(lo, off + 4 * j);
                    step!(hi, off + G / 2 + 4 * j);
                }
            }
            for r in 0..XR {
                let e = b * n + r;
                let ns = if G == 32 {
                    *ns32.add(2 * e + off / 32)
                } else {
                    *ns64.add(e)
                };
                let mut t = _mm256_madd_epi16(z, _mm256_set1_epi32(ns));
                t = _mm256_add_epi32(t, _mm256_madd_epi16(s16[r][0], ones));
                t = _mm256_add_epi32(t, _mm256_madd_epi16(s16[r][1], ones));
                let c = _mm256_mul_ps(s, _mm256_set1_ps(*xd.add(e)));
                out[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), c, out[r]);
            }
        }
    }
    for (r, v) in out.iter().enumerate() {
        _mm256_storeu_ps(acc.as_mut_ptr().add(r * GROUP), *v);
    }
}

/// L: `C` = 32 (grouped, f16 scale per block) or 64 (per row: blocks of 64, scale applied by
/// the caller).
#[inline(always)]
unsafe fn l<const XR: usize, const C: usize>(w: &[u8], kn: usize, x: &XTile, acc: &mut [f32]) {
    let (bb, codes_at) = if C == 32 { (272, 16) } else { (512, 0) };
    let acts = x.acts;
    let n = acts.n;
    let e0 = acts.idx(x.r0, x.b0);
    let xq = acts.qs.as_ptr().add(e0 * ACT_BLOCK);
    let xd = acts.d.as_ptr().add(e0);
    let flip = _mm256_set1_epi8(-128);
    let ones = _mm256_set1_epi16(1);
    let mut out: [__m256; XR] =
        std::array::from_fn(|r| _mm256_loadu_ps(acc.as_ptr().add(r * GROUP)));
    let wp = w.as_ptr();
    for k in 0..kn * ACT_BLOCK / C {
        let p = wp.add(k * bb);
        prefetch(p, bb);
        let (b, off) = ((k * C) / ACT_BLOCK, (k * C) % ACT_BLOCK);
        let mut dot = [_mm256_setzero_si256(); XR];
        for q in 0..C / 4 {
            let g = _mm256_xor_si256(
                _mm256_loadu_si256(p.add(codes_at + 32 * q) as *const __m256i),
                flip,
            );
            let ag = _mm256_abs_epi8(g);
            for r in 0..XR {
                let sx = _mm256_sign_epi8(bcast4(xq.add((b * n + r) * ACT_BLOCK + off + 4 * q)), g);
                dot[r] = _mm256_add_epi32(
                    dot[r],
                    _mm256_madd_epi16(_mm256_maddubs_epi16(ag, sx), ones),
                );
            }
        }
        for r in 0..XR {
            let d = _mm256_set1_ps(*xd.add(b * n + r));
            let c = if C == 32 {
                _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)), d)
            } else {
                d
            };
            out[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[r]), c, out[r]);
        }
    }
    for (r, v) in out.iter().enumerate() {
        _mm256_storeu_ps(acc.as_mut_ptr().add(r * GROUP), *v);
    }
}

/// `out ← √b·R·row` as `Signs::rotate_unnormalised` computes it (the same additions and
/// subtractions in the same stages, so the same bits): `signs` and block `b` (a power of two,
/// at least 8), or a plain copy without them.
///
/// # Safety
/// [`available`] must be true; `out.len() == row.len()`, a multiple of the block (and of 8).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn rotate_row(row: &[f32], signs: Option<(&[f32], usize)>, out: &mut [f32]) {
    assert!(out.len() == row.len() && row.len().is_multiple_of(8));
    let Some((signs, b)) = signs else {
        out.copy_from_slice(row);
        return;
    };
    assert!(signs.len() == row.len() && (8..=128).contains(&b) && b.is_power_of_two());
    assert!(row.len().is_multiple_of(b));
    let regs = b / 8;
    let (ip, sp, op) = (row.as_ptr(), signs.as_ptr(), out.as_mut_ptr());
    for blk in (0..row.len()).step_by(b) {
        let mut v = [_mm256_setzero_ps(); 16];
        for (k, vk) in v.iter_mut().enumerate().take(regs) {
            let at = blk + 8 * k;
            let x = _mm256_mul_ps(_mm256_loadu_ps(ip.add(at)), _mm256_loadu_ps(sp.add(at)));
            // Spans 1, 2, 4 inside the register: element i pairs with i ^ h; the lower one of
            // a pair gets a + b, the upper one a − b.
            let t = _mm256_permute_ps::<0b1011_0001>(x);
            let x = _mm256_blend_ps::<0b1010_1010>(_mm256_add_ps(x, t), _mm256_sub_ps(t, x));
            let t = _mm256_permute_ps::<0b0100_1110>(x);
            let x = _mm256_blend_ps::<0b1100_1100>(_mm256_add_ps(x, t), _mm256_sub_ps(t, x));
            let t = _mm256_permute2f128_ps::<1>(x, x);
            *vk = _mm256_blend_ps::<0b1111_0000>(_mm256_add_ps(x, t), _mm256_sub_ps(t, x));
        }
        // Spans 8, 16, …: whole registers.
        let mut h = 1;
        while h < regs {
            for i in (0..regs).step_by(2 * h) {
                for j in i..i + h {
                    let (a, c) = (v[j], v[j + h]);
                    v[j] = _mm256_add_ps(a, c);
                    v[j + h] = _mm256_sub_ps(a, c);
                }
            }
            h *= 2;
        }
        for (k, vk) in v.iter().enumerate().take(regs) {
            _mm256_storeu_ps(op.add(blk + 8 * k), *vk);
        }
    }
}

/// `kasoku::quantize_block` (same codes, maximum and sums): `cvtps2dq` rounds to nearest
/// even as the portable quantizer does.
///
/// # Safety
/// [`available`] must be true; `v.len() == q.len() == 64`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn quantize_block(v: &[f32], q: &mut [i8]) -> (f32, i32, i32) {
    assert!(v.len() == ACT_BLOCK && q.len() == ACT_BLOCK);
    let sign = _mm256_set1_ps(-0.0);
    let x: [__m256; 8] = std::array::from_fn(|k| _mm256_loadu_ps(v.as_ptr().add(8 * k)));
    let mut m = _mm256_andnot_ps(sign, x[0]);
    for xk in &x[1..] {
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, *xk));
    }
    let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
    let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    let amax = _mm_cvtss_f32(_mm_max_ss(m2, _mm_movehdup_ps(m2)));
    let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
    let i: [__m256i; 8] = std::array::from_fn(|k| _mm256_cvtps_epi32(_mm256_mul_ps(x[k], id)));
    let hsum = |a: __m256i| {
        let s4 = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256::<1>(a));
        let s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
        _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32::<1>(s2)))
    };
    let s0 = hsum(_mm256_add_epi32(
        _mm256_add_epi32(i[0], i[1]),
        _mm256_add_epi32(i[2], i[3]),
    ));
    let s1 = hsum(_mm256_add_epi32(
        _mm256_add_epi32(i[4], i[5]),
        _mm256_add_epi32(i[6], i[7]),
    ));
    let fix = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for h in 0..2 {
        let packed = _mm256_packs_epi16(
            _mm256_packs_epi32(i[4 * h], i[4 * h + 1]),
            _mm256_packs_epi32(i[4 * h + 2], i[4 * h + 3]),
        );
        _mm256_storeu_si256(
            q.as_mut_ptr().add(32 * h) as *mut __m256i,
            _mm256_permutevar8x32_epi32(packed, fix),
        );
    }
    (amax, s0, s1)
}
