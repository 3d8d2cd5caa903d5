//! AVX512-VNNI kernels (on 256-bit vectors) for the legacy formats: `vpdpbusd` multiplies the
//! four unsigned weight codes of each lane with the four broadcast activation bytes and adds the
//! sum to 32-bit lanes in one instruction, replacing the AVX2 path's `maddubs` + add (+ `madd`).
//! Same integer dot products and the same float epilogue as the portable (`mod.rs`) kernel, so
//! the results are identical; see that file for the packed layout.
//!
//! Since `vpdpbusd` cannot saturate, Q8_0 weights are made unsigned by flipping their sign bit
//! (`w + 128`) and the activation sum term `128·Σq` is subtracted, like Q4_0's `8·Σq`. The
//! integer accumulators start at minus that correction; with fewer than four activation rows
//! each row uses two accumulators (even and odd code registers) to halve the dependency chain.

use std::arch::x86_64::*;

use super::{offsets, XTile, GROUP};
use crate::quant::legacy::QK;
use crate::quant::DType;

/// Accumulates `kn` packed blocks of one weight group into `acc[r][i]` for `xr` (1..=8)
/// activation rows (AVX-512VL gives 32 vector registers); see `avx2::kernel`.
///
/// # Safety
/// The CPU must support AVX2, FMA, F16C and AVX-512 F/VL/VNNI (`Isa::vnni`); `w` must hold `kn` packed blocks of `dtype` and `x` cover `xr`
/// rows × `kn` blocks; `acc.len() == xr * 8`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
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
        matches!(dtype, DType::Q4_0 | DType::Q5_0 | DType::Q8_0),
        matches!(dtype, DType::Q4_1 | DType::Q5_1),
    );
    assert!(!corr || x.acts.neg_corr.len() == x.acts.d.len());
    assert!(!min || x.acts.s.len() == x.acts.d.len());
    match (dtype, xr) {
        (DType::Q8_0, 1) => run::<1, 34>(w, kn, x, acc),
        (DType::Q8_0, 2) => run::<2, 34>(w, kn, x, acc),
        (DType::Q8_0, 3) => run::<3, 34>(w, kn, x, acc),
        (DType::Q8_0, 4) => run::<4, 34>(w, kn, x, acc),
        (DType::Q8_0, 5) => run::<5, 34>(w, kn, x, acc),
        (DType::Q8_0, 6) => run::<6, 34>(w, kn, x, acc),
        (DType::Q8_0, 7) => run::<7, 34>(w, kn, x, acc),
        (DType::Q8_0, _) => run::<8, 34>(w, kn, x, acc),
        (DType::Q4_0, 1) => run::<1, 18>(w, kn, x, acc),
        (DType::Q4_0, 2) => run::<2, 18>(w, kn, x, acc),
        (DType::Q4_0, 3) => run::<3, 18>(w, kn, x, acc),
        (DType::Q4_0, 4) => run::<4, 18>(w, kn, x, acc),
        (DType::Q4_0, 5) => run::<5, 18>(w, kn, x, acc),
        (DType::Q4_0, 6) => run::<6, 18>(w, kn, x, acc),
        (DType::Q4_0, 7) => run::<7, 18>(w, kn, x, acc),
        (DType::Q4_0, _) => run::<8, 18>(w, kn, x, acc),
        (DType::Q4_1, 1) => run::<1, 20>(w, kn, x, acc),
        (DType::Q4_1, 2) => run::<2, 20>(w, kn, x, acc),
        (DType::Q4_1, 3) => run::<3, 20>(w, kn, x, acc),
        (DType::Q4_1, 4) => run::<4, 20>(w, kn, x, acc),
        (DType::Q4_1, 5) => run::<5, 20>(w, kn, x, acc),
        (DType::Q4_1, 6) => run::<6, 20>(w, kn, x, acc),
        (DType::Q4_1, 7) => run::<7, 20>(w, kn, x, acc),
        (DType::Q4_1, _) => run::<8, 20>(w, kn, x, acc),
        (DType::Q5_0, 1) => run::<1, 22>(w, kn, x, acc),
        (DType::Q5_0, 2) => run::<2, 22>(w, kn, x, acc),
        (DType::Q5_0, 3) => run::<3, 22>(w, kn, x, acc),
        (DType::Q5_0, 4) => run::<4, 22>(w, kn, x, acc),
        (DType::Q5_0, 5) => run::<5, 22>(w, kn, x, acc),
        (DType::Q5_0, 6) => run::<6, 22>(w, kn, x, acc),
        (DType::Q5_0, 7) => run::<7, 22>(w, kn, x, acc),
        (DType::Q5_0, _) => run::<8, 22>(w, kn, x, acc),
        (DType::Q5_1, 1) => run::<1, 24>(w, kn, x, acc),
        (DType::Q5_1, 2) => run::<2, 24>(w, kn, x, acc),
        (DType::Q5_1, 3) => run::<3, 24>(w, kn, x, acc),
        (DType::Q5_1, 4) => run::<4, 24>(w, kn, x, acc),
        (DType::Q5_1, 5) => run::<5, 24>(w, kn, x, acc),
        (DType::Q5_1, 6) => run::<6, 24>(w, kn, x, acc),
        (DType::Q5_1, 7) => run::<7, 24>(w, kn, x, acc),
        (DType::Q5_1, _) => run::<8, 24>(w, kn, x, acc),
        _ => unreachable!("not a legacy format: {dtype}"),
    }
}

use super::avx2::prefetch;

/// Broadcasts the four activation bytes at `p` to every 32-bit lane.
#[inline(always)]
unsafe fn bcast4(p: *const i8) -> __m256i {
    _mm256_set1_epi32(std::ptr::read_unaligned(p as *const i32))
}

/// As `avx2::high_bits`.
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

/// One format (told apart by its block size `BB`) for `XR` activation rows.
#[inline(always)]
unsafe fn run<const XR: usize, const BB: usize>(w: &[u8], kn: usize, x: &XTile, acc: &mut [f32]) {
    let dtype = match BB {
        18 => DType::Q4_0,
        20 => DType::Q4_1,
        22 => DType::Q5_0,
        24 => DType::Q5_1,
        _ => DType::Q8_0,
    };
    let (m_off, h_off, q_off) = offsets(dtype);
    let q8 = dtype == DType::Q8_0;
    let five = h_off != 0;
    let has_min = m_off != 0;
    let m4 = _mm256_set1_epi8(0x0F);
    let m10 = _mm256_set1_epi8(0x10);
    let flip = _mm256_set1_epi8(-128);
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
        let mut even: [__m256i; XR] = std::array::from_fn(|r| {
            if has_min {
                _mm256_setzero_si256()
            } else {
                _mm256_set1_epi32(*xc.add(b * n + r))
            }
        });
        let mut odd = [_mm256_setzero_si256(); XR];
        for k in 0..8 {
            let g = if q8 {
                _mm256_xor_si256(
                    _mm256_loadu_si256(p.add(q_off + 32 * k) as *const __m256i),
                    flip,
                )
            } else {
                let raw = _mm256_loadu_si256(p.add(q_off + 32 * (k % 4)) as *const __m256i);
                let g = if k < 4 {
                    _mm256_and_si256(raw, m4)
                } else {
                    _mm256_and_si256(_mm256_srli_epi16::<4>(raw), m4)
                };
                if five {
                    _mm256_or_si256(g, _mm256_and_si256(high_bits(h, k), m10))
                } else {
                    g
                }
            };
            for r in 0..XR {
                let xb = bcast4(xq.add((b * n + r) * QK + 4 * k));
                if k % 2 == 0 || XR >= 4 {
                    even[r] = _mm256_dpbusd_epi32(even[r], g, xb);
                } else {
                    odd[r] = _mm256_dpbusd_epi32(odd[r], g, xb);
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
            let dot = if XR >= 4 {
                even[r]
            } else {
                _mm256_add_epi32(even[r], odd[r])
            };
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
