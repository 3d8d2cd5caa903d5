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
//!
//! M with more than one activation row (verification, prefill) takes two weight groups per
//! tile on 512-bit vectors ([`kernel2`]: sixteen weight rows per `vpdpbusd`, which runs at the
//! 256-bit instruction's rate here, so twice the work per instruction where the product is
//! bound by compute); decoding keeps the 256-bit kernel, bound by memory.

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

/// Whether this CPU also runs [`kernel2`] (which needs AVX-512BW besides [`available`]'s
/// features; every CPU with VNNI has it so far). Detected once.
pub(crate) fn pairs_available() -> bool {
    static BW: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *BW.get_or_init(|| available() && std::arch::is_x86_feature_detected!("avx512bw"))
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

/// [`kernel`] for two consecutive weight groups at once (sixteen weight rows: `w0` the first
/// group's packed blocks, `w1` the second's) on 512-bit vectors, lanes 0..8 the first group's
/// rows and 8..16 the second's: each `vpdpbusd` advances sixteen weight rows by four columns,
/// twice the work of a 256-bit one at the same instruction rate, which is what multi-row
/// products are bound by. The same integer sums and float epilogue per row as [`kernel`], so
/// the same bits. M and L in groups of 32 (L per row uses [`kernel`] per group); `acc[r][i]`
/// for `i < 16`.
///
/// # Safety
/// [`pairs_available`] must be true; as [`kernel`], with `w0` and `w1` alike and
/// `acc.len() == xr * 16`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")]
pub(crate) unsafe fn kernel2(
    kind: Kind,
    w0: &[u8],
    w1: &[u8],
    kn: usize,
    x: &XTile,
    xr: usize,
    acc: &mut [f32],
) {
    let a = x.acts;
    assert!((1..=8).contains(&xr) && acc.len() == xr * 2 * GROUP && kn > 0);
    assert!(w0.len() == kn * ACT_BLOCK / kind.block_cols() * kind.block_bytes());
    assert!(w1.len() == w0.len());
    assert!(x.r0 + xr <= a.n && (x.b0 + kn) * ACT_BLOCK <= a.cols);
    macro_rules! tiles {
        ($g:literal) => {
            match xr {
                1 => m2::<1, $g>(w0, w1, kn, x, acc),
                2 => m2::<2, $g>(w0, w1, kn, x, acc),
                3 => m2::<3, $g>(w0, w1, kn, x, acc),
                4 => m2::<4, $g>(w0, w1, kn, x, acc),
                5 => m2::<5, $g>(w0, w1, kn, x, acc),
                6 => m2::<6, $g>(w0, w1, kn, x, acc),
                7 => m2::<7, $g>(w0, w1, kn, x, acc),
                _ => m2::<8, $g>(w0, w1, kn, x, acc),
            }
        };
    }
    macro_rules! l_tiles {
        () => {
            match xr {
                1 => l2::<1>(w0, w1, kn, x, acc),
                2 => l2::<2>(w0, w1, kn, x, acc),
                3 => l2::<3>(w0, w1, kn, x, acc),
                4 => l2::<4>(w0, w1, kn, x, acc),
                5 => l2::<5>(w0, w1, kn, x, acc),
                6 => l2::<6>(w0, w1, kn, x, acc),
                7 => l2::<7>(w0, w1, kn, x, acc),
                _ => l2::<8>(w0, w1, kn, x, acc),
            }
        };
    }
    match kind {
        Kind::M(32) => tiles!(32),
        Kind::M(64) => tiles!(64),
        Kind::M(128) => tiles!(128),
        Kind::L32 => l_tiles!(),
        k => unreachable!("kernel2 of {k:?}"),
    }
}

/// L with groups of 32 for `XR` activation rows and two weight groups (see [`kernel2`]); the
/// arithmetic of [`l32`] lane by lane.
#[inline(always)]
unsafe fn l2<const XR: usize>(w0: &[u8], w1: &[u8], kn: usize, x: &XTile, acc: &mut [f32]) {
    const ROWS: usize = 2 * GROUP;
    let bb = 272;
    let nacc = if XR == 1 {
        4
    } else if XR <= 6 {
        2
    } else {
        1
    };
    let acts = x.acts;
    let n = acts.n;
    let e0 = acts.idx(x.r0, x.b0);
    let xq = acts.qs.as_ptr().add(e0 * ACT_BLOCK);
    let xd = acts.d.as_ptr().add(e0);
    let n128 = acts.n128sum32.as_ptr().add(2 * e0);
    let mut out: [__m512; XR] =
        std::array::from_fn(|r| _mm512_loadu_ps(acc.as_ptr().add(r * ROWS)));
    let (wp0, wp1) = (w0.as_ptr(), w1.as_ptr());
    let d = pair_prefetch();
    for k in 0..kn * 2 {
        let (p0, p1) = (wp0.add(k * bb), wp1.add(k * bb));
        let mut off = 0;
        while off < bb {
            _mm_prefetch::<_MM_HINT_T0>(p0.wrapping_add(d + off) as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(p1.wrapping_add(d + off) as *const i8);
            off += 64;
        }
        let s = _mm512_cvtph_ps(_mm256_inserti128_si256::<1>(
            _mm256_castsi128_si256(_mm_loadu_si128(p0 as *const __m128i)),
            _mm_loadu_si128(p1 as *const __m128i),
        ));
        let (b, half) = (k / 2, k % 2);
        let mut dot = [[_mm512_setzero_si512(); 4]; XR];
        for r in 0..XR {
            dot[r][0] = _mm512_set1_epi32(*n128.add(2 * (b * n + r) + half));
        }
        macro_rules! step {
            ($slot:literal, $q:expr) => {{
                let q = $q;
                let g = pair256(p0.add(16 + 32 * q), p1.add(16 + 32 * q));
                for r in 0..XR {
                    let xa = std::ptr::read_unaligned(
                        xq.add((b * n + r) * ACT_BLOCK + 32 * half + 4 * q) as *const i32,
                    );
                    dot[r][$slot % nacc] =
                        _mm512_dpbusd_epi32(dot[r][$slot % nacc], g, _mm512_set1_epi32(xa));
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
                t = _mm512_add_epi32(t, dot[r][v]);
            }
            let c = _mm512_mul_ps(s, _mm512_set1_ps(*xd.add(b * n + r)));
            out[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), c, out[r]);
        }
    }
    for (r, v) in out.iter().enumerate() {
        _mm512_storeu_ps(acc.as_mut_ptr().add(r * ROWS), *v);
    }
}

/// Prefetch distance of [`kernel2`] in bytes (of each of its two streams): farther than a
/// 1536-column group (6.6 KiB of M), so that the first stream's prefetches reach the next
/// pair of groups rather than the second stream's current one. `kasoku::bench::
/// m_streaming_speed` measured 8 rows × 8960 × 1536 from memory at 0.81 ms against 0.99 ms
/// with 2 KiB and 6 KiB (12 and 16 KiB: 0.80, 0.83).
const PAIR_PREFETCH: usize = 8192;

/// Tests may set another distance (0: [`PAIR_PREFETCH`]).
#[cfg(test)]
pub(crate) static PAIR_PREFETCH_TEST: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(0);

#[inline(always)]
fn pair_prefetch() -> usize {
    #[cfg(test)]
    {
        let d = PAIR_PREFETCH_TEST.load(std::sync::atomic::Ordering::Relaxed);
        if d != 0 {
            return d;
        }
    }
    PAIR_PREFETCH
}

/// The 32 bytes at `p0` in the low half and those at `p1` in the high half.
#[inline(always)]
unsafe fn pair256(p0: *const u8, p1: *const u8) -> __m512i {
    _mm512_inserti64x4::<1>(
        _mm512_castsi256_si512(_mm256_loadu_si256(p0 as *const __m256i)),
        _mm256_loadu_si256(p1 as *const __m256i),
    )
}

/// The 32-bit value at `p0` in lanes 0..8 and that at `p1` in lanes 8..16.
#[inline(always)]
unsafe fn pair_i32(p0: *const u8, p1: *const u8) -> __m512i {
    _mm512_inserti64x4::<1>(
        _mm512_castsi256_si512(_mm256_set1_epi32(std::ptr::read_unaligned(
            p0 as *const i32,
        ))),
        _mm256_set1_epi32(std::ptr::read_unaligned(p1 as *const i32)),
    )
}

/// M with groups of `G` columns for `XR` activation rows and two weight groups (see
/// [`kernel2`]); the arithmetic of [`m`] lane by lane.
#[inline(always)]
unsafe fn m2<const XR: usize, const G: usize>(
    w0: &[u8],
    w1: &[u8],
    kn: usize,
    x: &XTile,
    acc: &mut [f32],
) {
    const ROWS: usize = 2 * GROUP;
    let bb = 20 + 4 * G;
    // Independent accumulators per row: enough chains to cover `vpdpbusd`'s latency, few
    // enough that eight rows stay in the 32 registers.
    let nacc = if XR == 1 {
        4
    } else if XR <= 6 {
        2
    } else {
        1
    };
    let acts = x.acts;
    let n = acts.n;
    let e0 = acts.idx(x.r0, x.b0);
    let xq = acts.qs.as_ptr().add(e0 * ACT_BLOCK);
    let xd = acts.d.as_ptr().add(e0);
    let ns32 = acts.nsum32.as_ptr().add(2 * e0);
    let ns64 = acts.nsum64.as_ptr().add(e0);
    let m4 = _mm512_set1_epi8(0x0F);
    let fifteen = _mm512_set1_epi32(15);
    let zshift = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28);
    let mut out: [__m512; XR] =
        std::array::from_fn(|r| _mm512_loadu_ps(acc.as_ptr().add(r * ROWS)));
    let (wp0, wp1) = (w0.as_ptr(), w1.as_ptr());
    for k in 0..kn * ACT_BLOCK / G {
        let (p0, p1) = (wp0.add(k * bb), wp1.add(k * bb));
        let d = pair_prefetch();
        let mut off = 0;
        while off < bb {
            _mm_prefetch::<_MM_HINT_T0>(p0.wrapping_add(d + off) as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(p1.wrapping_add(d + off) as *const i8);
            off += 64;
        }
        let s = _mm512_cvtph_ps(_mm256_inserti128_si256::<1>(
            _mm256_castsi128_si256(_mm_loadu_si128(p0 as *const __m128i)),
            _mm_loadu_si128(p1 as *const __m128i),
        ));
        let z = _mm512_and_si512(
            _mm512_srlv_epi32(pair_i32(p0.add(16), p1.add(16)), zshift),
            fifteen,
        );
        let segments = if G == 128 { 2 } else { 1 };
        for seg in 0..segments {
            let col = k * G + seg * ACT_BLOCK;
            let (b, off) = (col / ACT_BLOCK, col % ACT_BLOCK);
            let mut dot = [[_mm512_setzero_si512(); 4]; XR];
            for r in 0..XR {
                let e = b * n + r;
                let ns = if G == 32 {
                    *ns32.add(2 * e + off / 32)
                } else {
                    *ns64.add(e)
                };
                dot[r][0] = _mm512_madd_epi16(z, _mm512_set1_epi32(ns));
            }
            macro_rules! step {
                ($slot:literal, $g:expr, $at:expr) => {{
                    let (g, at) = ($g, $at);
                    for r in 0..XR {
                        let xa = std::ptr::read_unaligned(
                            xq.add((b * n + r) * ACT_BLOCK + at) as *const i32
                        );
                        dot[r][$slot % nacc] =
                            _mm512_dpbusd_epi32(dot[r][$slot % nacc], g, _mm512_set1_epi32(xa));
                    }
                }};
            }
            for j in (0..G / 8).step_by(2) {
                let raw0 = pair256(p0.add(20 + 32 * j), p1.add(20 + 32 * j));
                let raw1 = pair256(p0.add(20 + 32 * (j + 1)), p1.add(20 + 32 * (j + 1)));
                let (lo0, hi0) = (
                    _mm512_and_si512(raw0, m4),
                    _mm512_and_si512(_mm512_srli_epi32::<4>(raw0), m4),
                );
                let (lo1, hi1) = (
                    _mm512_and_si512(raw1, m4),
                    _mm512_and_si512(_mm512_srli_epi32::<4>(raw1), m4),
                );
                if G == 128 {
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
                    t = _mm512_add_epi32(t, dot[r][v]);
                }
                let c = _mm512_mul_ps(s, _mm512_set1_ps(*xd.add(b * n + r)));
                out[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), c, out[r]);
            }
        }
    }
    for (r, v) in out.iter().enumerate() {
        _mm512_storeu_ps(acc.as_mut_ptr().add(r * ROWS), *v);
    }
}
