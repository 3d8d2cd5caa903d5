//! Tests of the rotations against Hugging Face's formulation, and of the frequency scalings.

use super::*;
use crate::test_util::Rng;

fn values(n: usize, seed: u64) -> Vec<f32> {
    Rng::new(seed).vec(n, 1.0)
}

/// Hugging Face's formulation: x·cos(emb) + rotate_half(x)·sin(emb), emb = [f, f].
fn reference_neox(x: &[f32], hd: usize, rd: usize, theta: f64, pos: usize) -> Vec<f64> {
    let half = rd / 2;
    let mut out: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    for (h, head) in x.chunks(hd).enumerate() {
        for j in 0..rd {
            let i = j % half;
            let angle = pos as f64 / theta.powf(2.0 * i as f64 / rd as f64);
            let rot = if j < half {
                -(head[j + half] as f64)
            } else {
                head[j - half] as f64
            };
            out[h * hd + j] = head[j] as f64 * angle.cos() + rot * angle.sin();
        }
    }
    out
}

#[test]
fn neox_full_and_partial_match_rotate_half() {
    for &(hd, rd) in &[(8usize, 8usize), (64, 64), (32, 8), (256, 64)] {
        for &pos in &[0usize, 1, 7, 300] {
            let mut x = values(3 * hd, (hd * 31 + pos) as u64);
            let want = reference_neox(&x, hd, rd, 10000.0, pos);
            let rope = Rope::new(hd, rd, 10000.0, RopeLayout::Neox, &RopeScaling::None, None);
            rope.apply(&mut x, 3, &[pos]);
            for (a, b) in x.iter().zip(&want) {
                assert!(
                    (*a as f64 - b).abs() < 2e-4 * (1.0 + b.abs()),
                    "hd={hd} rd={rd} pos={pos}: {a} vs {b}"
                );
            }
        }
    }
}

/// A head permuted into the interleaved layout (x'[2i] = x[i], x'[2i+1] = x[i+half]) and
/// rotated interleaved equals the NeoX rotation of the original, permuted the same way.
#[test]
fn interleaved_is_neox_after_permutation() {
    let (hd, pos) = (16usize, 5usize);
    let x = values(hd, 3);
    let mut perm = vec![0f32; hd];
    for i in 0..hd / 2 {
        perm[2 * i] = x[i];
        perm[2 * i + 1] = x[i + hd / 2];
    }
    let neox = Rope::new(hd, hd, 500.0, RopeLayout::Neox, &RopeScaling::None, None);
    let inter = Rope::new(
        hd,
        hd,
        500.0,
        RopeLayout::Interleaved,
        &RopeScaling::None,
        None,
    );
    let mut a = x.clone();
    neox.apply(&mut a, 1, &[pos]);
    inter.apply(&mut perm, 1, &[pos]);
    for i in 0..hd / 2 {
        assert!((perm[2 * i] - a[i]).abs() < 1e-6);
        assert!((perm[2 * i + 1] - a[i + hd / 2]).abs() < 1e-6);
    }
}

#[test]
fn partial_rotation_leaves_tail_and_position_zero_is_identity() {
    let rope = Rope::new(32, 8, 1e4, RopeLayout::Neox, &RopeScaling::None, None);
    let x = values(64, 9);
    let mut y = x.clone();
    rope.apply(&mut y, 2, &[123]);
    assert_eq!(&y[8..32], &x[8..32]);
    assert_eq!(&y[40..64], &x[40..64]);
    assert_ne!(&y[..8], &x[..8]);
    let mut z = x.clone();
    rope.apply(&mut z, 2, &[0]);
    assert_eq!(z, x);
}

#[test]
fn rows_use_their_own_positions() {
    let rope = Rope::new(8, 8, 1e4, RopeLayout::Neox, &RopeScaling::None, None);
    let x = values(16, 4);
    let mut batch = x.clone();
    rope.apply(&mut batch, 1, &[3, 9]);
    let mut a = x[..8].to_vec();
    let mut b = x[8..].to_vec();
    rope.apply(&mut a, 1, &[3]);
    rope.apply(&mut b, 1, &[9]);
    assert_eq!(&batch[..8], &a[..]);
    assert_eq!(&batch[8..], &b[..]);
}

/// Llama 3.1 scaling (factor 8, low 1, high 4, original 8192), checked against the formula
/// applied by hand to three frequencies, one in each band.
#[test]
fn llama3_scaling_bands() {
    let scaling = RopeScaling::Llama3 {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position: 8192.0,
    };
    let (hd, theta) = (128usize, 500000.0f64);
    let plain = Rope::new(hd, hd, theta, RopeLayout::Neox, &RopeScaling::None, None);
    let scaled = Rope::new(hd, hd, theta, RopeLayout::Neox, &scaling, None);
    let mut seen = [false; 3];
    for (i, (&f, &g)) in plain.inv_freq().iter().zip(scaled.inv_freq()).enumerate() {
        let wl = 2.0 * std::f64::consts::PI / f;
        if wl < 2048.0 {
            assert_eq!(f, g, "pair {i} is high-frequency");
            seen[0] = true;
        } else if wl > 8192.0 {
            assert!((g - f / 8.0).abs() < 1e-15, "pair {i} is low-frequency");
            seen[1] = true;
        } else {
            let s = (8192.0 / wl - 1.0) / 3.0;
            assert!((g - ((1.0 - s) * f / 8.0 + s * f)).abs() < 1e-15);
            assert!(g < f && g > f / 8.0);
            seen[2] = true;
        }
    }
    assert_eq!(seen, [true; 3]);
}

#[test]
fn freq_factors_divide_frequencies() {
    let ff: Vec<f32> = (0..4).map(|i| 1.0 + i as f32).collect();
    let a = Rope::new(8, 8, 1e4, RopeLayout::Interleaved, &RopeScaling::None, None);
    let b = Rope::new(
        8,
        8,
        1e4,
        RopeLayout::Interleaved,
        &RopeScaling::None,
        Some(&ff),
    );
    for ((&fb, &fa), &d) in b.inv_freq().iter().zip(a.inv_freq()).zip(&ff) {
        assert!((fb - fa / d as f64).abs() < 1e-15);
    }
}
