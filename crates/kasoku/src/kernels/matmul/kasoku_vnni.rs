//! AVX512-VNNI kernels (on 256-bit vectors, with AVX-512VL's 32 registers) for kasoku's
//! formats: `vpdpbusd` multiplies the four unsigned weight codes of each 32-bit lane with four
//! activation bytes broadcast to every lane and adds the sums to the lane, so one instruction
//! advances eight weight rows by four columns. The activation operand is a memory broadcast,
//! so a code register costs one instruction per activation row and nothing else. Same integer
//! sums and the same float epilogue as `kasoku.rs`'s portable kernel (see there for the
//! layout and the arithmetic), so the results are identical.
//!
//! - M: codes are the unsigned nibbles; the zero point enters as the accumulator's start
//!   value `z·(−Σa)` (one `vpmaddwd` of the eight zero points with the block's negated code
//!   sum).
//! - L: codes are stored offset binary (`w + 128`), so the accumulator starts at `−128·Σa`.
//!
//! Up to eight activation rows per tile; with fewer than four, each row's sum is split over
//! two or four accumulators so that the dependency chain of `vpdpbusd` (latency 4) does not
//! limit decoding.

#![cfg(target_arch = "x86_64")]
// Tile loops index several per-row register arrays at once.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::kasoku::{Kind, XTile, ACT_BLOCK, GROUP};

/// Whether this CPU runs these kernels.
pub(crate) fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx512vnni")
        && std::arch::is_x86_feature_detected!("avx512vl")
        && std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("f16c")
}

/// Prefetch distance in bytes (as the legacy kernels: into L1, 2 KiB ahead).
const PREFETCH: usize = 2048;

#[inline(always)]
unsafe fn prefetch(p: *const u8, len: usize) {
    let mut off = 0;
    while off < len {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH + off) as *const i8);
        off += 64;
    }
}

/// The four activation bytes at `p`, in every lane.
#[inline(always)]
unsafe fn bcast4(p: *const i8) -> __m256i {
    _mm256_set1_epi32(std::ptr::read_unaligned(p as *const i32))
}

/// Accumulators per activation row for a tile of `xr` rows.
const fn split(xr: usize) -> usize {
    if xr == 1 {
        4
    } else {
        2
    }
}

/// Accumulates `kn` activation blocks' worth of packed blocks of one weight group into
/// `acc[r][i]` for `xr` (1..=8) activation rows; see `kasoku::kernel`.
///
/// # Safety
/// [`available`] must be true; `w` must hold the packed blocks of `kn` activation blocks of
/// columns of format `kind`, and `x` cover `xr` rows × `kn` blocks; `acc.len() == xr * 8`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
pub(crate) unsafe fn kernel(
    kind: Kind,
    w: &[u8],
    kn: usize,
    x: &XTile,
    xr: usize,
    acc: &mut [f32],
) {
    let a = x.acts;
    assert!((1..=8).contains(&xr) && acc.len() == xr * GROUP && kn > 0);
    assert!(w.len() == kn * ACT_BLOCK / kind.block_cols() * kind.block_bytes());
    assert!(x.r0 + xr <= a.n && (x.b0 + kn) * ACT_BLOCK <= a.cols);
    macro_rules! tiles {
        ($f:ident $(, $g:literal)?) => {
            match xr {
                1 => $f::<1 $(, $g)?>(w, kn, x, acc),
                2 => $f::<2 $(, $g)?>(w, kn, x, acc),
                3 => $f::<3 $(, $g)?>(w, kn, x, acc),
                4 => $f::<4 $(, $g)?>(w, kn, x, acc),
                5 => $f::<5 $(, $g)?>(w, kn, x, acc),
                6 => $f::<6 $(, $g)?>(w, kn, x, acc),
                7 => $f::<7 $(, $g)?>(w, kn, x, acc),
                _ => $f::<8 $(, $g)?>(w, kn, x, acc),
            }
        };
    }
    match kind {
        Kind::M(32) => tiles!(m, 32),
        Kind::M(64) => tiles!(m, 64),
        Kind::M(128) => tiles!(m, 128),
        Kind::M(g) => unreachable!("M group {g}"),
        Kind::L32 => tiles!(l32),
        Kind::LRow => tiles!(lrow),
    }
}

/// M with groups of `G` columns for `XR` activation rows.
#[inline(always)]
unsafe fn m<const XR: usize, const G: usize>(w: &[u8], kn: usize, x: &XTile, acc: &mut [f32]) {
    let bb = 20 + 4 * G;
    let nacc = split(XR);
    let acts = x.acts;
    let n = acts.n;
    let e0 = acts.idx(x.r0, x.b0);
    let xq = acts.qs.as_ptr().add(e0 * ACT_BLOCK);
    let xd = acts.d.as_ptr().add(e0);
    let ns32 = acts.nsum32.as_ptr().add(2 * e0);
    let ns64 = acts.nsum64.as_ptr().add(e0);
    let m4 = _mm256_set1_epi8(0x0F);
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
            // Columns of this segment, from the chunk's first activation block.
            let col = k * G + seg * ACT_BLOCK;
            let (b, off) = (col / ACT_BLOCK, col % ACT_BLOCK);
            let mut dot = [[_mm256_setzero_si256(); 4]; XR];
            for r in 0..XR {
                let e = b * n + r;
                let ns = if G == 32 {
                    *ns32.add(2 * e + off / 32)
                } else {
                    *ns64.add(e)
                };
                dot[r][0] = _mm256_madd_epi16(z, _mm256_set1_epi32(ns));
            }
            // One code register: every row's dot product advances by its four columns, into
            // accumulator `slot % nacc` (slots are literals, so the accumulators stay in
            // registers).
            macro_rules! step {
                ($slot:literal, $g:expr, $at:expr) => {{
                    let (g, at) = ($g, $at);
                    for r in 0..XR {
                        let xb = bcast4(xq.add((b * n + r) * ACT_BLOCK + at));
                        dot[r][$slot % nacc] = _mm256_dpbusd_epi32(dot[r][$slot % nacc], g, xb);
                    }
                }};
            }
            for j in (0..G / 8).step_by(2) {
                let raw0 = _mm256_loadu_si256(p.add(20 + 32 * j) as *const __m256i);
                let raw1 = _mm256_loadu_si256(p.add(20 + 32 * (j + 1)) as *const __m256i);
                let (lo0, hi0) = (
                    _mm256_and_si256(raw0, m4),
                    _mm256_and_si256(_mm256_srli_epi16::<4>(raw0), m4),
                );
                let (lo1, hi1) = (
                    _mm256_and_si256(raw1, m4),
                    _mm256_and_si256(_mm256_srli_epi16::<4>(raw1), m4),
                );
                if G == 128 {
                    // Low nibbles: columns 0..64 (segment 0); high: 64..128 (segment 1).
                    let (g0, g1) = if seg == 0 { (lo0, lo1) } else { (hi0, hi1) };
                    step!(0, g0, 4 * j);
                    step!(1, g1, 4 * j + 4);
                } else {
                    step!(0, lo0, off + 4 * j);
                    step!(1, hi0, off + G / 2 + 4 * j);
                    step!(2, lo1, off + 4 * j + 4);
                    step!(3, hi1, off + G / 2 + 4 * j + 4);
                }
            }
            for r in 0..XR {
                let mut t = dot[r][0];
                for v in 1..nacc {
                    t = _mm256_add_epi32(t, dot[r][v]);
                }
                let c = _mm256_mul_ps(s, _mm256_set1_ps(*xd.add(b * n + r)));
                out[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), c, out[r]);
            }
        }
    }
    for (r, v) in out.iter().enumerate() {
        _mm256_storeu_ps(acc.as_mut_ptr().add(r * GROUP), *v);
    }
}

/// L with groups of 32 for `XR` activation rows.
#[inline(always)]
unsafe fn l32<const XR: usize>(w: &[u8], kn: usize, x: &XTile, acc: &mut [f32]) {
    let bb = 272;
    let nacc = split(XR);
    let acts = x.acts;
    let n = acts.n;
    let e0 = acts.idx(x.r0, x.b0);
    let xq = acts.qs.as_ptr().add(e0 * ACT_BLOCK);
    let xd = acts.d.as_ptr().add(e0);
    let n128 = acts.n128sum32.as_ptr().add(2 * e0);
    let mut out: [__m256; XR] =
        std::array::from_fn(|r| _mm256_loadu_ps(acc.as_ptr().add(r * GROUP)));
    let wp = w.as_ptr();
    for k in 0..kn * 2 {
        let p = wp.add(k * bb);
        prefetch(p, bb);
        let s = _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
        let (b, half) = (k / 2, k % 2);
        let mut dot = [[_mm256_setzero_si256(); 4]; XR];
        for r in 0..XR {
            dot[r][0] = _mm256_set1_epi32(*n128.add(2 * (b * n + r) + half));
        }
        macro_rules! step {
            ($slot:literal, $q:expr) => {{
                let q = $q;
                let g = _mm256_loadu_si256(p.add(16 + 32 * q) as *const __m256i);
                for r in 0..XR {
                    let xb = bcast4(xq.add((b * n + r) * ACT_BLOCK + 32 * half + 4 * q));
                    dot[r][$slot % nacc] = _mm256_dpbusd_epi32(dot[r][$slot % nacc], g, xb);
                }
            }};
        }
        for q in (0..8).step_by(4) {
            step!(0, q);
            step!(1, q + 1);
            step!(2, q + 2);
            step!(3, q + 3);
        }
        for r in 0..XR {
            let mut t = dot[r][0];
            for v in 1..nacc {
                t = _mm256_add_epi32(t, dot[r][v]);
            }
            let c = _mm256_mul_ps(s, _mm256_set1_ps(*xd.add(b * n + r)));
            out[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), c, out[r]);
        }
    }
    for (r, v) in out.iter().enumerate() {
        _mm256_storeu_ps(acc.as_mut_ptr().add(r * GROUP), *v);
    }
}

/// L with one scale per row for `XR` activation rows (the row scales are applied by the
/// caller once the row is done).
#[inline(always)]
unsafe fn lrow<const XR: usize>(w: &[u8], kn: usize, x: &XTile, acc: &mut [f32]) {
    let bb = 512;
    let nacc = split(XR);
    let acts = x.acts;
    let n = acts.n;
    let e0 = acts.idx(x.r0, x.b0);
    let xq = acts.qs.as_ptr().add(e0 * ACT_BLOCK);
    let xd = acts.d.as_ptr().add(e0);
    let n128 = acts.n128sum64.as_ptr().add(e0);
    let mut out: [__m256; XR] =
        std::array::from_fn(|r| _mm256_loadu_ps(acc.as_ptr().add(r * GROUP)));
    let wp = w.as_ptr();
    for k in 0..kn {
        let p = wp.add(k * bb);
        prefetch(p, bb);
        let mut dot = [[_mm256_setzero_si256(); 4]; XR];
        for r in 0..XR {
            dot[r][0] = _mm256_set1_epi32(*n128.add(k * n + r));
        }
        macro_rules! step {
            ($slot:literal, $q:expr) => {{
                let q = $q;
                let g = _mm256_loadu_si256(p.add(32 * q) as *const __m256i);
                for r in 0..XR {
                    let xb = bcast4(xq.add((k * n + r) * ACT_BLOCK + 4 * q));
                    dot[r][$slot % nacc] = _mm256_dpbusd_epi32(dot[r][$slot % nacc], g, xb);
                }
            }};
        }
        for q in (0..16).step_by(4) {
            step!(0, q);
            step!(1, q + 1);
            step!(2, q + 2);
            step!(3, q + 3);
        }
        for r in 0..XR {
            let mut t = dot[r][0];
            for v in 1..nacc {
                t = _mm256_add_epi32(t, dot[r][v]);
            }
            out[r] = _mm256_fmadd_ps(
                _mm256_cvtepi32_ps(t),
                _mm256_set1_ps(*xd.add(k * n + r)),
                out[r],
            );
        }
    }
    for (r, v) in out.iter().enumerate() {
        _mm256_storeu_ps(acc.as_mut_ptr().add(r * GROUP), *v);
    }
}
