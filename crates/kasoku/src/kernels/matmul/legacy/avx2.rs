//! AVX2 kernels for the legacy formats: activation quantization and the 8-row tile kernel.
//! They compute exactly what the portable (`mod.rs`) code computes (same integer dot products,
//! same float operations in the same order); see that file for the packed layout.
//!
//! Per packed block: one `vcvtph2ps` gives the eight rows' scales; each of the eight group
//! registers (four values of each of the eight rows) is unpacked once and multiplied with the
//! broadcast activation bytes of each activation row (`maddubs`: unsigned weight code × signed
//! activation). Q4 sums the eight 16-bit partial sums directly (|sum| ≤ 8·2·15·127 < 2^15);
//! Q5 in two halves of four; Q8_0 (signed × signed) uses the sign trick and widens each
//! product with `madd`.

use std::arch::x86_64::*;

use super::{offsets, XTile, GROUP};
use crate::quant::legacy::QK;
use crate::quant::DType;

/// Quantizes activation blocks as `legacy::quantize_blocks` does (same results as
/// `legacy::quantize_block`, block by block).
///
/// # Safety
/// The CPU must support AVX2.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn quantize_blocks(
    x: &[f32],
    n: usize,
    cols: usize,
    j0: usize,
    qs: &mut [i8],
    d: &mut [f32],
    sums: &mut [i32],
) {
    assert!(qs.len() == d.len() * QK && d.len() == sums.len() && d.len().is_multiple_of(n));
    assert!((j0 + d.len() / n) * QK <= cols && x.len() == n * cols);
    let sign = _mm256_set1_ps(-0.0);
    let fix = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for e in 0..d.len() {
        let (j, r) = (j0 + e / n, e % n);
        let p = x.as_ptr().add(r * cols + j * QK);
        let v = [
            _mm256_loadu_ps(p),
            _mm256_loadu_ps(p.add(8)),
            _mm256_loadu_ps(p.add(16)),
            _mm256_loadu_ps(p.add(24)),
        ];
        let a01 = _mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1]));
        let a23 = _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3]));
        let m = _mm256_max_ps(a01, a23);
        let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        let m1 = _mm_max_ss(m2, _mm_movehdup_ps(m2));
        let amax = _mm_cvtss_f32(m1);
        d[e] = amax / 127.0;
        let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
        let i: [__m256i; 4] = std::array::from_fn(|k| _mm256_cvtps_epi32(_mm256_mul_ps(v[k], id)));
        let s = _mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3]));
        let s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        let s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
        let s1 = _mm_add_epi32(s2, _mm_shuffle_epi32(s2, 1));
        sums[e] = _mm_cvtsi128_si32(s1);
        let packed = _mm256_packs_epi16(
            _mm256_packs_epi32(i[0], i[1]),
            _mm256_packs_epi32(i[2], i[3]),
        );
        _mm256_storeu_si256(
            qs.as_mut_ptr().add(e * QK) as *mut __m256i,
            _mm256_permutevar8x32_epi32(packed, fix),
        );
    }
}

/// Accumulates `kn` packed blocks of one weight group into `acc[r][i]` for `xr` (1..=4)
/// activation rows.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C; `w` must hold `kn` packed blocks of `dtype` and
/// `x` cover `xr` rows × `kn` blocks; `acc.len() == xr * 8`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn kernel(
    dtype: DType,
    w: &[u8],
    kn: usize,
    x: &XTile,
    xr: usize,
    acc: &mut [f32],
) {
    assert!(w.len() >= kn * GROUP * dtype.block_bytes() && acc.len() == xr * GROUP);
    assert!(
        kn > 0 && x.idx(xr - 1, kn - 1) < x.acts.d.len() && x.acts.qs.len() == x.acts.d.len() * QK
    );
    let (corr, min) = (
        matches!(dtype, DType::Q4_0 | DType::Q5_0),
        matches!(dtype, DType::Q4_1 | DType::Q5_1),
    );
    assert!(!corr || x.acts.neg_corr.len() == x.acts.d.len());
    assert!(!min || x.acts.s.len() == x.acts.d.len());
    match (dtype, xr) {
        (DType::Q8_0, 1) => q8::<1>(w, kn, x, acc),
        (DType::Q8_0, 2) => q8::<2>(w, kn, x, acc),
        (DType::Q8_0, 3) => q8::<3>(w, kn, x, acc),
        (DType::Q8_0, _) => q8::<4>(w, kn, x, acc),
        (DType::Q4_0, 1) => nib::<1, 18>(w, kn, x, acc),
        (DType::Q4_0, 2) => nib::<2, 18>(w, kn, x, acc),
        (DType::Q4_0, 3) => nib::<3, 18>(w, kn, x, acc),
        (DType::Q4_0, _) => nib::<4, 18>(w, kn, x, acc),
        (DType::Q4_1, 1) => nib::<1, 20>(w, kn, x, acc),
        (DType::Q4_1, 2) => nib::<2, 20>(w, kn, x, acc),
        (DType::Q4_1, 3) => nib::<3, 20>(w, kn, x, acc),
        (DType::Q4_1, _) => nib::<4, 20>(w, kn, x, acc),
        (DType::Q5_0, 1) => nib::<1, 22>(w, kn, x, acc),
        (DType::Q5_0, 2) => nib::<2, 22>(w, kn, x, acc),
        (DType::Q5_0, 3) => nib::<3, 22>(w, kn, x, acc),
        (DType::Q5_0, _) => nib::<4, 22>(w, kn, x, acc),
        (DType::Q5_1, 1) => nib::<1, 24>(w, kn, x, acc),
        (DType::Q5_1, 2) => nib::<2, 24>(w, kn, x, acc),
        (DType::Q5_1, 3) => nib::<3, 24>(w, kn, x, acc),
        (DType::Q5_1, _) => nib::<4, 24>(w, kn, x, acc),
        _ => unreachable!("not a legacy format: {dtype}"),
    }
}

/// Prefetch distance in bytes: the hardware prefetchers alone leave the core waiting on
/// memory once it has several activation rows of work per weight byte (measured: −25–35 % time
/// at 2–8 rows on Zen 4; 2 and 4 KiB are alike).
pub(crate) const PREFETCH: usize = 2048;

/// Asks for the `len` weight bytes [`PREFETCH`] ahead of `p` to be brought into L1.
#[inline(always)]
pub(crate) unsafe fn prefetch(p: *const u8, len: usize) {
    let mut off = 0;
    while off < len {
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH + off) as *const i8);
        off += 64;
    }
}

/// Broadcasts the four activation bytes at `p` to every 32-bit lane.
#[inline(always)]
unsafe fn bcast4(p: *const i8) -> __m256i {
    _mm256_set1_epi32(std::ptr::read_unaligned(p as *const i32))
}

/// The fifth bits of group register `k`, moved to bit 4 of each byte (see the packed layout:
/// bit `k` of each byte of `h`). 16-bit shifts are fine: bits crossing a byte boundary never
/// land on bit 4.
#[inline(always)]
unsafe fn high_bits(h: __m256i, k: usize) -> __m256i {
    match k {
        0 => _mm256_slli_epi16::<4>(h),
        1 => _mm256_slli_epi16::<3>(h),
        2 => _mm256_slli_epi16::<2>(h),
        3 => _mm256_slli_epi16::<1>(h),
        4 => h,
        5 => _mm256_srli_epi16::<1>(h),
        6 => _mm256_srli_epi16::<2>(h),
        _ => _mm256_srli_epi16::<3>(h),
    }
}

/// Q4_0 / Q4_1 / Q5_0 / Q5_1 (told apart by their block size `BB`) for `XR` activation rows.
#[inline(always)]
unsafe fn nib<const XR: usize, const BB: usize>(w: &[u8], kn: usize, x: &XTile, acc: &mut [f32]) {
    let dtype = match BB {
        18 => DType::Q4_0,
        20 => DType::Q4_1,
        22 => DType::Q5_0,
        _ => DType::Q5_1,
    };
    let (m_off, h_off, q_off) = offsets(dtype);
    let five = h_off != 0;
    let has_min = m_off != 0;
    let m4 = _mm256_set1_epi8(0x0F);
    let m10 = _mm256_set1_epi8(0x10);
    let ones = _mm256_set1_epi16(1);
    let mut a: [__m256; XR] = std::array::from_fn(|r| _mm256_loadu_ps(acc.as_ptr().add(r * GROUP)));
    // Block-major activations: entry `b·n + r` from the tile's first one.
    let n = x.acts.n;
    let e0 = x.idx(0, 0);
    let xq = x.acts.qs.as_ptr().add(e0 * QK);
    let xd = x.acts.d.as_ptr().add(e0);
    let xc = x.acts.neg_corr.as_ptr().wrapping_add(e0);
    let xs = x.acts.s.as_ptr().wrapping_add(e0);
    let wp = w.as_ptr();
    for b in 0..kn {
        let p = wp.add(b * GROUP * BB);
        prefetch(p, GROUP * BB);
        let h = if five {
            _mm256_loadu_si256(p.add(h_off) as *const __m256i)
        } else {
            _mm256_setzero_si256()
        };
        let mut lo = [_mm256_setzero_si256(); XR];
        let mut hi = [_mm256_setzero_si256(); XR];
        for k in 0..8 {
            let raw = _mm256_loadu_si256(p.add(q_off + 32 * (k % 4)) as *const __m256i);
            let mut g = if k < 4 {
                _mm256_and_si256(raw, m4)
            } else {
                _mm256_and_si256(_mm256_srli_epi16::<4>(raw), m4)
            };
            if five {
                g = _mm256_or_si256(g, _mm256_and_si256(high_bits(h, k), m10));
            }
            for r in 0..XR {
                let prod = _mm256_maddubs_epi16(g, bcast4(xq.add((b * n + r) * QK + 4 * k)));
                if five && k >= 4 {
                    hi[r] = _mm256_add_epi16(hi[r], prod);
                } else {
                    lo[r] = _mm256_add_epi16(lo[r], prod);
                }
            }
        }
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
        let mw = if has_min {
            _mm256_cvtph_ps(_mm_loadu_si128(p.add(m_off) as *const __m128i))
        } else {
            _mm256_setzero_ps()
        };
        for r in 0..XR {
            let e = b * n + r;
            let mut dot = _mm256_madd_epi16(lo[r], ones);
            if five {
                dot = _mm256_add_epi32(dot, _mm256_madd_epi16(hi[r], ones));
            }
            if !has_min {
                dot = _mm256_add_epi32(dot, _mm256_set1_epi32(*xc.add(e)));
            }
            let c = _mm256_mul_ps(dw, _mm256_set1_ps(*xd.add(e)));
            a[r] = _mm256_fmadd_ps(c, _mm256_cvtepi32_ps(dot), a[r]);
            if has_min {
                a[r] = _mm256_fmadd_ps(mw, _mm256_set1_ps(*xs.add(e)), a[r]);
            }
        }
    }
    for (r, v) in a.iter().enumerate() {
        _mm256_storeu_ps(acc.as_mut_ptr().add(r * GROUP), *v);
    }
}

/// Q8_0 weights (signed × signed: `maddubs(|w|, sign(x, w))`) for `XR` activation rows.
#[inline(always)]
unsafe fn q8<const XR: usize>(w: &[u8], kn: usize, x: &XTile, acc: &mut [f32]) {
    let ones = _mm256_set1_epi16(1);
    let mut a: [__m256; XR] = std::array::from_fn(|r| _mm256_loadu_ps(acc.as_ptr().add(r * GROUP)));
    // Block-major activations: entry `b·n + r` from the tile's first one.
    let n = x.acts.n;
    let e0 = x.idx(0, 0);
    let xq = x.acts.qs.as_ptr().add(e0 * QK);
    let xd = x.acts.d.as_ptr().add(e0);
    let wp = w.as_ptr();
    for b in 0..kn {
        let p = wp.add(b * GROUP * 34);
        prefetch(p, GROUP * 34);
        let mut dot = [_mm256_setzero_si256(); XR];
        for k in 0..8 {
            let g = _mm256_loadu_si256(p.add(16 + 32 * k) as *const __m256i);
            let ag = _mm256_abs_epi8(g);
            for (r, dr) in dot.iter_mut().enumerate() {
                let sx = _mm256_sign_epi8(bcast4(xq.add((b * n + r) * QK + 4 * k)), g);
                *dr = _mm256_add_epi32(*dr, _mm256_madd_epi16(_mm256_maddubs_epi16(ag, sx), ones));
            }
        }
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
        for r in 0..XR {
            let c = _mm256_mul_ps(dw, _mm256_set1_ps(*xd.add(b * n + r)));
            a[r] = _mm256_fmadd_ps(c, _mm256_cvtepi32_ps(dot[r]), a[r]);
        }
    }
    for (r, v) in a.iter().enumerate() {
        _mm256_storeu_ps(acc.as_mut_ptr().add(r * GROUP), *v);
    }
}
