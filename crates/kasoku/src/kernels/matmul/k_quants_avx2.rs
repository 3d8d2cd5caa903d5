//! AVX2 kernels for the K-quant formats: one packed 8-row group times up to 4 activation rows,
//! the same arithmetic as the portable kernel in `k_quants.rs` (see its documentation for the
//! layouts). Each code register is unpacked once and multiplied (`maddubs`) with every
//! activation row of the tile; 16-bit partial sums are widened and scaled with one `madd` per
//! pair of sub-blocks before they could overflow.

use std::arch::x86_64::*;

use super::{packed_block_bytes, ACT_BLOCK, ACT_BSUMS, ACT_BSUMS32, ACT_QS, GROUP};
use crate::quant::DType;

/// See `k_quants::kernel`.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C. `wg` must hold whole packed super-blocks of
/// `dtype`, and `acts` `out.len()` rows of `row_acts` bytes, each with one activation block
/// per super-block of `wg`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn kernel(
    dtype: DType,
    wg: &[u8],
    acts: &[u8],
    row_acts: usize,
    out: &mut [[f32; GROUP]],
) {
    let nsb = wg.len() / packed_block_bytes(dtype);
    assert!(acts.len() >= out.len() * row_acts && row_acts >= nsb * ACT_BLOCK);
    let w = wg.as_ptr();
    let a = acts.as_ptr();
    match (dtype, out.len()) {
        (DType::Q4K, 1) => store(q4k::<1>(w, a, row_acts, nsb), out),
        (DType::Q4K, 2) => store(q4k::<2>(w, a, row_acts, nsb), out),
        (DType::Q4K, 3) => store(q4k::<3>(w, a, row_acts, nsb), out),
        (DType::Q4K, 4) => store(q4k::<4>(w, a, row_acts, nsb), out),
        (DType::Q5K, 1) => store(q5k::<1>(w, a, row_acts, nsb), out),
        (DType::Q5K, 2) => store(q5k::<2>(w, a, row_acts, nsb), out),
        (DType::Q5K, 3) => store(q5k::<3>(w, a, row_acts, nsb), out),
        (DType::Q5K, 4) => store(q5k::<4>(w, a, row_acts, nsb), out),
        (DType::Q6K, 1) => store(q6k::<1>(w, a, row_acts, nsb), out),
        (DType::Q6K, 2) => store(q6k::<2>(w, a, row_acts, nsb), out),
        (DType::Q6K, 3) => store(q6k::<3>(w, a, row_acts, nsb), out),
        (DType::Q6K, 4) => store(q6k::<4>(w, a, row_acts, nsb), out),
        _ => unreachable!("k_quants avx2: {dtype} with {} activation rows", out.len()),
    }
}

#[target_feature(enable = "avx2")]
unsafe fn store<const R: usize>(acc: [__m256; R], out: &mut [[f32; GROUP]]) {
    for (o, v) in out.iter_mut().zip(acc) {
        _mm256_storeu_ps(o.as_mut_ptr(), v);
    }
}

#[inline(always)]
unsafe fn load(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

/// Four bytes at `p` broadcast to every 32-bit lane.
#[inline(always)]
unsafe fn bcast4(p: *const u8) -> __m256i {
    _mm256_set1_epi32((p as *const i32).read_unaligned())
}

/// `d_w` (8 f16 at `p`) times the activation scale at `a`, per lane.
#[inline(always)]
unsafe fn scale_ps(p: *const u8, a: *const u8) -> __m256 {
    let d = _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
    _mm256_mul_ps(d, _mm256_set1_ps((a as *const f32).read_unaligned()))
}

/// `pshufb` masks giving, per 32-bit lane `i`, the 16-bit pair (byte `4k + i%4`, byte
/// `4k + 4 + i%4`) of the lane's 128-bit half, for k = 0 (sub-blocks 0, 1 of a half) and 2.
#[inline(always)]
unsafe fn pair_masks() -> (__m256i, __m256i) {
    let z = -128i8;
    let m0 = _mm256_setr_epi8(
        0, z, 4, z, 1, z, 5, z, 2, z, 6, z, 3, z, 7, z, 0, z, 4, z, 1, z, 5, z, 2, z, 6, z, 3, z,
        7, z,
    );
    let m1 = _mm256_add_epi8(m0, _mm256_set1_epi16(8));
    (m0, m1)
}

/// Unpacks the 96 scale bytes of a packed Q4_K/Q5_K super-block at `p` into, for each 64-value
/// group `g`, the 16-bit (scale 2g, scale 2g+1) and (min 2g, min 2g+1) pairs of the eight rows.
#[inline(always)]
unsafe fn q45_scales(p: *const u8) -> ([__m256i; 4], [__m256i; 4]) {
    let m0f = _mm256_set1_epi8(0x0F);
    let m30 = _mm256_set1_epi8(0x30);
    let l0 = load(p);
    let l1 = load(p.add(32));
    let h = load(p.add(64));
    let s0 = _mm256_or_si256(
        _mm256_and_si256(l0, m0f),
        _mm256_and_si256(_mm256_slli_epi16(h, 4), m30),
    );
    let m0 = _mm256_or_si256(
        _mm256_and_si256(_mm256_srli_epi16(l0, 4), m0f),
        _mm256_and_si256(_mm256_slli_epi16(h, 2), m30),
    );
    let s1 = _mm256_or_si256(_mm256_and_si256(l1, m0f), _mm256_and_si256(h, m30));
    let m1 = _mm256_or_si256(
        _mm256_and_si256(_mm256_srli_epi16(l1, 4), m0f),
        _mm256_and_si256(_mm256_srli_epi16(h, 2), m30),
    );
    let (k0, k1) = pair_masks();
    let sc = [
        _mm256_shuffle_epi8(s0, k0),
        _mm256_shuffle_epi8(s0, k1),
        _mm256_shuffle_epi8(s1, k0),
        _mm256_shuffle_epi8(s1, k1),
    ];
    let mn = [
        _mm256_shuffle_epi8(m0, k0),
        _mm256_shuffle_epi8(m0, k1),
        _mm256_shuffle_epi8(m1, k0),
        _mm256_shuffle_epi8(m1, k1),
    ];
    (sc, mn)
}

/// `acc -= (dmin·d_x)·Σ_j min_j·bsums32_j` for each activation row of the tile.
#[inline(always)]
unsafe fn apply_mins<const R: usize>(
    acc: &mut [__m256; R],
    sb: *const u8,
    ab: &[*const u8; R],
    mn: &[__m256i; 4],
) {
    for r in 0..R {
        let b = ab[r].add(ACT_BSUMS32);
        let mut summ = _mm256_madd_epi16(mn[0], bcast4(b));
        for (g, m) in mn.iter().enumerate().skip(1) {
            summ = _mm256_add_epi32(summ, _mm256_madd_epi16(*m, bcast4(b.add(4 * g))));
        }
        let dm = scale_ps(sb.add(16), ab[r]);
        acc[r] = _mm256_sub_ps(acc[r], _mm256_mul_ps(dm, _mm256_cvtepi32_ps(summ)));
    }
}

/// `acc += (d·d_x)·sumi` for each activation row of the tile.
#[inline(always)]
unsafe fn apply_sums<const R: usize>(
    acc: &mut [__m256; R],
    sb: *const u8,
    ab: &[*const u8; R],
    sumi: &[__m256i; R],
) {
    for r in 0..R {
        let dd = scale_ps(sb, ab[r]);
        acc[r] = _mm256_add_ps(acc[r], _mm256_mul_ps(dd, _mm256_cvtepi32_ps(sumi[r])));
    }
}

#[inline(always)]
unsafe fn act_ptrs<const R: usize>(a: *const u8, row_acts: usize, s: usize) -> [*const u8; R] {
    std::array::from_fn(|r| a.add(r * row_acts + s * ACT_BLOCK))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4k<const R: usize>(
    w: *const u8,
    a: *const u8,
    row_acts: usize,
    nsb: usize,
) -> [__m256; R] {
    let m0f = _mm256_set1_epi8(0x0F);
    let mut acc = [_mm256_setzero_ps(); R];
    for s in 0..nsb {
        let sb = w.add(s * 1152);
        let ab = act_ptrs::<R>(a, row_acts, s);
        let (sc, mn) = q45_scales(sb.add(32));
        apply_mins(&mut acc, sb, &ab, &mn);
        let mut sumi = [_mm256_setzero_si256(); R];
        for (g, scg) in sc.iter().enumerate() {
            for half in 0..2 {
                // Four code registers (eight maddubs): at most 8·2·15·127 < 2^15 per i16.
                let mut p16 = [_mm256_setzero_si256(); R];
                for c in 4 * half..4 * half + 4 {
                    let v = load(sb.add(128 + 256 * g + 32 * c));
                    let lo = _mm256_and_si256(v, m0f);
                    let hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m0f);
                    let off = ACT_QS + 64 * g + 8 * c;
                    for r in 0..R {
                        let x = ab[r].add(off);
                        p16[r] = _mm256_add_epi16(p16[r], _mm256_maddubs_epi16(lo, bcast4(x)));
                        p16[r] =
                            _mm256_add_epi16(p16[r], _mm256_maddubs_epi16(hi, bcast4(x.add(4))));
                    }
                }
                for r in 0..R {
                    sumi[r] = _mm256_add_epi32(sumi[r], _mm256_madd_epi16(p16[r], *scg));
                }
            }
        }
        apply_sums(&mut acc, sb, &ab, &sumi);
    }
    acc
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5k<const R: usize>(
    w: *const u8,
    a: *const u8,
    row_acts: usize,
    nsb: usize,
) -> [__m256; R] {
    let m0f = _mm256_set1_epi8(0x0F);
    let m10 = _mm256_set1_epi8(0x10);
    let mut acc = [_mm256_setzero_ps(); R];
    for s in 0..nsb {
        let sb = w.add(s * 1408);
        let ab = act_ptrs::<R>(a, row_acts, s);
        let (sc, mn) = q45_scales(sb.add(32));
        apply_mins(&mut acc, sb, &ab, &mn);
        let mut sumi = [_mm256_setzero_si256(); R];
        for (g, scg) in sc.iter().enumerate() {
            let gp = sb.add(128 + 320 * g);
            for quarter in 0..4 {
                // Two code registers (four maddubs): at most 4·2·31·127 < 2^15 per i16.
                let mut hb = load(gp.add(256 + 32 * (quarter / 2)));
                if quarter % 2 == 1 {
                    hb = _mm256_srli_epi16(hb, 2);
                }
                let mut p16 = [_mm256_setzero_si256(); R];
                for c in 2 * quarter..2 * quarter + 2 {
                    let v = load(gp.add(32 * c));
                    let lo = _mm256_or_si256(
                        _mm256_and_si256(v, m0f),
                        _mm256_and_si256(_mm256_slli_epi16(hb, 4), m10),
                    );
                    let hi = _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16(v, 4), m0f),
                        _mm256_and_si256(hb, m10),
                    );
                    hb = _mm256_srli_epi16(hb, 1);
                    let off = ACT_QS + 64 * g + 8 * c;
                    for r in 0..R {
                        let x = ab[r].add(off);
                        p16[r] = _mm256_add_epi16(p16[r], _mm256_maddubs_epi16(lo, bcast4(x)));
                        p16[r] =
                            _mm256_add_epi16(p16[r], _mm256_maddubs_epi16(hi, bcast4(x.add(4))));
                    }
                }
                for r in 0..R {
                    sumi[r] = _mm256_add_epi32(sumi[r], _mm256_madd_epi16(p16[r], *scg));
                }
            }
        }
        apply_sums(&mut acc, sb, &ab, &sumi);
    }
    acc
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6k<const R: usize>(
    w: *const u8,
    a: *const u8,
    row_acts: usize,
    nsb: usize,
) -> [__m256; R] {
    let m0f = _mm256_set1_epi8(0x0F);
    let m30 = _mm256_set1_epi8(0x30);
    let mut acc = [_mm256_setzero_ps(); R];
    for s in 0..nsb {
        let sb = w.add(s * 1680);
        let ab = act_ptrs::<R>(a, row_acts, s);
        let mut sumi = [_mm256_setzero_si256(); R];
        let mut corr = [_mm256_setzero_si256(); R];
        for k in 0..8 {
            let sc = _mm256_cvtepi8_epi16(_mm_loadu_si128(sb.add(16 + 16 * k) as *const __m128i));
            for r in 0..R {
                let b = bcast4(ab[r].add(ACT_BSUMS + 4 * k));
                corr[r] = _mm256_add_epi32(corr[r], _mm256_madd_epi16(sc, b));
            }
            let up = sb.add(144 + 192 * k);
            for v in 0..4 {
                let q = load(up.add(32 * v));
                let h = load(up.add(128 + 32 * (v / 2)));
                let (hl, hh) = if v % 2 == 0 {
                    (_mm256_slli_epi16(h, 4), _mm256_slli_epi16(h, 2))
                } else {
                    (h, _mm256_srli_epi16(h, 2))
                };
                let lo = _mm256_or_si256(_mm256_and_si256(q, m0f), _mm256_and_si256(hl, m30));
                let hi = _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(q, 4), m0f),
                    _mm256_and_si256(hh, m30),
                );
                let off = ACT_QS + 32 * k + 8 * v;
                for r in 0..R {
                    // Two maddubs: at most 2·2·63·127 < 2^15 per i16.
                    let x = ab[r].add(off);
                    let p16 = _mm256_add_epi16(
                        _mm256_maddubs_epi16(lo, bcast4(x)),
                        _mm256_maddubs_epi16(hi, bcast4(x.add(4))),
                    );
                    sumi[r] = _mm256_add_epi32(sumi[r], _mm256_madd_epi16(p16, sc));
                }
            }
        }
        for r in 0..R {
            sumi[r] = _mm256_sub_epi32(sumi[r], _mm256_slli_epi32(corr[r], 5));
        }
        apply_sums(&mut acc, sb, &ab, &sumi);
    }
    acc
}
