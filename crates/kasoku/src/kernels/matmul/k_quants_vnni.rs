//! AVX512-VNNI (256-bit) kernels for the K-quant formats, used on `Isa::Avx2` CPUs that also
//! have AVX512-VNNI and AVX512-VL: the same layouts and the same integer sums as the AVX2
//! kernels, but `vpdpbusd` multiplies codes by activation bytes and accumulates 32-bit sums in
//! one instruction (no 16-bit overflow, so one accumulator per sub-block), and the sub-block
//! scales are applied with one 32-bit multiply per sub-block. Tiles of up to 8 activation rows
//! use the 32 vector registers of AVX-512.

// Tile loops index several per-row register arrays at once.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::avx2::{
    apply_sums, bcast4, fifth_bits, load, nibbles, prefetch, q45_min_pairs, q45_scale_bytes,
    q6_codes, q6_scale32, store, sub_scaled, word_pairs,
};
use super::{packed_block_bytes, ACT_BLOCK, ACT_BSUMS, ACT_BSUMS32, ACT_QS, GROUP};
use crate::quant::DType;

/// Largest activation tile of these kernels.
pub(super) const TILE: usize = 8;

/// Whether this CPU runs these kernels.
pub(super) fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx512vnni")
        && std::arch::is_x86_feature_detected!("avx512vl")
        && std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("f16c")
}

/// See `k_quants::kernel`.
///
/// # Safety
/// The CPU must pass [`available`]. `wg` must hold whole packed super-blocks of `dtype`, and
/// `acts` the activation blocks of `out.len()` rows for each
/// super-block of `wg`, super-block `s` at `s·stride`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
pub(super) unsafe fn kernel(
    dtype: DType,
    wg: &[u8],
    acts: &[u8],
    stride: usize,
    out: &mut [[f32; GROUP]],
) {
    let nsb = wg.len() / packed_block_bytes(dtype);
    assert!(nsb > 0 && acts.len() >= (nsb - 1) * stride + out.len() * ACT_BLOCK);
    let w = wg.as_ptr();
    let a = acts.as_ptr();
    macro_rules! tiles {
        ($f:ident) => {
            match out.len() {
                1 => store($f::<1>(w, a, stride, nsb), out),
                2 => store($f::<2>(w, a, stride, nsb), out),
                3 => store($f::<3>(w, a, stride, nsb), out),
                4 => store($f::<4>(w, a, stride, nsb), out),
                5 => store($f::<5>(w, a, stride, nsb), out),
                6 => store($f::<6>(w, a, stride, nsb), out),
                7 => store($f::<7>(w, a, stride, nsb), out),
                8 => store($f::<8>(w, a, stride, nsb), out),
                n => unreachable!("k_quants vnni: tile of {n} rows"),
            }
        };
    }
    macro_rules! tiles_out {
        ($f:ident) => {
            match out.len() {
                1 => $f::<1>(w, a, stride, nsb, out),
                2 => $f::<2>(w, a, stride, nsb, out),
                3 => $f::<3>(w, a, stride, nsb, out),
                4 => $f::<4>(w, a, stride, nsb, out),
                5 => $f::<5>(w, a, stride, nsb, out),
                6 => $f::<6>(w, a, stride, nsb, out),
                7 => $f::<7>(w, a, stride, nsb, out),
                8 => $f::<8>(w, a, stride, nsb, out),
                n => unreachable!("k_quants vnni: tile of {n} rows"),
            }
        };
    }
    match dtype {
        DType::Q4K => tiles_out!(q4k),
        DType::Q5K => tiles!(q5k),
        DType::Q6K => tiles!(q6k),
        _ => unreachable!("k_quants vnni: {dtype}"),
    }
}

/// `acc -= (dmin·d_x)·Σ_j min_j·bsums32_j` for each activation row of the tile.
#[inline(always)]
unsafe fn apply_mins<const R: usize>(
    acc: &mut [__m256; R],
    sb: *const u8,
    ab: *const u8,
    mn: &[__m256i; 4],
) {
    let dmin = _mm256_cvtph_ps(_mm_loadu_si128(sb.add(16) as *const __m128i));
    for (r, acc) in acc.iter_mut().enumerate() {
        let b = ab.add(ACT_BLOCK * r + ACT_BSUMS32);
        let mut summ = _mm256_setzero_si256();
        for (g, m) in mn.iter().enumerate() {
            summ = _mm256_dpwssd_epi32(summ, *m, bcast4(b.add(4 * g)));
        }
        *acc = sub_scaled(*acc, dmin, ab.add(ACT_BLOCK * r), summ);
    }
}

/// Q6_K: `corr += Σ_k scale_k·bsums_k` over a unit's two sub-blocks, per activation row.
#[inline(always)]
unsafe fn q6_corr<const R: usize>(corr: &mut [__m256i; R], pair: __m256i, ab: *const u8, p: usize) {
    for (r, c) in corr.iter_mut().enumerate() {
        *c = _mm256_dpwssd_epi32(*c, pair, bcast4(ab.add(ACT_BLOCK * r + ACT_BSUMS + 4 * p)));
    }
}

#[inline(always)]
unsafe fn dot(acc: __m256i, codes: __m256i, x: *const u8) -> __m256i {
    _mm256_dpbusd_epi32(acc, codes, bcast4(x))
}

/// `pshufb` mask giving, per 32-bit lane `i`, byte `a + i%4` of the lane's 128-bit half as
/// an i32.
#[inline(always)]
unsafe fn dword_mask(a: i8) -> __m256i {
    let z = -128i8;
    _mm256_setr_epi8(
        a,
        z,
        z,
        z,
        a + 1,
        z,
        z,
        z,
        a + 2,
        z,
        z,
        z,
        a + 3,
        z,
        z,
        z,
        a,
        z,
        z,
        z,
        a + 1,
        z,
        z,
        z,
        a + 2,
        z,
        z,
        z,
        a + 3,
        z,
        z,
        z,
    )
}

/// The 6-bit scales of sub-blocks 2g and 2g+1 of a Q4_K/Q5_K super-block as i32 lanes.
#[inline(always)]
unsafe fn q45_scales32(bytes: &[__m256i; 4], g: usize) -> (__m256i, __m256i) {
    let b = bytes[g / 2];
    let a = 8 * (g % 2) as i8;
    (
        _mm256_shuffle_epi8(b, dword_mask(a)),
        _mm256_shuffle_epi8(b, dword_mask(a + 4)),
    )
}

/// The 6-bit scale of sub-block `j` of a Q4_K/Q5_K super-block as i32 lanes.
#[inline(always)]
unsafe fn q45_scale32(bytes: &[__m256i; 4], j: usize) -> __m256i {
    _mm256_shuffle_epi8(bytes[j / 4], dword_mask(4 * (j % 4) as i8))
}

/// `sumi += scale · p` for each activation row of the tile.
#[inline(always)]
unsafe fn add_scaled<const R: usize>(sumi: &mut [__m256i; R], p: &[__m256i; R], scale: __m256i) {
    for r in 0..R {
        sumi[r] = _mm256_add_epi32(sumi[r], _mm256_mullo_epi32(p[r], scale));
    }
}

/// The end of a super-block for each activation row `r` of the tile, on the f32 sums kept in
/// memory at `out + 8r` (freeing registers for the integer sums):
/// `acc -= (dmin·d_x)·Σ_j min_j·bsums32_j` (when `mins` is given), then `acc += (d·d_x)·sumi`.
#[inline(always)]
unsafe fn finish<const R: usize>(
    out: *mut f32,
    sb: *const u8,
    ab: *const u8,
    sumi: &[__m256i; R],
    mins: Option<&[__m256i; 4]>,
) {
    let d = _mm256_cvtph_ps(_mm_loadu_si128(sb as *const __m128i));
    for r in 0..R {
        let o = out.add(GROUP * r);
        let a = ab.add(ACT_BLOCK * r);
        let dx = _mm256_set1_ps((a as *const f32).read_unaligned());
        let mut acc = _mm256_loadu_ps(o);
        if let Some(mn) = mins {
            let dmin = _mm256_cvtph_ps(_mm_loadu_si128(sb.add(16) as *const __m128i));
            let b = a.add(ACT_BSUMS32);
            let mut summ = _mm256_setzero_si256();
            for (g, m) in mn.iter().enumerate() {
                summ = _mm256_dpwssd_epi32(summ, *m, bcast4(b.add(4 * g)));
            }
            acc = _mm256_sub_ps(
                acc,
                _mm256_mul_ps(_mm256_mul_ps(dmin, dx), _mm256_cvtepi32_ps(summ)),
            );
        }
        acc = _mm256_add_ps(
            acc,
            _mm256_mul_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(sumi[r])),
        );
        _mm256_storeu_ps(o, acc);
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn q4k<const R: usize>(
    w: *const u8,
    a: *const u8,
    stride: usize,
    nsb: usize,
    out: &mut [[f32; GROUP]],
) {
    debug_assert_eq!(out.len(), R);
    out.fill([0.0; GROUP]);
    let o = out.as_mut_ptr() as *mut f32;
    let m0f = _mm256_set1_epi8(0x0F);
    // An opaque trip count keeps the sub-block loop a loop: fully unrolled, the compiler
    // schedules every code load of the super-block first and spills the tile's sums.
    let subs = std::hint::black_box(8usize);
    for s in 0..nsb {
        let sb = w.add(s * 1152);
        if R > 1 {
            prefetch(sb, 1152);
        }
        let ab = a.add(s * stride);
        let bytes = q45_scale_bytes(sb.add(32));
        let scales: [__m256i; 8] = std::array::from_fn(|j| q45_scale32(&bytes, j));
        let mut sumi = [_mm256_setzero_si256(); R];
        // Sub-block j = 2g + h: nibble h of group g's eight code registers.
        for j in 0..subs {
            let codes = sb.add(128 + 256 * (j / 2));
            let shift = _mm_cvtsi32_si128(4 * (j % 2) as i32);
            let x = ab.add(ACT_QS + 32 * j);
            let mut p = [_mm256_setzero_si256(); R];
            for c in 0..8 {
                let q = _mm256_and_si256(_mm256_srl_epi16(load(codes.add(32 * c)), shift), m0f);
                for r in 0..R {
                    p[r] = dot(p[r], q, x.add(ACT_BLOCK * r + 4 * c));
                }
            }
            add_scaled(&mut sumi, &p, scales[j]);
        }
        finish(o, sb, ab, &sumi, Some(&q45_min_pairs(&bytes)));
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn q5k<const R: usize>(
    w: *const u8,
    a: *const u8,
    stride: usize,
    nsb: usize,
) -> [__m256; R] {
    let mut acc = [_mm256_setzero_ps(); R];
    for s in 0..nsb {
        let sb = w.add(s * 1408);
        if R > 1 {
            prefetch(sb, 1408);
        }
        let ab = a.add(s * stride);
        let bytes = q45_scale_bytes(sb.add(32));
        apply_mins(&mut acc, sb, ab, &q45_min_pairs(&bytes));
        let mut sumi = [_mm256_setzero_si256(); R];
        for g in 0..4 {
            let gp = sb.add(128 + 320 * g);
            let mut plo = [_mm256_setzero_si256(); R];
            let mut phi = [_mm256_setzero_si256(); R];
            for half in 0..2 {
                let mut hb = load(gp.add(256 + 32 * half));
                for c in 4 * half..4 * half + 4 {
                    let (lo, hi) = nibbles(load(gp.add(32 * c)));
                    let (lo, hi) = fifth_bits(lo, hi, hb);
                    hb = _mm256_srli_epi16(hb, 1);
                    for r in 0..R {
                        let x = ab.add(ACT_BLOCK * r + ACT_QS + 64 * g + 4 * c);
                        plo[r] = dot(plo[r], lo, x);
                        phi[r] = dot(phi[r], hi, x.add(32));
                    }
                }
            }
            let (slo, shi) = q45_scales32(&bytes, g);
            for r in 0..R {
                let t = _mm256_add_epi32(
                    _mm256_mullo_epi32(plo[r], slo),
                    _mm256_mullo_epi32(phi[r], shi),
                );
                sumi[r] = _mm256_add_epi32(sumi[r], t);
            }
        }
        apply_sums(&mut acc, sb, ab, &sumi);
    }
    acc
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn q6k<const R: usize>(
    w: *const u8,
    a: *const u8,
    stride: usize,
    nsb: usize,
) -> [__m256; R] {
    let mut acc = [_mm256_setzero_ps(); R];
    for s in 0..nsb {
        let sb = w.add(s * 1680);
        if R > 1 {
            prefetch(sb, 1680);
        }
        let ab = a.add(s * stride);
        let mut sumi = [_mm256_setzero_si256(); R];
        let mut corr = [_mm256_setzero_si256(); R];
        for p in 0..8 {
            let (sa, sc) = (q6_scale32(sb, 2 * p), q6_scale32(sb, 2 * p + 1));
            q6_corr(&mut corr, word_pairs(sa, sc), ab, p);
            let up = sb.add(144 + 192 * p);
            let mut pa = [_mm256_setzero_si256(); R];
            let mut pb = [_mm256_setzero_si256(); R];
            for v in 0..4 {
                let (lo, hi) = q6_codes(load(up.add(32 * v)), load(up.add(128 + 32 * (v / 2))), v);
                for r in 0..R {
                    let x = ab.add(ACT_BLOCK * r + ACT_QS + 32 * p + 4 * v);
                    pa[r] = dot(pa[r], lo, x);
                    pb[r] = dot(pb[r], hi, x.add(16));
                }
            }
            for r in 0..R {
                let t =
                    _mm256_add_epi32(_mm256_mullo_epi32(pa[r], sa), _mm256_mullo_epi32(pb[r], sc));
                sumi[r] = _mm256_add_epi32(sumi[r], t);
            }
        }
        for r in 0..R {
            sumi[r] = _mm256_sub_epi32(sumi[r], _mm256_slli_epi32(corr[r], 5));
        }
        apply_sums(&mut acc, sb, ab, &sumi);
    }
    acc
}
