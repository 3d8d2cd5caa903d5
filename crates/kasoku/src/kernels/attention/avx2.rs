//! AVX2/FMA attention tasks: the register- and cache-blocked task for head sizes that are
//! multiples of 8 (up to 128), and the vector primitives of the per-key task; both read f16
//! and q8_0 rows with F16C and integer conversions, to the same values as the portable path.

use std::arch::x86_64::*;
use std::ops::Range;

use super::stored::{BlockQ8_0, Stored};
use super::{Ctx, Ops, ROW_BLOCK};

/// # Safety
/// AVX2, FMA and F16C must be available.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn task<S: Stored>(
    ctx: &Ctx<S>,
    kvh: usize,
    rows: Range<usize>,
    keys: Range<usize>,
    dst: &mut [f32],
    scores: &mut [f32],
) {
    if ctx.hd.is_multiple_of(8) && ctx.hd <= BLOCKED_MAX_HEAD_DIM {
        blocked_task(ctx, kvh, rows, keys, dst, scores)
    } else {
        super::task::<Avx2, S>(ctx, kvh, rows, keys, dst, scores)
    }
}

/// Largest head size [`blocked_task`] serves: at 256 (Gemma 3, Qwen3.5) it measured
/// slower than the per-key task with caches from memory (16 heads / 4 KV heads, 4096
/// positions: 2.1–2.4 against 1.6 ms per layer), at 64 and 128 faster.
const BLOCKED_MAX_HEAD_DIM: usize = 128;
/// Keys per block of the scores loop.
const KEYS: usize = 4;
/// Query heads (of any row of the task) per block of the scores loop, and of the values
/// loop.
const SCORE_HEADS: usize = 2;
const VALUE_HEADS: usize = 2;
/// Values per block of the values loop (4 registers).
const VALUE_DIMS: usize = 32;
/// Key blocks ahead of the scores loop that it prefetches.
const PREFETCH: usize = 4;

/// [`super::task`] for head sizes that are multiples of 8, blocked for registers and
/// cache: the keys every row of the task sees (`shared`: the context, not a tree's nodes)
/// are read once for a block of query heads at a time, and each head's weighted sum of
/// values stays in registers across the keys instead of being loaded and stored per key.
/// A score is the same function of its query and key wherever it is computed (blocks
/// combine per-key accumulators lane by lane), and each value sum adds its keys in order
/// with one fused multiply-add per element, so a row's result does not depend on the rows
/// beside it and a tree node gets the bits of a plain decode of its path.
///
/// # Safety
/// AVX2, FMA and F16C must be available; `ctx.hd % 8 == 0`.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)] // register blocks index several arrays at once
unsafe fn blocked_task<S: Stored>(
    ctx: &Ctx<S>,
    kvh: usize,
    rows: Range<usize>,
    keys: Range<usize>,
    dst: &mut [f32],
    scores: &mut [f32],
) {
    let Ctx {
        hd,
        group,
        q_row,
        scale,
        q,
        keys: kc,
        values: vc,
        units,
        ..
    } = *ctx;
    let (kc, vc) = (kc[kvh], vc[kvh]);
    // The stored row at `pos`, and a row's bytes (for prefetching).
    let row = |c: &[S], pos: usize| c.as_ptr().add(pos * units);
    let row_bytes = units * std::mem::size_of::<S>();
    let slot = hd + 2;
    let width = keys.len();
    let n_q = rows.len() * group;
    // Keys each row sees (a task has at most `ROW_BLOCK` rows).
    let mut seen = [0usize; ROW_BLOCK];
    let lens = &mut seen[..rows.len()];
    for (len, i) in lens.iter_mut().zip(rows.clone()) {
        *len = ctx.seen(i, &keys);
    }
    let lens = &*lens;
    let mut shared = lens.iter().copied().min().unwrap_or(0);
    if ctx.tree.is_some() {
        shared = shared.min(ctx.past.saturating_sub(keys.start));
    }
    // Query head `p` of the task: row `rows.start + p / group`, head `p % group` of kvh.
    let qp = |p: usize| {
        q.as_ptr()
            .add((rows.start + p / group) * q_row + (kvh * group + p % group) * hd)
    };
    let scores = &mut scores[..n_q * width];

    // Scores of the shared keys: KEYS keys × SCORE_HEADS heads per block.
    for j in (0..shared).step_by(KEYS) {
        let nk = (shared - j).min(KEYS);
        let k: [*const S; KEYS] = std::array::from_fn(|t| row(kc, keys.start + j + t.min(nk - 1)));
        // The keys PREFETCH blocks ahead, and these keys' value rows, on their way.
        let ahead =
            kc.as_ptr()
                .wrapping_add((keys.start + j + PREFETCH * KEYS) * units) as *const i8;
        let vrows = row(vc, keys.start + j) as *const i8;
        for line in (0..nk * row_bytes).step_by(64) {
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line));
            _mm_prefetch::<_MM_HINT_T1>(vrows.add(line));
        }
        for p in (0..n_q).step_by(SCORE_HEADS) {
            let heads: [usize; SCORE_HEADS] = std::array::from_fn(|h| (p + h).min(n_q - 1));
            let dots = dot_block(heads.map(&qp), k, hd);
            for (h, &qh) in heads.iter().enumerate().take(n_q - p) {
                let row = &mut scores[qh * width + j..][..nk];
                for (t, s) in row.iter_mut().enumerate() {
                    *s = dots[h][t] * scale;
                }
            }
        }
    }
    // The keys only some rows see (a row's later tokens, a tree node's ancestors), one
    // at a time.
    for (r, &len) in lens.iter().enumerate() {
        let i = rows.start + r;
        for j in shared..len {
            let k = row(kc, ctx.slot(i, keys.start + j));
            for g in 0..group {
                let p = r * group + g;
                scores[p * width + j] = dot_one(qp(p), k, hd) * scale;
            }
        }
    }

    // Softmax statistics per query head.
    for (p, out) in dst.chunks_exact_mut(slot).take(n_q).enumerate() {
        super::start_head::<Avx2>(out, &mut scores[p * width..][..lens[p / group]]);
    }

    // Weighted values of the shared keys, each sum in registers for VALUE_HEADS heads ×
    // VALUE_DIMS values across all of them (the value rows were prefetched into L2 with
    // the scores, so the column blocks do not go to memory each).
    if shared > 0 {
        for p0 in (0..n_q).step_by(VALUE_HEADS) {
            let nh = (n_q - p0).min(VALUE_HEADS);
            for d0 in (0..hd).step_by(VALUE_DIMS) {
                let nv = ((hd - d0) / 8).min(VALUE_DIMS / 8);
                let mut acc = [[_mm256_setzero_ps(); VALUE_DIMS / 8]; VALUE_HEADS];
                for j in 0..shared {
                    let vrow = row(vc, keys.start + j);
                    let v: [__m256; VALUE_DIMS / 8] =
                        std::array::from_fn(|u| S::load8(vrow, d0 + 8 * u.min(nv - 1)));
                    for (h, a) in acc.iter_mut().enumerate().take(nh) {
                        let w = _mm256_set1_ps(scores[(p0 + h) * width + j]);
                        for u in 0..nv {
                            a[u] = _mm256_fmadd_ps(w, v[u], a[u]);
                        }
                    }
                }
                for (h, a) in acc.iter().enumerate().take(nh) {
                    let out = dst.as_mut_ptr().add((p0 + h) * slot + 2 + d0);
                    for u in 0..nv {
                        _mm256_storeu_ps(out.add(8 * u), a[u]);
                    }
                }
            }
        }
    }
    // And the keys only some rows see, continuing each sum in key order.
    for (r, &len) in lens.iter().enumerate() {
        let i = rows.start + r;
        for j in shared..len {
            let v = row(vc, ctx.slot(i, keys.start + j));
            for g in 0..group {
                let p = r * group + g;
                let w = scores[p * width + j];
                axpy_stored(&mut dst[p * slot + 2..(p + 1) * slot], w, v);
            }
        }
    }
}

/// The dot products of `SCORE_HEADS` query rows with `KEYS` key rows of `hd` (a multiple
/// of 8) values: one accumulator per pair, eight products per step in order, then each
/// accumulator summed by the same tree (`reduce`), so a pair's result depends on its two
/// rows alone.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_block<S: Stored>(
    q: [*const f32; SCORE_HEADS],
    k: [*const S; KEYS],
    hd: usize,
) -> [[f32; KEYS]; SCORE_HEADS] {
    let mut acc = [[_mm256_setzero_ps(); KEYS]; SCORE_HEADS];
    // Key by key, so that each key row is read in order.
    for t in 0..KEYS {
        for d in (0..hd).step_by(8) {
            let kv = S::load8(k[t], d);
            for h in 0..SCORE_HEADS {
                acc[h][t] = _mm256_fmadd_ps(_mm256_loadu_ps(q[h].add(d)), kv, acc[h][t]);
            }
        }
    }
    acc.map(|a| {
        let mut out = [0f32; KEYS];
        _mm_storeu_ps(out.as_mut_ptr(), reduce(a));
        out
    })
}

/// One pair of [`dot_block`], with its arithmetic.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_one<S: Stored>(q: *const f32, k: *const S, hd: usize) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for d in (0..hd).step_by(8) {
        acc = _mm256_fmadd_ps(_mm256_loadu_ps(q.add(d)), S::load8(k, d), acc);
    }
    let zero = _mm256_setzero_ps();
    _mm_cvtss_f32(reduce([acc, zero, zero, zero]))
}

/// The sums of four registers' lanes: lane `t` is
/// `((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]))` of register `t`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn reduce(a: [__m256; 4]) -> __m128 {
    let h = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1))
}

pub struct Avx2;

impl Ops for Avx2 {
    #[inline(always)]
    fn dot(a: &[f32], b: &[f32]) -> f32 {
        // SAFETY: only reached through `task`, which requires AVX2 and FMA.
        unsafe { dot(a, b) }
    }

    #[inline(always)]
    fn axpy(y: &mut [f32], alpha: f32, x: &[f32]) {
        // SAFETY: as above.
        unsafe { axpy(y, alpha, x) }
    }

    #[inline(always)]
    fn exp_sum(x: &mut [f32], max: f32) -> f32 {
        // SAFETY: as above.
        unsafe { exp_sum(x, max) }
    }

    #[inline(always)]
    fn load<S: Stored>(row: &[S], out: &mut [f32]) {
        // SAFETY: as above (the task requires F16C too).
        unsafe { load_row(row, out) }
    }
}

/// The eight f16 values at `p` as f32 (exact).
///
/// # Safety
/// F16C must be available; `p` must point at eight values.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub unsafe fn load8_f16(p: *const half::f16) -> __m256 {
    _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
}

/// The eight values `at..at + 8` of the q8_0 block at `b` (`at % 8 == 0`): `d·q` in f32, one
/// rounding, as [`BlockQ8_0`]'s portable conversion computes them.
///
/// # Safety
/// AVX2 and F16C must be available; `b` must point at a block and `at + 8 <= 32`.
#[inline]
#[target_feature(enable = "avx2,f16c")]
pub unsafe fn load8_q8_0(b: *const BlockQ8_0, at: usize) -> __m256 {
    let d = _mm256_cvtph_ps(_mm_set1_epi16((*b).d.to_bits() as i16));
    let q = _mm_loadl_epi64((*b).qs.as_ptr().add(at) as *const __m128i);
    _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)))
}

/// A stored row's values as f32, eight at a time (a tail of fewer than eight by the portable
/// rule, which gives the same values).
///
/// # Safety
/// AVX2 and F16C must be available; `row` holds at least `out.len()` values.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn load_row<S: Stored>(row: &[S], out: &mut [f32]) {
    let n = out.len();
    let whole = n - n % 8;
    for d in (0..whole).step_by(8) {
        _mm256_storeu_ps(out.as_mut_ptr().add(d), S::load8(row.as_ptr(), d));
    }
    if whole < n {
        // Only formats of one value per element have such tails (blocks hold 32).
        S::load(&row[whole / S::VALUES..], &mut out[whole..]);
    }
}

/// `y += alpha · row` over a stored row of `y.len()` (a multiple of 8) values, with
/// [`axpy`]'s arithmetic.
///
/// # Safety
/// AVX2, FMA and F16C must be available; `y.len() % 8 == 0` and `row` holds `y.len()` values.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn axpy_stored<S: Stored>(y: &mut [f32], alpha: f32, row: *const S) {
    let yp = y.as_mut_ptr();
    let a = _mm256_set1_ps(alpha);
    for i in (0..y.len()).step_by(8) {
        _mm256_storeu_ps(
            yp.add(i),
            _mm256_fmadd_ps(a, S::load8(row, i), _mm256_loadu_ps(yp.add(i))),
        );
    }
}

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    _mm_cvtss_f32(s)
}

/// # Safety
/// AVX2 and FMA must be available; `a.len() == b.len()`.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (ap, bp) = (a.as_ptr(), b.as_ptr());
    let mut acc0 = _mm256_setzero_ps();
    let mut acc1 = _mm256_setzero_ps();
    let mut i = 0;
    while i + 16 <= n {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(ap.add(i)), _mm256_loadu_ps(bp.add(i)), acc0);
        acc1 = _mm256_fmadd_ps(
            _mm256_loadu_ps(ap.add(i + 8)),
            _mm256_loadu_ps(bp.add(i + 8)),
            acc1,
        );
        i += 16;
    }
    if i + 8 <= n {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(ap.add(i)), _mm256_loadu_ps(bp.add(i)), acc0);
        i += 8;
    }
    let mut sum = hsum(_mm256_add_ps(acc0, acc1));
    while i < n {
        sum += *ap.add(i) * *bp.add(i);
        i += 1;
    }
    sum
}

/// # Safety
/// AVX2 and FMA must be available; `y.len() == x.len()`.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub unsafe fn axpy(y: &mut [f32], alpha: f32, x: &[f32]) {
    let n = y.len().min(x.len());
    let (yp, xp) = (y.as_mut_ptr(), x.as_ptr());
    let a = _mm256_set1_ps(alpha);
    let mut i = 0;
    while i + 8 <= n {
        _mm256_storeu_ps(
            yp.add(i),
            _mm256_fmadd_ps(a, _mm256_loadu_ps(xp.add(i)), _mm256_loadu_ps(yp.add(i))),
        );
        i += 8;
    }
    while i < n {
        *yp.add(i) += alpha * *xp.add(i);
        i += 1;
    }
}

/// e^x for x ≤ 0 (softmax arguments), relative error ≈ 2e-7: 2^n · p(r) with
/// x = n·ln2 + r, |r| ≤ ln2/2, p a degree-6 Taylor polynomial; results below e^-87 are 0.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub unsafe fn exp_neg(x: __m256) -> __m256 {
    let x = _mm256_max_ps(x, _mm256_set1_ps(-87.0));
    let n = _mm256_round_ps(
        _mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)),
        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC,
    );
    // r = x - n·ln2 in two steps (ln2 = 0.693359375 - 2.12194440e-4; the first is exact in
    // few bits, so n·hi is exact) to keep r accurate.
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_359_4), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), r);
    let mut p = _mm256_set1_ps(1.0 / 720.0);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0 / 120.0));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0 / 24.0));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0 / 6.0));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0));
    let bits = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)),
        23,
    );
    let y = _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
    // n = -126 (and the clamp) would need a denormal scale: flush those to 0.
    _mm256_and_ps(y, _mm256_cmp_ps(x, _mm256_set1_ps(-87.0), _CMP_GT_OQ))
}

/// # Safety
/// AVX2 and FMA must be available.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub unsafe fn exp_sum(x: &mut [f32], max: f32) -> f32 {
    let n = x.len();
    let xp = x.as_mut_ptr();
    let m = _mm256_set1_ps(max);
    let mut acc = _mm256_setzero_ps();
    let mut i = 0;
    while i + 8 <= n {
        let e = exp_neg(_mm256_sub_ps(_mm256_loadu_ps(xp.add(i)), m));
        _mm256_storeu_ps(xp.add(i), e);
        acc = _mm256_add_ps(acc, e);
        i += 8;
    }
    let mut sum = hsum(acc);
    while i < n {
        let e = (*xp.add(i) - max).exp();
        *xp.add(i) = e;
        sum += e;
        i += 1;
    }
    sum
}
