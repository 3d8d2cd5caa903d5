//! Multi-head causal attention of a batch of new tokens over a KV cache, with grouped-query
//! heads (query head `h` reads KV head `h / (n_heads / n_kv_heads)`).
//!
//! The cache is head-major: for each KV head, `[position][head_dim]` f32 rows (contiguous, so
//! a task streams its keys and values; a position-major layout strides by a whole KV row per
//! key and measured ~5x slower at head_dim 256). It already contains the new tokens' keys and
//! values: new row `i` sits at position `past + i` and sees positions
//! `0..=past + i` (the old cache plus the earlier new tokens). Scores and softmax are f32.
//!
//! Work is split into tasks of (KV head, block of new rows, chunk of keys). A task serves every
//! query head of its KV head group, so each key and value row is read once per task however
//! many query heads share it, and long caches are split over the pool even for one new token
//! (each task keeps a partial softmax: max, sum and weighted values, merged at the end, as in
//! flash-decoding). Dot products, exponentials and weighted sums have an AVX2/FMA path beside
//! the portable one; both run the same task code.

use super::simd::Isa;
use super::threads::{self, Blocks, Work};

/// Head counts and size of one attention layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnGeometry {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
}

/// Keys per task for decode and verification batches: chunks start at multiples of this
/// absolute position, whatever the batch, so a row's result does not depend on the rows
/// beside it (verifying a draft reproduces plain decoding bit for bit).
const CHUNK: usize = 128;
/// Batches longer than this (prefill) split their keys adaptively instead: at most this many
/// keys per task (bounds the score buffer: rows × group × keys) ...
const MAX_CHUNK: usize = 512;
/// ... and at least this many when splitting a cache for parallelism.
const MIN_CHUNK: usize = 128;
/// Batches of at most this many rows use the fixed [`CHUNK`] split.
const FIXED_SPLIT_ROWS: usize = 64;
/// New rows per task at most.
const ROW_BLOCK: usize = 8;

/// `out[i][h] = Σ_j softmax_j(scale · q[i][h]·k[j][kvh]) · v[j][kvh]`, `j ≤ past + i`.
///
/// `q` and `out` are `n × n_heads × head_dim`; `keys[kvh]` and `values[kvh]` (one slice per
/// KV head) hold at least `past + n` positions of `head_dim` values.
pub fn attention(
    geo: AttnGeometry,
    q: &[f32],
    keys: &[&[f32]],
    values: &[&[f32]],
    past: usize,
    scale: f32,
    out: &mut [f32],
) {
    attention_with(Isa::detect(), geo, q, keys, values, past, None, scale, out)
}

/// Attention of the nodes of a token tree (a draft being verified) over a KV cache. Node `i`'s
/// keys and values sit at position `past + i`; `parents[i]` is its parent node (`< i`), or
/// `usize::MAX` for a root (whose parent is the committed context). Node `i` sees the
/// `past` committed positions, then its ancestors from the root down, then itself: exactly
/// the keys a plain decode of its path would see, in the same order, and its result has the
/// same bits as that decode's.
#[allow(clippy::too_many_arguments)]
pub fn tree_attention(
    geo: AttnGeometry,
    q: &[f32],
    keys: &[&[f32]],
    values: &[&[f32]],
    past: usize,
    parents: &[usize],
    scale: f32,
    out: &mut [f32],
) {
    tree_attention_rows(geo, q, keys, values, past, parents, 0, scale, out)
}

/// [`tree_attention`] for the nodes `first..parents.len()` only (`q` and `out` hold their
/// rows): the earlier nodes' keys and values are already in the cache, at `past + j` (a tree
/// grown level by level computes only its new nodes).
#[allow(clippy::too_many_arguments)]
pub fn tree_attention_rows(
    geo: AttnGeometry,
    q: &[f32],
    keys: &[&[f32]],
    values: &[&[f32]],
    past: usize,
    parents: &[usize],
    first: usize,
    scale: f32,
    out: &mut [f32],
) {
    let mut paths = TreePaths::new(parents);
    paths.first = first;
    attention_with(
        Isa::detect(),
        geo,
        q,
        keys,
        values,
        past,
        Some(&paths),
        scale,
        out,
    )
}

/// Each tree node's path (root first, itself last), as node indices, flattened.
struct TreePaths {
    /// `path(i) = nodes[start[i]..start[i + 1]]`.
    nodes: Vec<usize>,
    start: Vec<usize>,
    /// The node of query row 0.
    first: usize,
}

impl TreePaths {
    fn new(parents: &[usize]) -> TreePaths {
        let mut nodes = Vec::new();
        let mut start = vec![0];
        for (i, &p) in parents.iter().enumerate() {
            if p != usize::MAX {
                assert!(
                    p < i,
                    "tree attention: parent {p} of node {i} is not before it"
                );
                let (a, b) = (start[p], start[p + 1]);
                nodes.extend_from_within(a..b);
            }
            nodes.push(i);
            start.push(nodes.len());
        }
        TreePaths {
            nodes,
            start,
            first: 0,
        }
    }

    /// The path of node `i`.
    fn path(&self, i: usize) -> &[usize] {
        &self.nodes[self.start[i]..self.start[i + 1]]
    }

    /// The path of the node of query row `r`.
    fn row_path(&self, r: usize) -> &[usize] {
        self.path(self.first + r)
    }
}

#[allow(clippy::too_many_arguments)]
fn attention_with(
    isa: Isa,
    geo: AttnGeometry,
    q: &[f32],
    keys: &[&[f32]],
    values: &[&[f32]],
    past: usize,
    tree: Option<&TreePaths>,
    scale: f32,
    out: &mut [f32],
) {
    let AttnGeometry {
        n_heads,
        n_kv_heads,
        head_dim: hd,
    } = geo;
    assert!(
        n_kv_heads > 0 && n_heads.is_multiple_of(n_kv_heads),
        "attention: n_heads must be a multiple of n_kv_heads"
    );
    let q_row = n_heads * hd;
    assert!(
        q.len().is_multiple_of(q_row) && out.len() == q.len(),
        "attention: q/out lengths"
    );
    let n = q.len() / q_row;
    // Cache rows the call may read: the context and every node up to the last row's.
    let total = past + tree.map_or(n, |t| t.first + n);
    assert!(
        keys.len() == n_kv_heads
            && values.len() == n_kv_heads
            && keys.iter().chain(values).all(|h| h.len() >= total * hd),
        "attention: cache too short"
    );
    assert!(
        tree.is_none_or(|t| t.start.len() == t.first + n + 1),
        "attention: tree of another size"
    );
    if n == 0 {
        return;
    }
    let group = n_heads / n_kv_heads;
    let row_blocks = n.div_ceil(ROW_BLOCK);
    let rows_per = n.div_ceil(row_blocks);
    let chunk_len = if n <= FIXED_SPLIT_ROWS || tree.is_some() {
        CHUNK
    } else {
        let want = threads::num_threads() * 4;
        let per_head_tasks = want.div_ceil(n_kv_heads * row_blocks);
        let chunks = per_head_tasks
            .min(total.div_ceil(MIN_CHUNK))
            .max(total.div_ceil(MAX_CHUNK))
            .max(1);
        total.div_ceil(chunks)
    };
    let chunks = total.div_ceil(chunk_len);

    // One partial result per (task, row of its block, head of its group): max, sum, hd values.
    let slot = hd + 2;
    let per_task = rows_per * group * slot;
    let n_tasks = n_kv_heads * row_blocks * chunks;
    let mut partial = vec![0f32; n_tasks * per_task];
    let ctx = Ctx {
        hd,
        group,
        q_row,
        past,
        scale,
        q,
        keys,
        values,
        tree,
    };
    let parts = Blocks::chunks(&mut partial, per_task);
    threads::for_each(n_tasks, parts, Work::none(), |t, dst, _| {
        let c = t % chunks;
        let b = (t / chunks) % row_blocks;
        let kvh = t / (chunks * row_blocks);
        let rows = b * rows_per..((b + 1) * rows_per).min(n);
        let keys_range = c * chunk_len..((c + 1) * chunk_len).min(total);
        run_task(isa, &ctx, kvh, rows, keys_range, dst.into_slice());
    });

    // Merge the chunks of each (row, head).
    for i in 0..n {
        let b = i / rows_per;
        let r = i - b * rows_per;
        for h in 0..n_heads {
            let (kvh, g) = (h / group, h % group);
            let at = |c: usize| {
                ((kvh * row_blocks + b) * chunks + c) * per_task + (r * group + g) * slot
            };
            let m = (0..chunks)
                .map(|c| partial[at(c)])
                .fold(f32::NEG_INFINITY, f32::max);
            let dst = &mut out[i * q_row + h * hd..][..hd];
            dst.iter_mut().for_each(|d| *d = 0.0);
            let mut sum = 0f32;
            for c in 0..chunks {
                let p = &partial[at(c)..at(c) + slot];
                if p[1] == 0.0 {
                    continue;
                }
                let w = (p[0] - m).exp();
                sum += p[1] * w;
                dst.iter_mut().zip(&p[2..]).for_each(|(d, &a)| *d += w * a);
            }
            let inv = 1.0 / sum;
            dst.iter_mut().for_each(|d| *d *= inv);
        }
    }
}

/// What every task reads.
struct Ctx<'a> {
    hd: usize,
    group: usize,
    q_row: usize,
    past: usize,
    scale: f32,
    q: &'a [f32],
    keys: &'a [&'a [f32]],
    values: &'a [&'a [f32]],
    tree: Option<&'a TreePaths>,
}

impl Ctx<'_> {
    /// The last position row `i` sees (its own).
    #[inline(always)]
    fn last_seen(&self, i: usize) -> usize {
        match self.tree {
            None => self.past + i,
            Some(t) => self.past + t.row_path(i).len() - 1,
        }
    }

    /// How many of the keys `keys` row `i` sees (it sees positions up to its own).
    #[inline(always)]
    fn seen(&self, i: usize, keys: &std::ops::Range<usize>) -> usize {
        (self.last_seen(i) + 1)
            .min(keys.end)
            .saturating_sub(keys.start)
    }

    /// Where the key row `i` sees at logical position `p` is stored.
    #[inline(always)]
    fn slot(&self, i: usize, p: usize) -> usize {
        match self.tree {
            Some(t) if p >= self.past => self.past + t.row_path(i)[p - self.past],
            _ => p,
        }
    }
}

fn run_task(
    isa: Isa,
    ctx: &Ctx,
    kvh: usize,
    rows: std::ops::Range<usize>,
    keys: std::ops::Range<usize>,
    dst: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        // SAFETY: an `Isa` with AVX2 exists only on CPUs with AVX2, FMA and F16C
        // (`kernels::simd`).
        unsafe { avx2::task(ctx, kvh, rows, keys, dst) };
        return;
    }
    let _ = isa;
    task::<Portable>(ctx, kvh, rows, keys, dst);
}

/// The vector primitives a task needs.
trait Ops {
    fn dot(a: &[f32], b: &[f32]) -> f32;
    fn axpy(y: &mut [f32], alpha: f32, x: &[f32]);
    /// `x[i] = exp(x[i] - max)`, returns the sum.
    fn exp_sum(x: &mut [f32], max: f32) -> f32;
}

/// Partial attention of the query heads of `kvh` for `rows` over the keys `keys`: for each
/// (row, head) writes `[max score, Σ exp(score - max), Σ exp(score - max) · v]` to `dst`
/// (max = -inf and sum = 0 when the row sees none of these keys).
#[inline(always)]
fn task<O: Ops>(
    ctx: &Ctx,
    kvh: usize,
    rows: std::ops::Range<usize>,
    keys: std::ops::Range<usize>,
    dst: &mut [f32],
) {
    let Ctx {
        hd,
        group,
        q_row,
        scale,
        q,
        keys: kc,
        values: vc,
        ..
    } = *ctx;
    let (kc, vc) = (kc[kvh], vc[kvh]);
    let slot = hd + 2;
    let width = keys.len();
    let n_q = rows.len() * group;
    let mut scores = vec![0f32; n_q * width];
    // Keys this (row, head) sees in the chunk: row i sees positions ≤ its own.
    let seen = |i: usize| ctx.seen(i, &keys);
    let max_seen = rows.clone().map(seen).max().unwrap_or(0);
    for j in 0..max_seen {
        for (r, i) in rows.clone().enumerate() {
            if j >= seen(i) {
                continue;
            }
            let k = &kc[ctx.slot(i, keys.start + j) * hd..][..hd];
            for g in 0..group {
                let qv = &q[i * q_row + (kvh * group + g) * hd..][..hd];
                scores[(r * group + g) * width + j] = O::dot(qv, k) * scale;
            }
        }
    }
    for (r, i) in rows.clone().enumerate() {
        let len = seen(i);
        for g in 0..group {
            let p = r * group + g;
            start_head::<O>(
                &mut dst[p * slot..][..slot],
                &mut scores[p * width..][..len],
            );
        }
    }
    for j in 0..max_seen {
        for (r, i) in rows.clone().enumerate() {
            if j >= seen(i) {
                continue;
            }
            let v = &vc[ctx.slot(i, keys.start + j) * hd..][..hd];
            for g in 0..group {
                let w = scores[(r * group + g) * width + j];
                let p = (r * group + g) * slot;
                O::axpy(&mut dst[p + 2..p + slot], w, v);
            }
        }
    }
}

/// Starts one query head's output `out` (`[max, Σ exp, weighted sums]`) from the scores of
/// the keys it sees, `s`: the max and the sum of `exp(score - max)` (the scores become those
/// exponentials, the weights of the values), the sums zeroed; max = -inf and sum = 0 when it
/// sees no key.
#[inline(always)]
fn start_head<O: Ops>(out: &mut [f32], s: &mut [f32]) {
    out[2..].iter_mut().for_each(|v| *v = 0.0);
    if s.is_empty() {
        out[0] = f32::NEG_INFINITY;
        out[1] = 0.0;
        return;
    }
    let m = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    out[0] = m;
    out[1] = O::exp_sum(s, m);
}

struct Portable;

impl Ops for Portable {
    #[inline(always)]
    fn dot(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }

    #[inline(always)]
    fn axpy(y: &mut [f32], alpha: f32, x: &[f32]) {
        for (o, &v) in y.iter_mut().zip(x) {
            *o += alpha * v;
        }
    }

    #[inline(always)]
    fn exp_sum(x: &mut [f32], max: f32) -> f32 {
        let mut sum = 0f32;
        for v in x.iter_mut() {
            *v = (*v - max).exp();
            sum += *v;
        }
        sum
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;
    use std::ops::Range;

    use super::{Ctx, Ops};

    /// # Safety
    /// AVX2 and FMA must be available.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn task(
        ctx: &Ctx,
        kvh: usize,
        rows: Range<usize>,
        keys: Range<usize>,
        dst: &mut [f32],
    ) {
        if ctx.hd.is_multiple_of(8) && ctx.hd <= BLOCKED_MAX_HEAD_DIM {
            blocked_task(ctx, kvh, rows, keys, dst)
        } else {
            super::task::<Avx2>(ctx, kvh, rows, keys, dst)
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
    /// AVX2 and FMA must be available; `ctx.hd % 8 == 0`.
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::needless_range_loop)] // register blocks index several arrays at once
    unsafe fn blocked_task(
        ctx: &Ctx,
        kvh: usize,
        rows: Range<usize>,
        keys: Range<usize>,
        dst: &mut [f32],
    ) {
        let Ctx {
            hd,
            group,
            q_row,
            scale,
            q,
            keys: kc,
            values: vc,
            ..
        } = *ctx;
        let (kc, vc) = (kc[kvh], vc[kvh]);
        let slot = hd + 2;
        let width = keys.len();
        let n_q = rows.len() * group;
        let lens: Vec<usize> = rows.clone().map(|i| ctx.seen(i, &keys)).collect();
        let mut shared = lens.iter().copied().min().unwrap_or(0);
        if ctx.tree.is_some() {
            shared = shared.min(ctx.past.saturating_sub(keys.start));
        }
        // Query head `p` of the task: row `rows.start + p / group`, head `p % group` of kvh.
        let qp = |p: usize| {
            q.as_ptr()
                .add((rows.start + p / group) * q_row + (kvh * group + p % group) * hd)
        };
        let mut scores = vec![0f32; n_q * width];

        // Scores of the shared keys: KEYS keys × SCORE_HEADS heads per block.
        for j in (0..shared).step_by(KEYS) {
            let nk = (shared - j).min(KEYS);
            let k: [*const f32; KEYS] =
                std::array::from_fn(|t| kc.as_ptr().add((keys.start + j + t.min(nk - 1)) * hd));
            // The keys PREFETCH blocks ahead, and these keys' value rows, on their way.
            let ahead = kc
                .as_ptr()
                .wrapping_add((keys.start + j + PREFETCH * KEYS) * hd);
            let vrows = vc.as_ptr().add((keys.start + j) * hd);
            for line in (0..nk * hd).step_by(16) {
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line) as *const i8);
                _mm_prefetch::<_MM_HINT_T1>(vrows.add(line) as *const i8);
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
                let k = kc.as_ptr().add(ctx.slot(i, keys.start + j) * hd);
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
                        let vrow = vc.as_ptr().add((keys.start + j) * hd + d0);
                        let v: [__m256; VALUE_DIMS / 8] =
                            std::array::from_fn(|u| _mm256_loadu_ps(vrow.add(8 * u.min(nv - 1))));
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
                let v = &vc[ctx.slot(i, keys.start + j) * hd..][..hd];
                for g in 0..group {
                    let p = r * group + g;
                    let w = scores[p * width + j];
                    axpy(&mut dst[p * slot + 2..(p + 1) * slot], w, v);
                }
            }
        }
    }

    /// The dot products of `SCORE_HEADS` query rows with `KEYS` key rows of `hd` (a multiple
    /// of 8) values: one accumulator per pair, eight products per step in order, then each
    /// accumulator summed by the same tree (`reduce`), so a pair's result depends on its two
    /// rows alone.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn dot_block(
        q: [*const f32; SCORE_HEADS],
        k: [*const f32; KEYS],
        hd: usize,
    ) -> [[f32; KEYS]; SCORE_HEADS] {
        let mut acc = [[_mm256_setzero_ps(); KEYS]; SCORE_HEADS];
        // Key by key, so that each key row is read in order.
        for t in 0..KEYS {
            for d in (0..hd).step_by(8) {
                let kv = _mm256_loadu_ps(k[t].add(d));
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
    #[target_feature(enable = "avx2,fma")]
    unsafe fn dot_one(q: *const f32, k: *const f32, hd: usize) -> f32 {
        let mut acc = _mm256_setzero_ps();
        for d in (0..hd).step_by(8) {
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(q.add(d)), _mm256_loadu_ps(k.add(d)), acc);
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
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Splits a `[position][kv_head][head_dim]` array into one `[position][head_dim]` per head.
    pub(super) fn head_major(x: &[f32], n_kv: usize, hd: usize) -> Vec<Vec<f32>> {
        (0..n_kv)
            .map(|h| {
                x.chunks(n_kv * hd)
                    .flat_map(|row| row[h * hd..(h + 1) * hd].to_vec())
                    .collect()
            })
            .collect()
    }

    /// `attention` on position-major test arrays (the natural layout of the reference).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn pm(
        isa: Option<Isa>,
        geo: AttnGeometry,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        past: usize,
        scale: f32,
        out: &mut [f32],
    ) {
        let (kh, vh) = (
            head_major(k, geo.n_kv_heads, geo.head_dim),
            head_major(v, geo.n_kv_heads, geo.head_dim),
        );
        let kr: Vec<&[f32]> = kh.iter().map(|h| &h[..]).collect();
        let vr: Vec<&[f32]> = vh.iter().map(|h| &h[..]).collect();
        match isa {
            None => attention(geo, q, &kr, &vr, past, scale, out),
            Some(isa) => attention_with(isa, geo, q, &kr, &vr, past, None, scale, out),
        }
    }

    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x2545F4914F6CDD1D).wrapping_add(1);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// Straightforward f64 attention: every row, every head, explicit causal mask.
    fn reference(
        geo: AttnGeometry,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        past: usize,
        scale: f64,
    ) -> Vec<f64> {
        let AttnGeometry {
            n_heads,
            n_kv_heads,
            head_dim: hd,
        } = geo;
        let n = q.len() / (n_heads * hd);
        let mut out = vec![0f64; q.len()];
        for i in 0..n {
            for h in 0..n_heads {
                let kvh = h * n_kv_heads / n_heads;
                let qv = &q[(i * n_heads + h) * hd..][..hd];
                let total = past + n;
                let mut s: Vec<f64> = (0..total)
                    .map(|j| {
                        if j > past + i {
                            f64::NEG_INFINITY
                        } else {
                            let kv = &k[(j * n_kv_heads + kvh) * hd..][..hd];
                            qv.iter()
                                .zip(kv)
                                .map(|(a, b)| *a as f64 * *b as f64)
                                .sum::<f64>()
                                * scale
                        }
                    })
                    .collect();
                let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                s.iter_mut().for_each(|x| *x = (*x - m).exp());
                let z: f64 = s.iter().sum();
                for (j, p) in s.iter().enumerate() {
                    let vv = &v[(j * n_kv_heads + kvh) * hd..][..hd];
                    for d in 0..hd {
                        out[(i * n_heads + h) * hd + d] += p / z * vv[d] as f64;
                    }
                }
            }
        }
        out
    }

    #[test]
    fn matches_reference_for_batches_over_a_cache() {
        let cases = [
            (4usize, 2usize, 16usize, 0usize, 5usize),
            (9, 3, 64, 7, 1),
            (9, 3, 64, 7, 6),
            (2, 2, 8, 0, 1),
            (8, 1, 33, 3, 40),
            (9, 3, 64, 1500, 1),
            (4, 2, 32, 600, 37),
        ];
        for &(nh, nkv, hd, past, n) in &cases {
            let geo = AttnGeometry {
                n_heads: nh,
                n_kv_heads: nkv,
                head_dim: hd,
            };
            let q = values(n * nh * hd, 1 + nh as u64);
            let k = values((past + n) * nkv * hd, 2 + past as u64);
            let v = values((past + n) * nkv * hd, 3 + n as u64);
            let scale = 1.0 / (hd as f64).sqrt();
            let want = reference(geo, &q, &k, &v, past, scale);
            let mut got = vec![0f32; q.len()];
            pm(None, geo, &q, &k, &v, past, scale as f32, &mut got);
            for (a, b) in got.iter().zip(&want) {
                assert!(
                    (*a as f64 - b).abs() < 1e-5 * (1.0 + b.abs()),
                    "{nh}/{nkv}x{hd} past {past} n {n}: {a} vs {b}"
                );
            }
        }
    }

    /// Row i of a batch equals a single-row call over the cache truncated after it.
    #[test]
    fn batch_rows_equal_single_rows() {
        let geo = AttnGeometry {
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 16,
        };
        let (past, n) = (300usize, 9usize);
        let q = values(n * 64, 11);
        let k = values((past + n) * 32, 12);
        let v = values((past + n) * 32, 13);
        let mut batch = vec![0f32; q.len()];
        pm(None, geo, &q, &k, &v, past, 0.25, &mut batch);
        for i in 0..n {
            let mut one = vec![0f32; 64];
            let kv_len = (past + i + 1) * 32;
            pm(
                None,
                geo,
                &q[i * 64..(i + 1) * 64],
                &k[..kv_len],
                &v[..kv_len],
                past + i,
                0.25,
                &mut one,
            );
            // The same bits: decode and verification batches split keys the same way.
            for d in 0..64 {
                assert_eq!(one[d].to_bits(), batch[i * 64 + d].to_bits());
            }
        }
    }

    /// Every node of a tree gets the bits a single-row call over its path gives (context,
    /// then its ancestors and itself), on both paths, with caches that span several chunks.
    #[test]
    fn tree_nodes_equal_plain_decoding_of_their_paths() {
        let geo = AttnGeometry {
            n_heads: 6,
            n_kv_heads: 2,
            head_dim: 24,
        };
        let kvd = 2 * 24;
        //        0
        //      / | \
        //     1  4  6
        //    / \  \
        //   2   3  5   (and 7 a second root)
        let parents = [usize::MAX, 0, 1, 1, 0, 4, 0, usize::MAX];
        let n = parents.len();
        for past in [0usize, 5, 127, 300] {
            let q = values(n * 6 * 24, 21 + past as u64);
            let k = values((past + n) * kvd, 22);
            let v = values((past + n) * kvd, 23);
            let (kh, vh) = (head_major(&k, 2, 24), head_major(&v, 2, 24));
            let kr: Vec<&[f32]> = kh.iter().map(|h| &h[..]).collect();
            let vr: Vec<&[f32]> = vh.iter().map(|h| &h[..]).collect();
            let paths = TreePaths::new(&parents);
            for isa in Isa::available() {
                let mut tree = vec![0f32; q.len()];
                attention_with(isa, geo, &q, &kr, &vr, past, Some(&paths), 0.2, &mut tree);
                // Computing only the later nodes (a tree grown level by level) gives their
                // rows the same bits.
                for first in [3usize, 5] {
                    let mut part = vec![0f32; (n - first) * 144];
                    let mut later = TreePaths::new(&parents);
                    later.first = first;
                    attention_with(
                        isa,
                        geo,
                        &q[first * 144..],
                        &kr,
                        &vr,
                        past,
                        Some(&later),
                        0.2,
                        &mut part,
                    );
                    assert!(
                        part.iter()
                            .zip(&tree[first * 144..])
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "past {past} rows from {first}"
                    );
                }
                for i in 0..n {
                    let path = paths.path(i);
                    let mut kp = k[..past * kvd].to_vec();
                    let mut vp = v[..past * kvd].to_vec();
                    for &j in path {
                        kp.extend_from_slice(&k[(past + j) * kvd..(past + j + 1) * kvd]);
                        vp.extend_from_slice(&v[(past + j) * kvd..(past + j + 1) * kvd]);
                    }
                    let mut one = vec![0f32; 6 * 24];
                    let qi = &q[i * 144..(i + 1) * 144];
                    pm(
                        Some(isa),
                        geo,
                        qi,
                        &kp,
                        &vp,
                        past + path.len() - 1,
                        0.2,
                        &mut one,
                    );
                    assert!(
                        one.iter()
                            .zip(&tree[i * 144..])
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "past {past} node {i} {isa:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn portable_and_avx2_agree() {
        #[cfg(target_arch = "x86_64")]
        if let Some(isa) = Isa::available().find(|isa| isa.avx2()) {
            for &n in &[1usize, 7, 8, 16, 31, 64, 128, 257] {
                let a = values(n, n as u64);
                let b = values(n, 100 + n as u64);
                // SAFETY: `isa` has AVX2 (and FMA), which the `avx2::` functions need.
                let s = unsafe { avx2::dot(&a, &b) };
                let p = Portable::dot(&a, &b);
                assert!(
                    (p - s).abs() < 1e-5 * (1.0 + p.abs()),
                    "dot n={n}: {p} vs {s}"
                );
                let mut y1 = values(n, 7);
                let mut y2 = y1.clone();
                Portable::axpy(&mut y1, 0.37, &a);
                // SAFETY: as above.
                unsafe { avx2::axpy(&mut y2, 0.37, &a) };
                for i in 0..n {
                    assert!((y1[i] - y2[i]).abs() < 1e-6, "axpy n={n} i={i}");
                }
                // exp over the softmax range, against f64.
                let mut e1: Vec<f32> = a.iter().map(|v| v * 50.0 - 50.0).collect();
                let src = e1.clone();
                // SAFETY: as above.
                let sum = unsafe { avx2::exp_sum(&mut e1, 1.5) };
                let mut want_sum = 0f64;
                for (e, x) in e1.iter().zip(&src) {
                    // The argument is rounded to f32 first, as the kernel does.
                    let w = ((*x - 1.5f32) as f64).exp();
                    want_sum += w;
                    assert!(
                        (*e as f64 - w).abs() <= 1e-6 * w + 1e-37,
                        "exp({x} - 1.5) = {e}, want {w}"
                    );
                }
                assert!((sum as f64 - want_sum).abs() <= 1e-5 * want_sum);
            }
            // The whole kernel, both paths, including chunked caches.
            for &(nh, nkv, hd, past, n) in &[
                (4usize, 2usize, 16usize, 0usize, 5usize),
                (9, 3, 64, 900, 1),
                (6, 2, 40, 300, 20),
            ] {
                let geo = AttnGeometry {
                    n_heads: nh,
                    n_kv_heads: nkv,
                    head_dim: hd,
                };
                let q = values(n * nh * hd, 5);
                let k = values((past + n) * nkv * hd, 6);
                let v = values((past + n) * nkv * hd, 7);
                let (mut a, mut b) = (vec![0f32; q.len()], vec![0f32; q.len()]);
                pm(Some(Isa::PORTABLE), geo, &q, &k, &v, past, 0.3, &mut a);
                pm(Some(isa), geo, &q, &k, &v, past, 0.3, &mut b);
                for (x, y) in a.iter().zip(&b) {
                    assert!(
                        (x - y).abs() < 1e-5 * (1.0 + x.abs()),
                        "{nh}/{nkv}x{hd} past {past} n {n}: {x} vs {y}"
                    );
                }
            }
            return;
        }
        eprintln!("note: AVX2/FMA not available; only the portable path was tested");
    }
}

#[cfg(test)]
mod bench {
    use super::*;

    /// `cargo test --release -p kasoku --lib attention::bench -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn decode_attention_speed() {
        for &(nh, nkv, hd, ctx) in &[
            (9usize, 3usize, 64usize, 2048usize),
            (12, 2, 128, 4096),
            (16, 4, 256, 4096),
            (4, 1, 256, 4096),
            (6, 1, 128, 4096),
        ] {
            let geo = AttnGeometry {
                n_heads: nh,
                n_kv_heads: nkv,
                head_dim: hd,
            };
            // Enough layers that their caches exceed the last-level cache, as in a model.
            let layer_bytes = 2 * ctx * nkv * hd * 4;
            let layers = (128usize << 20).div_ceil(layer_bytes);
            let kh: Vec<Vec<Vec<f32>>> = (0..layers)
                .map(|_| vec![vec![0.01f32; ctx * hd]; nkv])
                .collect();
            let vh: Vec<Vec<Vec<f32>>> = (0..layers)
                .map(|_| vec![vec![0.02f32; ctx * hd]; nkv])
                .collect();
            let q = vec![0.1f32; nh * hd];
            let mut out = vec![0f32; nh * hd];
            let reps = 10;
            let t = std::time::Instant::now();
            for _ in 0..reps {
                for l in 0..layers {
                    let k: Vec<&[f32]> = kh[l].iter().map(|h| &h[..]).collect();
                    let v: Vec<&[f32]> = vh[l].iter().map(|h| &h[..]).collect();
                    attention(geo, &q, &k, &v, ctx - 1, 0.1, &mut out);
                }
            }
            let dt = t.elapsed().as_secs_f64() / (reps * layers) as f64;
            let bytes = (2 * ctx * nkv * hd * 4) as f64;
            eprintln!(
                "{nh}/{nkv}x{hd} ctx {ctx}: {:.3} ms per layer, {:.1} GB/s of KV",
                dt * 1e3,
                bytes / dt / 1e9
            );
        }
    }
}
