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

use super::activation::silu;

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

    fn tap(&self, j: usize) -> &[f32] {
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
    // New state: the last `hist` rows of [state | x].
    if hist > 0 {
        let total = hist + n;
        let mut next = vec![0f32; hist * ch];
        for r in 0..hist {
            next[r * ch..(r + 1) * ch].copy_from_slice(row(total - hist + r));
        }
        state.copy_from_slice(&next);
    }
}

/// The inputs a tree node's convolution window reads, oldest first: its `K-1` predecessors
/// along parent pointers (`parents[i] < i`, `usize::MAX` for a root), continuing into the
/// committed `state` above the root, then the node itself.
fn tree_window<'a>(
    state: &'a [f32],
    x: &'a [f32],
    parents: &[usize],
    ch: usize,
    k: usize,
    node: usize,
) -> Vec<&'a [f32]> {
    let hist = k - 1;
    let mut rows: Vec<&[f32]> = Vec::with_capacity(k);
    let mut at = node;
    let mut in_state = hist; // rows of the state still unread, from the newest
    rows.push(&x[at * ch..(at + 1) * ch]);
    while rows.len() < k {
        if at != usize::MAX && parents[at] != usize::MAX {
            at = parents[at];
            rows.push(&x[at * ch..(at + 1) * ch]);
        } else {
            at = usize::MAX;
            in_state -= 1;
            rows.push(&state[in_state * ch..(in_state + 1) * ch]);
        }
    }
    rows.reverse();
    rows
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
    for i in 0..n {
        let rows = tree_window(state, x, parents, ch, k, i);
        let out = &mut y[i * ch..(i + 1) * ch];
        for ((o, a), w) in out.iter_mut().zip(rows[0]).zip(taps.tap(0)) {
            *o = a * w;
        }
        for (j, row) in rows.iter().enumerate().skip(1) {
            for ((o, a), w) in out.iter_mut().zip(*row).zip(taps.tap(j)) {
                *o += a * w;
            }
        }
        for o in out.iter_mut() {
            *o = silu(*o);
        }
    }
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
    assert_eq!(state.len(), (k - 1) * ch, "conv1d: state length");
    let rows = tree_window(state, x, parents, ch, k, node);
    let next: Vec<f32> = rows[1..].concat();
    state.copy_from_slice(&next);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rand_vec(seed: &mut u64, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| {
                *seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// Direct definition: zero-padded full sequence, cross-correlation, SiLU.
    fn naive(w: &[f32], ch: usize, k: usize, seq: &[f32], t_total: usize) -> Vec<f32> {
        let mut y = vec![0f32; t_total * ch];
        for t in 0..t_total {
            for c in 0..ch {
                let mut s = 0f32;
                for j in 0..k {
                    let ti = t as isize - (k as isize - 1) + j as isize;
                    if ti >= 0 {
                        s += w[c * k + j] * seq[ti as usize * ch + c];
                    }
                }
                y[t * ch + c] = s / (1.0 + (-s).exp());
            }
        }
        y
    }

    #[test]
    fn batch_matches_definition_and_one_at_a_time() {
        let mut seed = 7;
        for &(ch, k) in &[(37usize, 4usize), (16, 1), (8, 2), (24, 5)] {
            let t_total = 11;
            let w = rand_vec(&mut seed, ch * k);
            let seq = rand_vec(&mut seed, t_total * ch);
            let taps = ConvTaps::from_channel_major(&w, ch, k);
            let want = naive(&w, ch, k, &seq, t_total);

            // Whole sequence in one batch from a zero state.
            let mut state = vec![0f32; taps.state_len()];
            let mut y = vec![0f32; t_total * ch];
            causal_conv1d_silu(&taps, &mut state, &seq, t_total, &mut y);
            let err = y
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(err < 1e-5, "batch ch={ch} k={k}: {err}");
            let batch_state = state.clone();

            // One token at a time, and in uneven pieces (1, 2, 5, 3): same outputs and state.
            for pieces in [vec![1usize; t_total], vec![1, 2, 5, 3]] {
                let mut state = vec![0f32; taps.state_len()];
                let mut y = vec![0f32; t_total * ch];
                let mut t0 = 0;
                for p in pieces {
                    causal_conv1d_silu(
                        &taps,
                        &mut state,
                        &seq[t0 * ch..(t0 + p) * ch],
                        p,
                        &mut y[t0 * ch..(t0 + p) * ch],
                    );
                    t0 += p;
                }
                assert_eq!(t0, t_total);
                let err = y
                    .iter()
                    .zip(&want)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0f32, f32::max);
                assert!(err < 1e-5, "pieces ch={ch} k={k}: {err}");
                assert_eq!(state, batch_state);
            }
            // The state holds the last K-1 inputs, oldest first.
            let hist = k - 1;
            assert_eq!(&batch_state[..], &seq[(t_total - hist) * ch..]);
        }
    }

    #[test]
    fn short_batch_keeps_older_state_rows() {
        // n < K-1: the new state mixes old state rows and the new inputs.
        let (ch, k) = (3, 4);
        let w = vec![0.5f32; ch * k];
        let taps = ConvTaps::from_channel_major(&w, ch, k);
        let mut state: Vec<f32> = (0..9).map(|i| i as f32).collect();
        let x = vec![10.0f32, 11.0, 12.0];
        let mut y = vec![0f32; 3];
        causal_conv1d_silu(&taps, &mut state, &x, 1, &mut y);
        assert_eq!(state, vec![3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 10.0, 11.0, 12.0]);
        // Channel 0: 0.5 · (0 + 3 + 6 + 10) = 9.5.
        assert!((y[0] - silu(9.5)).abs() < 1e-6);
    }

    /// Tree nodes convolve their own paths: outputs and committed states equal a plain run
    /// over each path, bit for bit.
    #[test]
    fn tree_nodes_equal_runs_over_their_paths() {
        let (ch, k) = (5usize, 4usize);
        let mut seed = 3u64;
        let taps = ConvTaps::from_channel_major(&rand_vec(&mut seed, ch * k), ch, k);
        let state = rand_vec(&mut seed, (k - 1) * ch);
        // 0 → {1 → 2 → 3 → 4, 5}, 6 a second root.
        let parents = [usize::MAX, 0, 1, 2, 3, 0, usize::MAX];
        let n = parents.len();
        let x = rand_vec(&mut seed, n * ch);
        let mut y = vec![0f32; n * ch];
        tree_conv1d_silu(&taps, &state, &x, &parents, &mut y);
        for node in 0..n {
            let mut path = vec![node];
            while parents[*path.last().unwrap()] != usize::MAX {
                path.push(parents[*path.last().unwrap()]);
            }
            path.reverse();
            let xp: Vec<f32> = path
                .iter()
                .flat_map(|&i| x[i * ch..(i + 1) * ch].to_vec())
                .collect();
            let mut st = state.clone();
            let mut yp = vec![0f32; path.len() * ch];
            causal_conv1d_silu(&taps, &mut st, &xp, path.len(), &mut yp);
            let last = &yp[(path.len() - 1) * ch..];
            assert!(
                last.iter()
                    .zip(&y[node * ch..])
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "node {node}"
            );
            let mut committed = state.clone();
            tree_conv_commit(&taps, &mut committed, &x, &parents, node);
            assert_eq!(committed, st, "state after the path to {node}");
        }
    }
}
