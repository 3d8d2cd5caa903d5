//! AVX512-VNNI (256-bit) kernels for the K-quant formats, used on `Isa::Avx2` CPUs that also
//! have AVX512-VNNI and AVX512-VL: the same layouts and the same integer sums as the AVX2
//! kernels, but `vpdpbusd` multiplies codes by activation bytes and accumulates 32-bit sums in
//! one instruction (no 16-bit overflow, so one accumulator per sub-block), and the sub-block
//! scales are applied with one 32-bit multiply per sub-block. Tiles of up to 8 activation rows
//! use the 32 vector registers of AVX-512: per row, one integer sum per super-block and the
//! partial sums of the current sub-block pair; the f32 sums live in the output tile in memory
//! (one load and store per row and super-block), and the loop over a super-block's groups
//! (units for Q6_K) has an opaque trip count so that the compiler keeps it a loop rather than
//! hoisting every code load of the super-block and spilling the sums.

// Tile loops index several per-row register arrays at once.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::avx2::{
    bcast4, fifth_bits, load, nibbles, prefetch, q45_min_pairs, q45_scale_bytes, q6_codes,
    q6_scale32, word_pairs,
};
use super::{packed_block_bytes, ACT_BLOCK, ACT_BSUMS, ACT_BSUMS32, ACT_QS, GROUP};
use crate::quant::DType;

/// Largest activation tile of these kernels.
pub(super) const TILE: usize = 8;

/// See `k_quants::kernel`.
///
/// # Safety
/// The CPU must support AVX2, FMA, F16C and AVX-512 F/VL/VNNI (`Isa::vnni`). `wg` must hold whole packed super-blocks of `dtype`, and
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
        DType::Q4K => tiles!(q4k),
        DType::Q5K => tiles!(q5k),
        DType::Q6K => tiles!(q6k),
        _ => unreachable!("k_quants vnni: {dtype}"),
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

/// The first step of a Q4_K/Q5_K super-block for each activation row `r` of the tile, on the
/// f32 sums at `out + 8r`: `acc -= (dmin·d_x)·Σ_j min_j·bsums32_j` (it does not depend on the
/// codes, so it runs before them and overlaps with them).
#[inline(always)]
unsafe fn apply_mins<const R: usize>(
    out: *mut f32,
    sb: *const u8,
    ab: *const u8,
    mn: &[__m256i; 4],
) {
    let dmin = _mm256_cvtph_ps(_mm_loadu_si128(sb.add(16) as *const __m128i));
    for r in 0..R {
        let o = out.add(GROUP * r);
        let a = ab.add(ACT_BLOCK * r);
        let dx = _mm256_set1_ps((a as *const f32).read_unaligned());
        let b = a.add(ACT_BSUMS32);
        let mut summ = _mm256_setzero_si256();
        for (g, m) in mn.iter().enumerate() {
            summ = _mm256_dpwssd_epi32(summ, *m, bcast4(b.add(4 * g)));
        }
        let acc = _mm256_loadu_ps(o);
        let acc = _mm256_sub_ps(
            acc,
            _mm256_mul_ps(_mm256_mul_ps(dmin, dx), _mm256_cvtepi32_ps(summ)),
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
    let o = out.as_mut_ptr() as *mut f32;
    // An opaque trip count keeps the group loop a loop: fully unrolled, the compiler
    // schedules every code load of the super-block first and spills the tile's sums.
    let groups = std::hint::black_box(4usize);
    for s in 0..nsb {
        let sb = w.add(s * 1152);
        if R > 1 {
            prefetch(sb, 1152);
        }
        let ab = a.add(s * stride);
        let bytes = q45_scale_bytes(sb.add(32));
        apply_mins::<R>(o, sb, ab, &q45_min_pairs(&bytes));
        let scales: [__m256i; 8] = std::array::from_fn(|j| q45_scale32(&bytes, j));
        let mut sumi = [_mm256_setzero_si256(); R];
        // Group g: sub-blocks 2g (low nibbles) and 2g + 1 (high nibbles).
        for g in 0..groups {
            let codes = sb.add(128 + 256 * g);
            let x = ab.add(ACT_QS + 64 * g);
            let mut plo = [_mm256_setzero_si256(); R];
            let mut phi = [_mm256_setzero_si256(); R];
            for c in 0..8 {
                let (lo, hi) = nibbles(load(codes.add(32 * c)));
                for r in 0..R {
                    plo[r] = dot(plo[r], lo, x.add(ACT_BLOCK * r + 4 * c));
                    phi[r] = dot(phi[r], hi, x.add(ACT_BLOCK * r + 32 + 4 * c));
                }
            }
            add_scaled(&mut sumi, &plo, scales[2 * g]);
            add_scaled(&mut sumi, &phi, scales[2 * g + 1]);
        }
        finish(o, sb, ab, &sumi, None);
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn q5k<const R: usize>(
    w: *const u8,
    a: *const u8,
    stride: usize,
    nsb: usize,
    out: &mut [[f32; GROUP]],
) {
    debug_assert_eq!(out.len(), R);
    let o = out.as_mut_ptr() as *mut f32;
    // An opaque trip count keeps the group loop a loop (see `q4k`).
    let groups = std::hint::black_box(4usize);
    for s in 0..nsb {
        let sb = w.add(s * 1408);
        if R > 1 {
            prefetch(sb, 1408);
        }
        let ab = a.add(s * stride);
        let bytes = q45_scale_bytes(sb.add(32));
        let scales: [__m256i; 8] = std::array::from_fn(|j| q45_scale32(&bytes, j));
        let mut sumi = [_mm256_setzero_si256(); R];
        for g in 0..groups {
            let gp = sb.add(128 + 320 * g);
            let x = ab.add(ACT_QS + 64 * g);
            let mut plo = [_mm256_setzero_si256(); R];
            let mut phi = [_mm256_setzero_si256(); R];
            for half in 0..2 {
                let mut hb = load(gp.add(256 + 32 * half));
                for c in 4 * half..4 * half + 4 {
                    let (lo, hi) = nibbles(load(gp.add(32 * c)));
                    let (lo, hi) = fifth_bits(lo, hi, hb);
                    hb = _mm256_srli_epi16(hb, 1);
                    for r in 0..R {
                        plo[r] = dot(plo[r], lo, x.add(ACT_BLOCK * r + 4 * c));
                        phi[r] = dot(phi[r], hi, x.add(ACT_BLOCK * r + 32 + 4 * c));
                    }
                }
            }
            add_scaled(&mut sumi, &plo, scales[2 * g]);
            add_scaled(&mut sumi, &phi, scales[2 * g + 1]);
        }
        finish(o, sb, ab, &sumi, Some(&q45_min_pairs(&bytes)));
    }
}

/// Q6_K: `sumi −= 32·Σ scale_k·bsums_k` over unit `p`'s two sub-blocks, per activation row.
#[inline(always)]
unsafe fn q6_corr<const R: usize>(sumi: &mut [__m256i; R], sb: *const u8, ab: *const u8, p: usize) {
    let pair = word_pairs(q6_scale32(sb, 2 * p), q6_scale32(sb, 2 * p + 1));
    let neg = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(pair, 5));
    for r in 0..R {
        let b = bcast4(ab.add(ACT_BLOCK * r + ACT_BSUMS + 4 * p));
        sumi[r] = _mm256_dpwssd_epi32(sumi[r], neg, b);
    }
}

/// Q6_K code registers `v` (even) and `v + 1` of a unit (sharing top-bit register `h`) times
/// the tile's activations at `x` (the unit's first code of row 0): `pa` (the unit's first
/// sub-block) and `pb` (its second) `+= Σ q·x`.
#[inline(always)]
unsafe fn q6k_pair<const R: usize>(
    pa: &mut [__m256i; R],
    pb: &mut [__m256i; R],
    up: *const u8,
    x: *const u8,
    v: usize,
) {
    let h = load(up.add(128 + 16 * v));
    let (lo, hi) = q6_codes(load(up.add(32 * v)), h, 0);
    for r in 0..R {
        pa[r] = dot(pa[r], lo, x.add(ACT_BLOCK * r + 4 * v));
        pb[r] = dot(pb[r], hi, x.add(ACT_BLOCK * r + 16 + 4 * v));
    }
    let (lo, hi) = q6_codes(load(up.add(32 * v + 32)), h, 1);
    for r in 0..R {
        pa[r] = dot(pa[r], lo, x.add(ACT_BLOCK * r + 4 * v + 4));
        pb[r] = dot(pb[r], hi, x.add(ACT_BLOCK * r + 16 + 4 * v + 4));
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn q6k<const R: usize>(
    w: *const u8,
    a: *const u8,
    stride: usize,
    nsb: usize,
    out: &mut [[f32; GROUP]],
) {
    debug_assert_eq!(out.len(), R);
    let o = out.as_mut_ptr() as *mut f32;
    // An opaque trip count keeps the unit loop a loop (see `q4k`).
    let units = std::hint::black_box(8usize);
    for s in 0..nsb {
        let sb = w.add(s * 1680);
        if R > 1 {
            prefetch(sb, 1680);
        }
        let ab = a.add(s * stride);
        // sumi = Σ_k scale_k·(Σ q·x − 32·bsums_k), the corrections by pairs of sub-blocks with
        // the 16-bit scales −32·scale_k (exact integers: the order is free). Large tiles take
        // them in a loop of their own, which leaves the code loop lighter.
        let mut sumi = [_mm256_setzero_si256(); R];
        if R >= 6 {
            for p in 0..units {
                q6_corr(&mut sumi, sb, ab, p);
            }
        }
        for p in 0..units {
            if R < 6 {
                q6_corr(&mut sumi, sb, ab, p);
            }
            let (sa, sc) = (q6_scale32(sb, 2 * p), q6_scale32(sb, 2 * p + 1));
            let up = sb.add(144 + 192 * p);
            let x = ab.add(ACT_QS + 32 * p);
            let mut pa = [_mm256_setzero_si256(); R];
            let mut pb = [_mm256_setzero_si256(); R];
            q6k_pair(&mut pa, &mut pb, up, x, 0);
            q6k_pair(&mut pa, &mut pb, up, x, 2);
            add_scaled(&mut sumi, &pa, sa);
            add_scaled(&mut sumi, &pb, sc);
        }
        finish(o, sb, ab, &sumi, None);
    }
}
