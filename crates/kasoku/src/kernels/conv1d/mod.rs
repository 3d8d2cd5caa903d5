//! Causal depthwise 1-D convolution followed by SiLU, over a batch of tokens with a rolling
//! state: the short convolution of Gated DeltaNet (kernel K = 4, no bias).
//!
//! For channel `c` and token `t` (inputs `x[t][c]`, taps `w[c][j]`, `j = K-1` the current token):
//! `y[t][c] = silu(Σ_j w[c][j] · x[t-(K-1)+j][c])`, where inputs before the batch come from the
//! state (the last `K-1` inputs seen, oldest first; zeros for a fresh sequence).
//!
//! Layouts are time-major so that the inner loop runs over contiguous channels:
//! - `x`, `y`: `n × channels`;
//! - `state`: `(K-1) × channels`, row 0 the oldest input (a future tree commit copies rows);
//! - taps: [`ConvTaps`], `K × channels` (tap-major, built once at load from `[channels, K]`).
//!
//! The work (`n·channels·K` multiply-adds plus one exponential per output) is tiny beside the
//! projections around it, so there is one portable path, written so that the compiler
//! vectorises the tap loop; no hand-written SIMD.

use std::cell::Cell;

use super::activation::silu;
use super::scratch;

#[cfg(test)]
mod tests;

/// Convolution taps in tap-major layout (`K × channels`).
#[derive(Clone, Debug)]
pub struct ConvTaps {
    channels: usize,
    kernel: usize,
    taps: Vec<f32>,
}

impl ConvTaps {
    /// Builds taps from the checkpoint layout `[channels, K]` (row `c` holds channel `c`'s
    /// taps, the last one multiplying the current token). Panics if the length is not
    /// `channels × kernel` or `kernel` is 0 (shapes are validated when the tensor is claimed).
    pub fn from_channel_major(weights: &[f32], channels: usize, kernel: usize) -> Self {
        assert!(kernel >= 1, "conv1d: kernel size 0");
        assert_eq!(weights.len(), channels * kernel, "conv1d: weight length");
        let mut taps = vec![0f32; kernel * channels];
        for c in 0..channels {
            for j in 0..kernel {
                taps[j * channels + c] = weights[c * kernel + j];
            }
        }
        ConvTaps {
            channels,
            kernel,
            taps,
        }
    }

    pub fn channels(&self) -> usize {
        self.channels
    }

    /// The kernel size K.
    pub fn kernel(&self) -> usize {
        self.kernel
    }

    /// Number of f32 values in the rolling state: `(K-1) × channels`.
    pub fn state_len(&self) -> usize {
        (self.kernel - 1) * self.channels
    }

    pub(crate) fn tap(&self, j: usize) -> &[f32] {
        &self.taps[j * self.channels..(j + 1) * self.channels]
    }
}

/// Convolves `n` tokens (`x`: `n × channels`) with `taps`, applies SiLU, writes `y`
/// (`n × channels`) and advances `state` (`(K-1) × channels`) to the last `K-1` inputs.
pub fn causal_conv1d_silu(taps: &ConvTaps, state: &mut [f32], x: &[f32], n: usize, y: &mut [f32]) {
    let ch = taps.channels;
    let k = taps.kernel;
    let hist = k - 1;
    assert_eq!(state.len(), hist * ch, "conv1d: state length");
    assert_eq!(x.len(), n * ch, "conv1d: input length");
    assert_eq!(y.len(), n * ch, "conv1d: output length");
    if n == 0 {
        return;
    }
    // Input row `i` of the virtual sequence [state rows | x rows].
    let row = |i: usize| -> &[f32] {
        if i < hist {
            &state[i * ch..(i + 1) * ch]
        } else {
            &x[(i - hist) * ch..(i - hist + 1) * ch]
        }
    };
    for t in 0..n {
        let out = &mut y[t * ch..(t + 1) * ch];
        // Token t sits at virtual row t + hist; tap j reads virtual row t + j.
        for ((o, a), w) in out.iter_mut().zip(row(t)).zip(taps.tap(0)) {
            *o = a * w;
        }
        for j in 1..k {
            for ((o, a), w) in out.iter_mut().zip(row(t + j)).zip(taps.tap(j)) {
                *o += a * w;
            }
        }
        for o in out.iter_mut() {
            *o = silu(*o);
        }
    }
    // New state: the last `hist` rows of [state | x] (the state's own rows moved up first).
    if n >= hist {
        state.copy_from_slice(&x[(n - hist) * ch..]);
    } else {
        state.copy_within(n * ch.., 0);
        state[(hist - n) * ch..].copy_from_slice(x);
    }
}

/// The rows a tree node's convolution window reads, oldest first, into `rows`: its `K-1`
/// predecessors along parent pointers (`parents[i] < i`, `usize::MAX` for a root), continuing
/// into the committed state above the root, then the node itself. A row is named by its place
/// in the virtual sequence [state rows | x rows]: state row `r` is `r`, node `i` is
/// `K - 1 + i`.
fn tree_window(parents: &[usize], k: usize, node: usize, rows: &mut Vec<usize>) {
    let hist = k - 1;
    rows.clear();
    let mut at = node;
    let mut in_state = hist; // rows of the state still unread, from the newest
    rows.push(hist + at);
    while rows.len() < k {
        if at != usize::MAX && parents[at] != usize::MAX {
            at = parents[at];
            rows.push(hist + at);
        } else {
            at = usize::MAX;
            in_state -= 1;
            rows.push(in_state);
        }
    }
    rows.reverse();
}

/// Row `v` of the virtual sequence [state rows | x rows] (see [`tree_window`]).
fn window_row<'a>(state: &'a [f32], x: &'a [f32], ch: usize, hist: usize, v: usize) -> &'a [f32] {
    if v < hist {
        &state[v * ch..(v + 1) * ch]
    } else {
        &x[(v - hist) * ch..(v - hist + 1) * ch]
    }
}

thread_local! {
    /// The calling thread's window rows, and the state being committed.
    static WINDOW: Cell<Vec<usize>> = const { Cell::new(Vec::new()) };
    static NEXT: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// [`causal_conv1d_silu`] for the nodes of a token tree (`x`: `n × channels`, `parents` as
/// in [`tree_window`]), leaving `state` untouched: node `i` convolves its own path, and its
/// output has the bits a plain run over that path gives.
pub fn tree_conv1d_silu(
    taps: &ConvTaps,
    state: &[f32],
    x: &[f32],
    parents: &[usize],
    y: &mut [f32],
) {
    let (ch, k) = (taps.channels, taps.kernel);
    let n = parents.len();
    assert_eq!(state.len(), (k - 1) * ch, "conv1d: state length");
    assert!(
        x.len() == n * ch && y.len() == n * ch,
        "conv1d: tree lengths"
    );
    let hist = k - 1;
    scratch::with(&WINDOW, |rows| {
        for i in 0..n {
            tree_window(parents, k, i, rows);
            let row = |j: usize| window_row(state, x, ch, hist, rows[j]);
            let out = &mut y[i * ch..(i + 1) * ch];
            for ((o, a), w) in out.iter_mut().zip(row(0)).zip(taps.tap(0)) {
                *o = a * w;
            }
            for j in 1..k {
                for ((o, a), w) in out.iter_mut().zip(row(j)).zip(taps.tap(j)) {
                    *o += a * w;
                }
            }
            for o in out.iter_mut() {
                *o = silu(*o);
            }
        }
    });
}

/// The conv state after committing the tree path that ends at `node`: the last `K-1` inputs
/// of that path (reaching into the old state when the path is short). Replaces `state`.
pub fn tree_conv_commit(
    taps: &ConvTaps,
    state: &mut [f32],
    x: &[f32],
    parents: &[usize],
    node: usize,
) {
    let (ch, k) = (taps.channels, taps.kernel);
    let hist = k - 1;
    assert_eq!(state.len(), hist * ch, "conv1d: state length");
    scratch::with(&WINDOW, |rows| {
        scratch::with(&NEXT, |next| {
            tree_window(parents, k, node, rows);
            let next = scratch::grow(next, hist * ch);
            for (dst, &v) in next.chunks_exact_mut(ch).zip(&rows[1..]) {
                dst.copy_from_slice(window_row(state, x, ch, hist, v));
            }
            state.copy_from_slice(next);
        })
    });
}
