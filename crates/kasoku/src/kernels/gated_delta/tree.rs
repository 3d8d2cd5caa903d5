//! The Gated DeltaNet recurrence over a token tree (a draft being verified), and the commit
//! that advances the state along the accepted path.
//!
//! Node `i` starts from its parent's state (the committed state for a root) and takes one
//! recurrent step with its own inputs; nothing is written to the committed state. The step is
//! the very arithmetic of single-token decoding (same functions, same order), so every node's
//! output has the bits plain decoding of its path would give. Each value head walks the nodes
//! in depth-first order keeping one state per depth (a node's parent is always the last node
//! seen one level up), so a tree of depth `D` needs `D` scratch states per head, and leaves
//! need none.
//!
//! The pass returns each node's `δ` (per value head); [`replay`] applies
//! `S ← e^{g}·S + k ⊗ δ` for one accepted node, which is exactly decoding's state update, so
//! the committed state equals plain decoding's bit for bit.

use std::cell::Cell;

use super::{GdnDims, GdnInputs, HeadIo};
use crate::kernels::scratch;
use crate::kernels::simd::Isa;
use crate::kernels::threads::{self, Blocks, Work};

/// Runs every node of a tree through the recurrence from the committed `state`
/// (`nv × dk × dv`, read only). `parents[i] < i` is node `i`'s parent (`usize::MAX` for a
/// root). Writes `out` (`n × nv × dv`, the outputs `o`) and `deltas` (`n × nv × dv`, for
/// [`replay`]).
pub fn tree_recurrent(
    dims: &GdnDims,
    inp: &GdnInputs,
    parents: &[usize],
    state: &[f32],
    out: &mut [f32],
    deltas: &mut [f32],
) {
    tree_recurrent_with(Isa::detect(), dims, inp, parents, state, out, deltas)
}

/// [`tree_recurrent`] with an explicit instruction set (tests compare them).
pub(crate) fn tree_recurrent_with(
    isa: Isa,
    dims: &GdnDims,
    inp: &GdnInputs,
    parents: &[usize],
    state: &[f32],
    out: &mut [f32],
    deltas: &mut [f32],
) {
    let n = parents.len();
    super::check(dims, inp, n, state, out);
    assert_eq!(deltas.len(), out.len(), "gated_delta tree: deltas length");
    if n == 0 {
        return;
    }
    scratch::with(&DEPTHS, |depth| {
        scratch::with(&HAS_CHILD, |has_child| {
            tree_nodes(
                isa, dims, inp, parents, state, out, deltas, depth, has_child,
            )
        })
    })
}

thread_local! {
    /// The calling thread's node depths and has-children flags.
    static DEPTHS: Cell<Vec<usize>> = const { Cell::new(Vec::new()) };
    static HAS_CHILD: Cell<Vec<bool>> = const { Cell::new(Vec::new()) };
}

/// [`tree_recurrent_with`] with memory for the nodes' depths and has-children flags.
#[allow(clippy::too_many_arguments)]
fn tree_nodes(
    isa: Isa,
    dims: &GdnDims,
    inp: &GdnInputs,
    parents: &[usize],
    state: &[f32],
    out: &mut [f32],
    deltas: &mut [f32],
    depth: &mut Vec<usize>,
    has_child: &mut Vec<bool>,
) {
    let n = parents.len();
    depth.clear();
    depth.resize(n, 0);
    has_child.clear();
    has_child.resize(n, false);
    for (i, &p) in parents.iter().enumerate() {
        if p != usize::MAX {
            assert!(
                p < i,
                "gated_delta tree: parent {p} of node {i} is not before it"
            );
            depth[i] = depth[p] + 1;
            has_child[p] = true;
        }
    }
    let max_depth = depth.iter().copied().max().unwrap_or(0);
    let d = *dims;
    let per_head = d.dk * d.dv;
    let (depth, has_child) = (&*depth, &*has_child);
    let parts = (Blocks::new(out, n, d.dv), Blocks::new(deltas, n, d.dv));
    // Per head: a state per depth, and two vectors of the step.
    let work_len = max_depth * per_head + 2 * d.dv;
    scratch::with(&super::WORK, |buf| {
        let work = Work::new(buf, work_len);
        threads::for_each(d.nv, parts, work, |h, (mut out, mut deltas), work| {
            let io = HeadIo {
                inp,
                dims: d,
                h,
                kh: d.key_head(h),
            };
            let s0 = &state[h * per_head..(h + 1) * per_head];
            // Slot `l` holds the state after the last node seen at depth `l` that has
            // children (written before any child reads it).
            let (slots, rest) = work.split_at_mut(max_depth * per_head);
            let (kv, rest) = rest.split_at_mut(d.dv);
            let sq = &mut rest[..d.dv];
            for i in 0..n {
                let (o, delta) = (out.row(i), deltas.row(i));
                let (before, after) = slots.split_at_mut(depth[i] * per_head);
                let s_in: &[f32] = if parents[i] == usize::MAX {
                    s0
                } else {
                    &before[(depth[i] - 1) * per_head..]
                };
                let alpha = io.g(i).exp();
                step(isa, &io, i, alpha, s_in, kv, sq, o, delta);
                if has_child[i] {
                    let s_out = &mut after[..per_head];
                    s_out.copy_from_slice(s_in);
                    update(isa, &d, s_out, alpha, io.k(i), delta);
                }
            }
        });
    });
}

/// Advances `state` (`nv × dk × dv`) by one accepted node: `S ← e^{g}·S + k ⊗ δ` per value
/// head, with that node's `k` (`nk × dk`), `g` (`nv`) and `δ` (`nv × dv`, from
/// [`tree_recurrent`]).
pub fn replay(dims: &GdnDims, state: &mut [f32], k: &[f32], g: &[f32], delta: &[f32]) {
    replay_with(Isa::detect(), dims, state, k, g, delta)
}

/// [`replay`] with an explicit instruction set.
pub(crate) fn replay_with(
    isa: Isa,
    dims: &GdnDims,
    state: &mut [f32],
    k: &[f32],
    g: &[f32],
    delta: &[f32],
) {
    let d = *dims;
    assert!(
        state.len() == d.state_len()
            && k.len() == d.nk * d.dk
            && g.len() == d.nv
            && delta.len() == d.nv * d.dv,
        "gated_delta replay: lengths"
    );
    let per_head = d.dk * d.dv;
    threads::for_each_disjoint(state, per_head, |h, s| {
        let kh = d.key_head(h);
        update(
            isa,
            &d,
            s,
            g[h].exp(),
            &k[kh * d.dk..(kh + 1) * d.dk],
            &delta[h * d.dv..(h + 1) * d.dv],
        );
    });
}

/// One node's outputs from the state before it: `δ = β(v − α·Sᵀk)`, `o = α·Sᵀq + (q·k)·δ`,
/// computed as the single-token recurrent kernels compute them.
#[allow(clippy::too_many_arguments)]
fn step(
    isa: Isa,
    io: &HeadIo,
    t: usize,
    alpha: f32,
    s: &[f32],
    kv: &mut [f32],
    sq: &mut [f32],
    o: &mut [f32],
    delta: &mut [f32],
) {
    let (dk, dv) = (io.dims.dk, io.dims.dv);
    let (q, k, v) = (io.q(t), io.k(t), io.v(t));
    let beta = io.beta(t);
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() && dv.is_multiple_of(8) {
        // SAFETY: an `Isa` with AVX2 exists only on CPUs with AVX2, FMA and F16C
        // (`kernels::simd`); the slices have the lengths `check` verified.
        let qk = unsafe {
            super::avx2::project(s, dk, dv, k, q, kv, sq);
            super::avx2::dot(q, k)
        };
        for j in 0..dv {
            delta[j] = beta * (v[j] - alpha * kv[j]);
            o[j] = alpha * sq[j] + qk * delta[j];
        }
        return;
    }
    let _ = (isa, sq);
    super::recurrent::portable_step(s, dk, dv, (q, k, v), alpha, beta, kv, o, delta)
}

/// `S = α·S + k ⊗ δ` for one head, as the recurrent kernels do it.
fn update(isa: Isa, d: &GdnDims, s: &mut [f32], alpha: f32, k: &[f32], delta: &[f32]) {
    let (dk, dv) = (d.dk, d.dv);
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() && dv.is_multiple_of(8) {
        // SAFETY: as in `step`.
        unsafe { super::avx2::update(s, dk, dv, alpha, k, delta) };
        return;
    }
    let _ = isa;
    super::recurrent::portable_update(s, dk, dv, alpha, k, delta)
}
