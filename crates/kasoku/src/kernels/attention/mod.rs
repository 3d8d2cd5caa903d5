//! Multi-head causal attention of a batch of new tokens over a KV cache, with grouped-query
//! heads (query head `h` reads KV head `h / (n_heads / n_kv_heads)`).
//!
//! The cache is head-major: for each KV head, `[position][head_dim]` rows (contiguous, so
//! a task streams its keys and values; a position-major layout strides by a whole KV row per
//! key and measured ~5x slower at head_dim 256), stored as f32, f16 or q8_0 ([`stored`]) and
//! read in that format. It already contains the new tokens' keys and values: new row `i` sits
//! at position `past + i` and sees positions `0..=past + i` (the old cache plus the earlier
//! new tokens). Scores and softmax are f32.
//!
//! Work is split into tasks of (KV head, block of new rows, chunk of keys). A task serves every
//! query head of its KV head group, so each key and value row is read once per task however
//! many query heads share it, and long caches are split over the pool even for one new token
//! (each task keeps a partial softmax: max, sum and weighted values, merged at the end, as in
//! flash-decoding). Dot products, exponentials and weighted sums have an AVX2/FMA path beside
//! the portable one; both run the same task code.

use std::cell::Cell;

use super::scratch;
use super::simd::Isa;
use super::threads::{self, Blocks, Work};

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(test)]
mod bench;
pub mod stored;
#[cfg(test)]
mod tests;

pub use stored::{BlockQ8_0, KvHeads, Stored};

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

/// One attention call: the new rows' queries over a KV cache (see [`attend`]).
#[derive(Clone, Copy, Debug)]
pub struct AttnArgs<'a> {
    pub geo: AttnGeometry,
    /// The new rows' queries: `n × n_heads × head_dim`.
    pub q: &'a [f32],
    /// Per KV head, its keys: `[position][head_dim]`, the new rows' included.
    pub keys: KvHeads<'a>,
    /// Per KV head, its values, as `keys` (in the same format).
    pub values: KvHeads<'a>,
    /// Committed positions before the new rows.
    pub past: usize,
    /// The factor of the scores (usually `1 / sqrt(head_dim)`).
    pub scale: f32,
    /// How the rows see each other: `None` for a chain (row `i` at position `past + i` sees
    /// `0..=past + i`), or the nodes of a token tree.
    pub tree: Option<TreeRows<'a>>,
}

/// The new rows as nodes of a token tree (a draft being verified). Node `j`'s keys and values
/// sit at position `past + j`; a node sees the `past` committed positions, then its ancestors
/// from the root down, then itself: exactly the keys a plain decode of its path would see, in
/// the same order, and its result has the same bits as that decode's.
#[derive(Clone, Copy, Debug)]
pub struct TreeRows<'a> {
    /// Every node's parent (`< j`), or `usize::MAX` for a root (whose parent is the committed
    /// context).
    pub parents: &'a [usize],
    /// The node of query row 0: the rows are nodes `first..parents.len()` (a tree grown level
    /// by level computes only its new nodes; the earlier ones are in the cache already).
    pub first: usize,
}

/// `out[i][h] = Σ_j softmax_j(scale · q[i][h]·k[j][kvh]) · v[j][kvh]` over the positions `j`
/// row `i` sees (`out`: `n × n_heads × head_dim`). `keys[kvh]` and `values[kvh]` hold at
/// least the positions the rows see.
pub fn attend(args: &AttnArgs, out: &mut [f32]) {
    attention_with(Isa::detect(), args, out)
}

/// [`attend`] on the path of `isa`, but instead of writing the output, hands `rows` a
/// [`Merger`] that computes any output row on demand (each row once, from any thread): what
/// an epilogue fused into attention's (`kernels::fused`) consumes. The rows get the bits
/// [`attend`] writes.
pub(crate) fn attend_rows(isa: Isa, args: &AttnArgs, rows: &mut dyn FnMut(&Merger)) {
    attention_into(isa, args, Sink::Rows(rows))
}

/// Where an attention call's output goes.
enum Sink<'a> {
    /// Written in place: `n × n_heads × head_dim`.
    Out(&'a mut [f32]),
    /// Merged row by row by the function (see [`attend_rows`]).
    Rows(&'a mut dyn FnMut(&Merger)),
}

/// [`attend`] for a chain of new rows: row `i` sees positions `0..=past + i`.
pub fn attention(
    geo: AttnGeometry,
    q: &[f32],
    keys: &[&[f32]],
    values: &[&[f32]],
    past: usize,
    scale: f32,
    out: &mut [f32],
) {
    let args = AttnArgs {
        geo,
        q,
        keys: KvHeads::F32(keys),
        values: KvHeads::F32(values),
        past,
        scale,
        tree: None,
    };
    attend(&args, out)
}

/// [`attend`] for every node of a token tree (see [`TreeRows`]).
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

/// [`attend`] for the nodes `first..parents.len()` of a token tree (see [`TreeRows`]); kept
/// for callers of the positional form.
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
    let args = AttnArgs {
        geo,
        q,
        keys: KvHeads::F32(keys),
        values: KvHeads::F32(values),
        past,
        scale,
        tree: Some(TreeRows { parents, first }),
    };
    attend(&args, out)
}

/// Each tree node's path (root first, itself last), as node indices, flattened, in memory
/// reused from call to call.
struct TreePaths<'a> {
    /// `path(i) = nodes[start[i]..start[i + 1]]`.
    nodes: &'a [usize],
    start: &'a [usize],
    /// The node of query row 0.
    first: usize,
}

impl<'a> TreePaths<'a> {
    /// The paths of the tree `t`, built in `nodes` and `start`.
    fn build(t: TreeRows, nodes: &'a mut Vec<usize>, start: &'a mut Vec<usize>) -> Self {
        nodes.clear();
        start.clear();
        start.push(0);
        for (i, &p) in t.parents.iter().enumerate() {
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
            first: t.first,
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

thread_local! {
    /// The calling thread's tree paths (nodes, starts), partial results and task work memory.
    static PATH_NODES: Cell<Vec<usize>> = const { Cell::new(Vec::new()) };
    static PATH_STARTS: Cell<Vec<usize>> = const { Cell::new(Vec::new()) };
    static PARTIAL: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
    static SCORES: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// [`attend`] with a chosen instruction set.
pub(crate) fn attention_with(isa: Isa, args: &AttnArgs, out: &mut [f32]) {
    attention_into(isa, args, Sink::Out(out))
}

/// [`attend`] with a chosen instruction set, into `out`.
fn attention_into(isa: Isa, args: &AttnArgs, out: Sink) {
    match args.tree {
        None => run(isa, args, None, out),
        Some(t) => scratch::with(&PATH_NODES, |nodes| {
            scratch::with(&PATH_STARTS, |start| {
                let paths = TreePaths::build(t, nodes, start);
                run(isa, args, Some(&paths), out)
            })
        }),
    }
}

/// [`attention_into`] once the tree's paths are known: the keys' and values' format chosen.
fn run(isa: Isa, args: &AttnArgs, tree: Option<&TreePaths>, out: Sink) {
    match (args.keys, args.values) {
        (KvHeads::F32(k), KvHeads::F32(v)) => run_stored(isa, args, k, v, tree, out),
        (KvHeads::F16(k), KvHeads::F16(v)) => run_stored(isa, args, k, v, tree, out),
        (KvHeads::Q8_0(k), KvHeads::Q8_0(v)) => run_stored(isa, args, k, v, tree, out),
        _ => panic!("attention: keys and values stored in different formats"),
    }
}

/// [`run`] over keys and values stored as `S`.
fn run_stored<S: Stored>(
    isa: Isa,
    args: &AttnArgs,
    keys: &[&[S]],
    values: &[&[S]],
    tree: Option<&TreePaths>,
    out: Sink,
) {
    let AttnArgs {
        geo,
        q,
        past,
        scale,
        ..
    } = *args;
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
    let out_len = match &out {
        Sink::Out(o) => o.len(),
        Sink::Rows(_) => q.len(),
    };
    assert!(
        q.len().is_multiple_of(q_row) && out_len == q.len(),
        "attention: q/out lengths"
    );
    assert!(
        hd.is_multiple_of(S::VALUES),
        "attention: head_dim {hd} is not a whole number of the cache's blocks"
    );
    let units = hd / S::VALUES;
    let n = q.len() / q_row;
    // Cache rows the call may read: the context and every node up to the last row's.
    let total = past + tree.map_or(n, |t| t.first + n);
    assert!(
        keys.len() == n_kv_heads
            && values.len() == n_kv_heads
            && keys.iter().chain(values).all(|h| h.len() >= total * units),
        "attention: cache too short"
    );
    assert!(
        tree.is_none_or(|t| t.start.len() == t.first + n + 1),
        "attention: tree of another size"
    );
    let group = n_heads / n_kv_heads;
    if n == 0 {
        if let Sink::Rows(f) = out {
            let split = Split {
                rows_per: 1,
                row_blocks: 0,
                chunks: 0,
                per_task: 0,
            };
            f(&Merger {
                partial: &[],
                geo,
                split,
            });
        }
        return;
    }
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
    let ctx = Ctx {
        hd,
        group,
        q_row,
        past,
        scale,
        q,
        keys,
        values,
        units,
        tree,
    };
    // A task's scores: every (row, head) of its block × its keys, then a key and a value row
    // converted to f32.
    let scores_len = rows_per * group * chunk_len + 2 * hd;
    scratch::with(&PARTIAL, |partial| {
        let partial = scratch::grow(partial, n_tasks * per_task);
        scratch::with(&SCORES, |scores| {
            let parts = Blocks::chunks(&mut *partial, per_task);
            let work = Work::new(scores, scores_len);
            threads::for_each(n_tasks, parts, work, |t, dst, scores| {
                let c = t % chunks;
                let b = (t / chunks) % row_blocks;
                let kvh = t / (chunks * row_blocks);
                let rows = b * rows_per..((b + 1) * rows_per).min(n);
                let keys_range = c * chunk_len..((c + 1) * chunk_len).min(total);
                run_task(isa, &ctx, kvh, rows, keys_range, dst.into_slice(), scores);
            });
        });
        let split = Split {
            rows_per,
            row_blocks,
            chunks,
            per_task,
        };
        let merger = Merger {
            partial,
            geo,
            split,
        };
        match out {
            Sink::Out(out) => {
                for (i, row) in out.chunks_exact_mut(q_row).enumerate() {
                    merger.row(i, row);
                }
            }
            Sink::Rows(f) => f(&merger),
        }
    });
}

/// How a call's work was split into tasks: KV head, then block of rows, then chunk of keys.
#[derive(Clone, Copy)]
struct Split {
    rows_per: usize,
    row_blocks: usize,
    chunks: usize,
    /// Values of a task's partial result.
    per_task: usize,
}

/// The partial results of an attention call's tasks, from which [`Merger::row`] makes any
/// output row.
pub(crate) struct Merger<'a> {
    partial: &'a [f32],
    geo: AttnGeometry,
    split: Split,
}

impl Merger<'_> {
    /// Output row `i` (`n_heads × head_dim` values) into `dst`: for each head, the partial
    /// results of its key chunks merged in chunk order.
    pub(crate) fn row(&self, i: usize, dst: &mut [f32]) {
        let Split {
            rows_per,
            row_blocks,
            chunks,
            per_task,
        } = self.split;
        let (geo, partial) = (self.geo, self.partial);
        let (n_heads, hd) = (geo.n_heads, geo.head_dim);
        assert_eq!(dst.len(), n_heads * hd, "attention: output row length");
        let slot = hd + 2;
        let group = n_heads / geo.n_kv_heads;
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
            let dst = &mut dst[h * hd..][..hd];
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
struct Ctx<'a, S> {
    hd: usize,
    group: usize,
    q_row: usize,
    past: usize,
    scale: f32,
    q: &'a [f32],
    keys: &'a [&'a [S]],
    values: &'a [&'a [S]],
    /// Stored elements per row: `hd / S::VALUES`.
    units: usize,
    tree: Option<&'a TreePaths<'a>>,
}

impl<S: Stored> Ctx<'_, S> {
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

    /// The stored row at `slot` of the head's rows `heads`.
    #[inline(always)]
    fn row<'b>(&self, heads: &'b [S], slot: usize) -> &'b [S] {
        &heads[slot * self.units..][..self.units]
    }
}

/// One task on the path `isa` allows, with `scores` of at least `rows × group × keys` values
/// and two rows (see [`task`]).
fn run_task<S: Stored>(
    isa: Isa,
    ctx: &Ctx<S>,
    kvh: usize,
    rows: std::ops::Range<usize>,
    keys: std::ops::Range<usize>,
    dst: &mut [f32],
    scores: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        // SAFETY: an `Isa` with AVX2 exists only on CPUs with AVX2, FMA and F16C
        // (`kernels::simd`).
        unsafe { avx2::task(ctx, kvh, rows, keys, dst, scores) };
        return;
    }
    let _ = isa;
    task::<Portable, S>(ctx, kvh, rows, keys, dst, scores);
}

/// The vector primitives a task needs.
trait Ops {
    fn dot(a: &[f32], b: &[f32]) -> f32;
    fn axpy(y: &mut [f32], alpha: f32, x: &[f32]);
    /// `x[i] = exp(x[i] - max)`, returns the sum.
    fn exp_sum(x: &mut [f32], max: f32) -> f32;
    /// The stored row's values as f32 (as [`Stored::load`] converts them).
    fn load<S: Stored>(row: &[S], out: &mut [f32]);
}

/// The row as f32: itself when stored as f32, else converted into `buf`.
#[inline(always)]
fn f32_row<'b, O: Ops, S: Stored>(row: &'b [S], buf: &'b mut [f32]) -> &'b [f32] {
    match S::as_f32(row) {
        Some(r) => r,
        None => {
            O::load(row, buf);
            buf
        }
    }
}

/// Partial attention of the query heads of `kvh` for `rows` over the keys `keys`: for each
/// (row, head) writes `[max score, Σ exp(score - max), Σ exp(score - max) · v]` to `dst`
/// (max = -inf and sum = 0 when the row sees none of these keys). `scores` is work memory
/// (every value read is written first): the scores, then two rows of `hd` values.
#[inline(always)]
fn task<O: Ops, S: Stored>(
    ctx: &Ctx<S>,
    kvh: usize,
    rows: std::ops::Range<usize>,
    keys: std::ops::Range<usize>,
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
        ..
    } = *ctx;
    let (kc, vc) = (kc[kvh], vc[kvh]);
    let slot = hd + 2;
    let width = keys.len();
    let n_q = rows.len() * group;
    let (scores, rest) = scores.split_at_mut(n_q * width);
    let (kbuf, vbuf) = rest.split_at_mut(hd);
    let vbuf = &mut vbuf[..hd];
    // Keys this (row, head) sees in the chunk: row i sees positions ≤ its own.
    let seen = |i: usize| ctx.seen(i, &keys);
    let max_seen = rows.clone().map(seen).max().unwrap_or(0);
    for j in 0..max_seen {
        for (r, i) in rows.clone().enumerate() {
            if j >= seen(i) {
                continue;
            }
            let k = f32_row::<O, S>(ctx.row(kc, ctx.slot(i, keys.start + j)), kbuf);
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
            let v = f32_row::<O, S>(ctx.row(vc, ctx.slot(i, keys.start + j)), vbuf);
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

    #[inline(always)]
    fn load<S: Stored>(row: &[S], out: &mut [f32]) {
        S::load(row, out)
    }
}
