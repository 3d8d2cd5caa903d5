//! Tests of the convolution against its definition, and of tree nodes against runs over
//! their paths.

use super::*;
use crate::test_util::Rng;

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
    let mut rng = Rng::new(7);
    for &(ch, k) in &[(37usize, 4usize), (16, 1), (8, 2), (24, 5)] {
        let t_total = 11;
        let w = rng.vec(ch * k, 1.0);
        let seq = rng.vec(t_total * ch, 1.0);
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
    let mut rng = Rng::new(3);
    let taps = ConvTaps::from_channel_major(&rng.vec(ch * k, 1.0), ch, k);
    let state = rng.vec((k - 1) * ch, 1.0);
    // 0 → {1 → 2 → 3 → 4, 5}, 6 a second root.
    let parents = [usize::MAX, 0, 1, 2, 3, 0, usize::MAX];
    let n = parents.len();
    let x = rng.vec(n * ch, 1.0);
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
