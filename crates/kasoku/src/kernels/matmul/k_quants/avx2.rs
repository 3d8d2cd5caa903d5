//! AVX2 kernels for the K-quant formats: one packed 8-row group times up to 4 activation rows
//! (adding to the tile's running sums),
//! the same arithmetic as the portable kernel in `mod.rs` (see its documentation for the
//! layouts). Each code register is unpacked once and multiplied (`maddubs`) with every
//! activation row of the tile; 16-bit partial sums are widened and scaled with one `madd`
//! per sub-block before they could overflow. The helpers here are shared with the VNNI
//! kernels (`vnni.rs`).

// Tile loops index several per-row register arrays at once.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::{packed_block_bytes, ACT_BLOCK, ACT_BSUMS, ACT_BSUMS32, ACT_QS, GROUP};
use crate::quant::DType;

/// Largest activation tile of these kernels.
pub(super) const TILE: usize = 4;

/// See `k_quants::kernel`.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C. `wg` must hold whole packed super-blocks of
/// `dtype`, and `acts` the activation blocks of `out.len()` rows
/// for each super-block of `wg`, super-block `s` at `s·stride`.
#[target_feature(enable = "avx2,fma,f16c")]
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
                1 => store($f::<1>(w, a, stride, nsb, acc_of(out)), out),
                2 => store($f::<2>(w, a, stride, nsb, acc_of(out)), out),
                3 => store($f::<3>(w, a, stride, nsb, acc_of(out)), out),
                4 => store($f::<4>(w, a, stride, nsb, acc_of(out)), out),
                n => unreachable!("k_quants avx2: {dtype} with {n} activation rows"),
            }
        };
    }
    match dtype {
        DType::Q4K => tiles!(q4k),
        DType::Q5K => tiles!(q5k),
        DType::Q6K => tiles!(q6k),
        _ => unreachable!("k_quants avx2: {dtype}"),
    }
}

/// The running sums of a tile (`out`), as registers.
#[inline(always)]
unsafe fn acc_of<const R: usize>(out: &[[f32; GROUP]]) -> [__m256; R] {
    std::array::from_fn(|r| _mm256_loadu_ps(out[r].as_ptr()))
}

#[inline(always)]
pub(super) unsafe fn store<const R: usize>(acc: [__m256; R], out: &mut [[f32; GROUP]]) {
    for (o, v) in out.iter_mut().zip(acc) {
        _mm256_storeu_ps(o.as_mut_ptr(), v);
    }
}

#[inline(always)]
pub(super) unsafe fn load(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p as *const __m256i)
}

/// Packed super-blocks ahead of the current one that [`prefetch`] asks to have in L2.
const PREFETCH_L2: usize = 8;

/// Asks for the packed super-block `PREFETCH_L2` blocks after `sb` (of `bytes` bytes) to be
/// brought into L2: with several activation rows a super-block takes long enough that the
/// hardware prefetchers fall behind, and the far requests keep both cores' memory streams
/// going while they compute. Only into L2: also asking for the nearer blocks in L1 (distance
/// 2, `prefetcht0`) made the products slower, most at 2-4 rows (measured on 2 threads over
/// every matrix of Qwen2.5-Coder-1.5B Q4_K_M in forward order, configurations alternated:
/// 2 rows 32.2 → 21.9 ms, 4 rows 38.6 → 29.2 ms, 8 rows 59.4 → 55.9 ms; 1 row, which does not
/// prefetch, 22.1 ms). Distances 6 to 16 measured alike; `prefetcht2` and `prefetchnta`
/// were slower.
#[inline(always)]
pub(super) unsafe fn prefetch(sb: *const u8, bytes: usize) {
    for k in (0..bytes).step_by(64) {
        _mm_prefetch::<_MM_HINT_T1>(sb.wrapping_add(PREFETCH_L2 * bytes + k) as *const i8);
    }
}

/// Four bytes at `p` broadcast to every 32-bit lane.
#[inline(always)]
pub(super) unsafe fn bcast4(p: *const u8) -> __m256i {
    _mm256_set1_epi32((p as *const i32).read_unaligned())
}

/// `pshufb` mask giving, per 32-bit lane `i`, the bytes `a + i%4` and `b + i%4` of the lane's
/// 128-bit half as 16-bit values.
#[inline(always)]
unsafe fn word_mask(a: i8, b: i8) -> __m256i {
    let z = -128i8;
    _mm256_setr_epi8(
        a,
        z,
        b,
        z,
        a + 1,
        z,
        b + 1,
        z,
        a + 2,
        z,
        b + 2,
        z,
        a + 3,
        z,
        b + 3,
        z,
        a,
        z,
        b,
        z,
        a + 1,
        z,
        b + 1,
        z,
        a + 2,
        z,
        b + 2,
        z,
        a + 3,
        z,
        b + 3,
        z,
    )
}

/// The 6-bit scales and mins of a packed Q4_K/Q5_K super-block (96 bytes at `p`), as bytes at
/// `scale_pos` order: (scales of sub-blocks 0..4, scales 4..8, mins 0..4, mins 4..8).
#[inline(always)]
pub(super) unsafe fn q45_scale_bytes(p: *const u8) -> [__m256i; 4] {
    let m0f = _mm256_set1_epi8(0x0F);
    let m30 = _mm256_set1_epi8(0x30);
    let l0 = load(p);
    let l1 = load(p.add(32));
    let h = load(p.add(64));
    let s0 = _mm256_or_si256(
        _mm256_and_si256(l0, m0f),
        _mm256_and_si256(_mm256_slli_epi16(h, 4), m30),
    );
    let s1 = _mm256_or_si256(_mm256_and_si256(l1, m0f), _mm256_and_si256(h, m30));
    let m0 = _mm256_or_si256(
        _mm256_and_si256(_mm256_srli_epi16(l0, 4), m0f),
        _mm256_and_si256(_mm256_slli_epi16(h, 2), m30),
    );
    let m1 = _mm256_or_si256(
        _mm256_and_si256(_mm256_srli_epi16(l1, 4), m0f),
        _mm256_and_si256(_mm256_srli_epi16(h, 2), m30),
    );
    [s0, s1, m0, m1]
}

/// Per 64-value group `g`, the 16-bit (min 2g, min 2g+1) pairs of the eight rows.
#[inline(always)]
pub(super) unsafe fn q45_min_pairs(b: &[__m256i; 4]) -> [__m256i; 4] {
    let (k0, k1) = (word_mask(0, 4), word_mask(8, 12));
    [
        _mm256_shuffle_epi8(b[2], k0),
        _mm256_shuffle_epi8(b[2], k1),
        _mm256_shuffle_epi8(b[3], k0),
        _mm256_shuffle_epi8(b[3], k1),
    ]
}

/// `acc -= (dmin·d_x)·Σ_j min_j·bsums32_j` for each activation row of the tile (activation
/// blocks at `ab`).
#[inline(always)]
pub(super) unsafe fn apply_mins<const R: usize>(
    acc: &mut [__m256; R],
    sb: *const u8,
    ab: *const u8,
    mn: &[__m256i; 4],
) {
    let dmin = _mm256_cvtph_ps(_mm_loadu_si128(sb.add(16) as *const __m128i));
    for (r, acc) in acc.iter_mut().enumerate() {
        let b = ab.add(ACT_BLOCK * r + ACT_BSUMS32);
        let mut summ = _mm256_madd_epi16(mn[0], bcast4(b));
        for (g, m) in mn.iter().enumerate().skip(1) {
            summ = _mm256_add_epi32(summ, _mm256_madd_epi16(*m, bcast4(b.add(4 * g))));
        }
        *acc = sub_scaled(*acc, dmin, ab.add(ACT_BLOCK * r), summ);
    }
}

/// `acc − (dmin·d_x)·summ`, with `d_x` the f32 at `a`.
#[inline(always)]
pub(super) unsafe fn sub_scaled(acc: __m256, dmin: __m256, a: *const u8, summ: __m256i) -> __m256 {
    let dm = _mm256_mul_ps(dmin, _mm256_set1_ps((a as *const f32).read_unaligned()));
    _mm256_sub_ps(acc, _mm256_mul_ps(dm, _mm256_cvtepi32_ps(summ)))
}

/// `acc += (d·d_x)·sumi` for each activation row of the tile.
#[inline(always)]
pub(super) unsafe fn apply_sums<const R: usize>(
    acc: &mut [__m256; R],
    sb: *const u8,
    ab: *const u8,
    sumi: &[__m256i; R],
) {
    let d = _mm256_cvtph_ps(_mm_loadu_si128(sb as *const __m128i));
    for r in 0..R {
        let dx = _mm256_set1_ps((ab.add(ACT_BLOCK * r) as *const f32).read_unaligned());
        acc[r] = _mm256_add_ps(
            acc[r],
            _mm256_mul_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(sumi[r])),
        );
    }
}

/// Low and high nibbles of a code register.
#[inline(always)]
pub(super) unsafe fn nibbles(v: __m256i) -> (__m256i, __m256i) {
    let m0f = _mm256_set1_epi8(0x0F);
    (
        _mm256_and_si256(v, m0f),
        _mm256_and_si256(_mm256_srli_epi16(v, 4), m0f),
    )
}

/// Q5_K: ORs the fifth bits into the nibbles of code register `c % 4` of its half, `hb`
/// being the half's fifth-bit register shifted right by `c % 4`.
#[inline(always)]
pub(super) unsafe fn fifth_bits(lo: __m256i, hi: __m256i, hb: __m256i) -> (__m256i, __m256i) {
    let m10 = _mm256_set1_epi8(0x10);
    (
        _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(hb, 4), m10)),
        _mm256_or_si256(hi, _mm256_and_si256(hb, m10)),
    )
}

/// Q6_K: the 6-bit codes of code register `v` of a unit, from its nibbles and top-bit
/// register `h`.
#[inline(always)]
pub(super) unsafe fn q6_codes(q: __m256i, h: __m256i, v: usize) -> (__m256i, __m256i) {
    let m30 = _mm256_set1_epi8(0x30);
    let (lo, hi) = nibbles(q);
    let (hl, hh) = if v.is_multiple_of(2) {
        (_mm256_slli_epi16(h, 4), _mm256_slli_epi16(h, 2))
    } else {
        (h, _mm256_srli_epi16(h, 2))
    };
    (
        _mm256_or_si256(lo, _mm256_and_si256(hl, m30)),
        _mm256_or_si256(hi, _mm256_and_si256(hh, m30)),
    )
}

/// Q6_K: the eight rows' scales of sub-block `k` as i32 lanes.
#[inline(always)]
pub(super) unsafe fn q6_scale32(sb: *const u8, k: usize) -> __m256i {
    _mm256_cvtepi8_epi32(_mm_loadl_epi64(sb.add(16 + 8 * k) as *const __m128i))
}

/// i32 lanes `a`, `b` (values that fit in i16) as the 16-bit pairs (a, b).
#[inline(always)]
pub(super) unsafe fn word_pairs(a: __m256i, b: __m256i) -> __m256i {
    _mm256_blend_epi16::<0xAA>(a, _mm256_slli_epi32(b, 16))
}

/// Q6_K: `corr += Σ_k scale_k·bsums_k` over the unit's two sub-blocks, per activation row.
#[inline(always)]
pub(super) unsafe fn q6_corr<const R: usize>(
    corr: &mut [__m256i; R],
    pair: __m256i,
    ab: *const u8,
    p: usize,
) {
    for r in 0..R {
        let b = bcast4(ab.add(ACT_BLOCK * r + ACT_BSUMS + 4 * p));
        corr[r] = _mm256_add_epi32(corr[r], _mm256_madd_epi16(pair, b));
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4k<const R: usize>(
    w: *const u8,
    a: *const u8,
    stride: usize,
    nsb: usize,
    mut acc: [__m256; R],
) -> [__m256; R] {
    let dup = [
        word_mask(0, 0),
        word_mask(4, 4),
        word_mask(8, 8),
        word_mask(12, 12),
    ];
    for s in 0..nsb {
        let sb = w.add(s * 1152);
        if R > 1 {
            prefetch(sb, 1152);
        }
        let ab = a.add(s * stride);
        let bytes = q45_scale_bytes(sb.add(32));
        apply_mins(&mut acc, sb, ab, &q45_min_pairs(&bytes));
        let mut sumi = [_mm256_setzero_si256(); R];
        for g in 0..4 {
            // Eight code registers: at most 8·2·15·127 < 2^15 per i16 lane.
            let mut plo = [_mm256_setzero_si256(); R];
            let mut phi = [_mm256_setzero_si256(); R];
            for c in 0..8 {
                let (lo, hi) = nibbles(load(sb.add(128 + 256 * g + 32 * c)));
                for r in 0..R {
                    let x = ab.add(ACT_BLOCK * r + ACT_QS + 64 * g + 4 * c);
                    plo[r] = _mm256_add_epi16(plo[r], _mm256_maddubs_epi16(lo, bcast4(x)));
                    phi[r] = _mm256_add_epi16(phi[r], _mm256_maddubs_epi16(hi, bcast4(x.add(32))));
                }
            }
            let slo = _mm256_shuffle_epi8(bytes[g / 2], dup[2 * (g % 2)]);
            let shi = _mm256_shuffle_epi8(bytes[g / 2], dup[2 * (g % 2) + 1]);
            for r in 0..R {
                let t = _mm256_add_epi32(
                    _mm256_madd_epi16(plo[r], slo),
                    _mm256_madd_epi16(phi[r], shi),
                );
                sumi[r] = _mm256_add_epi32(sumi[r], t);
            }
        }
        apply_sums(&mut acc, sb, ab, &sumi);
    }
    acc
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5k<const R: usize>(
    w: *const u8,
    a: *const u8,
    stride: usize,
    nsb: usize,
    mut acc: [__m256; R],
) -> [__m256; R] {
    let dup = [
        word_mask(0, 0),
        word_mask(4, 4),
        word_mask(8, 8),
        word_mask(12, 12),
    ];
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
            let slo = _mm256_shuffle_epi8(bytes[g / 2], dup[2 * (g % 2)]);
            let shi = _mm256_shuffle_epi8(bytes[g / 2], dup[2 * (g % 2) + 1]);
            for half in 0..2 {
                // Four code registers: at most 4·2·31·127 < 2^15 per i16 lane.
                let mut hb = load(gp.add(256 + 32 * half));
                let mut plo = [_mm256_setzero_si256(); R];
                let mut phi = [_mm256_setzero_si256(); R];
                for c in 4 * half..4 * half + 4 {
                    let (lo, hi) = nibbles(load(gp.add(32 * c)));
                    let (lo, hi) = fifth_bits(lo, hi, hb);
                    hb = _mm256_srli_epi16(hb, 1);
                    for r in 0..R {
                        let x = ab.add(ACT_BLOCK * r + ACT_QS + 64 * g + 4 * c);
                        plo[r] = _mm256_add_epi16(plo[r], _mm256_maddubs_epi16(lo, bcast4(x)));
                        phi[r] =
                            _mm256_add_epi16(phi[r], _mm256_maddubs_epi16(hi, bcast4(x.add(32))));
                    }
                }
                for r in 0..R {
                    let t = _mm256_add_epi32(
                        _mm256_madd_epi16(plo[r], slo),
                        _mm256_madd_epi16(phi[r], shi),
                    );
                    sumi[r] = _mm256_add_epi32(sumi[r], t);
                }
            }
        }
        apply_sums(&mut acc, sb, ab, &sumi);
    }
    acc
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6k<const R: usize>(
    w: *const u8,
    a: *const u8,
    stride: usize,
    nsb: usize,
    mut acc: [__m256; R],
) -> [__m256; R] {
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
            let (dup_a, dup_b) = (word_pairs(sa, sa), word_pairs(sc, sc));
            let up = sb.add(144 + 192 * p);
            for vp in 0..2 {
                // Two code registers: at most 2·2·63·127 < 2^15 per i16 lane.
                let h = load(up.add(128 + 32 * vp));
                let mut pa = [_mm256_setzero_si256(); R];
                let mut pb = [_mm256_setzero_si256(); R];
                for v in 2 * vp..2 * vp + 2 {
                    let (lo, hi) = q6_codes(load(up.add(32 * v)), h, v);
                    for r in 0..R {
                        let x = ab.add(ACT_BLOCK * r + ACT_QS + 32 * p + 4 * v);
                        pa[r] = _mm256_add_epi16(pa[r], _mm256_maddubs_epi16(lo, bcast4(x)));
                        pb[r] =
                            _mm256_add_epi16(pb[r], _mm256_maddubs_epi16(hi, bcast4(x.add(16))));
                    }
                }
                for r in 0..R {
                    let t = _mm256_add_epi32(
                        _mm256_madd_epi16(pa[r], dup_a),
                        _mm256_madd_epi16(pb[r], dup_b),
                    );
                    sumi[r] = _mm256_add_epi32(sumi[r], t);
                }
            }
        }
        for r in 0..R {
            sumi[r] = _mm256_sub_epi32(sumi[r], _mm256_slli_epi32(corr[r], 5));
        }
        apply_sums(&mut acc, sb, ab, &sumi);
    }
    acc
}

/// Quantizes 256 activations to a Q8_K activation block (`d`, codes, `bsums`, `bsums32`; see
/// `mod.rs`) with the arithmetic of [`crate::quant::k_quants::quantize_block_q8_k`]:
/// the same `iscale = −127/max`, products rounded half to even by the same `±1.5·2^23`
/// addition, saturated to i8. Returns false, writing nothing, when a value is not finite
/// (the caller then uses the scalar quantizer, which defines those cases).
///
/// # Safety
/// The CPU must support AVX2. `x` holds 256 values and `blk` `ACT_BLOCK` bytes.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn quantize_act_block(x: &[f32], blk: &mut [u8]) -> bool {
    assert!(x.len() == 256 && blk.len() == ACT_BLOCK);
    let xp = x.as_ptr();
    let sign = _mm256_set1_ps(-0.0);
    let mut vmax = _mm256_setzero_ps();
    let mut bad = _mm256_setzero_ps();
    for k in 0..32 {
        let v = _mm256_loadu_ps(xp.add(8 * k));
        // Infinities and NaNs: v − v is NaN exactly for them.
        let d = _mm256_sub_ps(v, v);
        bad = _mm256_or_ps(bad, _mm256_cmp_ps::<_CMP_UNORD_Q>(d, d));
        vmax = _mm256_max_ps(vmax, _mm256_andnot_ps(sign, v));
    }
    if _mm256_movemask_ps(bad) != 0 {
        return false;
    }
    let m = _mm_max_ps(
        _mm256_castps256_ps128(vmax),
        _mm256_extractf128_ps::<1>(vmax),
    );
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
    if amax == 0.0 {
        blk.fill(0);
        return true;
    }
    // The first value of largest magnitude.
    let va = _mm256_set1_ps(amax);
    let mut max = 0.0;
    for k in 0..32 {
        let v = _mm256_loadu_ps(xp.add(8 * k));
        let hit = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(_mm256_andnot_ps(sign, v), va));
        if hit != 0 {
            max = x[8 * k + hit.trailing_zeros() as usize];
            break;
        }
    }
    let iscale = -127.0 / max;
    let vs = _mm256_set1_ps(iscale);
    let magic = _mm256_set1_ps(12_582_912.0);
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    let ones8 = _mm256_set1_epi8(1);
    let ones16 = _mm256_set1_epi16(1);
    let out = blk.as_mut_ptr();
    let mut bsums = [0i16; 16];
    for k in 0..8 {
        let q: [__m256i; 4] = std::array::from_fn(|i| {
            let p = _mm256_mul_ps(_mm256_loadu_ps(xp.add(32 * k + 8 * i)), vs);
            _mm256_cvttps_epi32(_mm256_sub_ps(_mm256_add_ps(p, magic), magic))
        });
        let b = _mm256_packs_epi16(
            _mm256_packs_epi32(q[0], q[1]),
            _mm256_packs_epi32(q[2], q[3]),
        );
        let b = _mm256_permutevar8x32_epi32(b, order);
        _mm256_storeu_si256(out.add(ACT_QS + 32 * k) as *mut __m256i, b);
        // Sums of each four codes, then of each sixteen.
        let s4 = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, b), ones16);
        let s16 = _mm256_hadd_epi32(s4, s4);
        let s16 = _mm256_hadd_epi32(s16, s16);
        bsums[2 * k] = _mm256_extract_epi32::<0>(s16) as i16;
        bsums[2 * k + 1] = _mm256_extract_epi32::<4>(s16) as i16;
    }
    blk[0..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
    for (k, s) in bsums.iter().enumerate() {
        blk[ACT_BSUMS + 2 * k..ACT_BSUMS + 2 * k + 2].copy_from_slice(&s.to_le_bytes());
    }
    for k in 0..8 {
        let s = bsums[2 * k] + bsums[2 * k + 1];
        blk[ACT_BSUMS32 + 2 * k..ACT_BSUMS32 + 2 * k + 2].copy_from_slice(&s.to_le_bytes());
    }
    true
}
