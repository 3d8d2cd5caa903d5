//! Tests of RMSNorm against an f64 reference, and of the AVX2 path against the portable one.

use super::*;
use crate::test_util::Rng;

/// Deterministic pseudo-random values in [-scale, scale).
fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    Rng::new(seed).vec(n, scale)
}

fn reference(x: &[f32], w: &[f32], eps: f32) -> Vec<f64> {
    let d = w.len();
    let mut out = Vec::new();
    for r in x.chunks(d) {
        let ms: f64 = r.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>() / d as f64;
        let s = 1.0 / (ms + eps as f64).sqrt();
        out.extend(r.iter().zip(w).map(|(&v, &g)| v as f64 * s * g as f64));
    }
    out
}

#[test]
fn rmsnorm_matches_f64_reference() {
    for &d in &[1usize, 7, 8, 15, 16, 17, 64, 576, 1000] {
        let x = values(3 * d, d as u64, 4.0);
        let w = values(d, 99 + d as u64, 2.0);
        let want = reference(&x, &w, 1e-5);
        let mut got = vec![0f32; x.len()];
        rmsnorm(&x, &w, 1e-5, &mut got);
        let mut inplace = x.clone();
        rmsnorm_inplace(&mut inplace, &w, 1e-5);
        for i in 0..x.len() {
            assert!(
                (got[i] as f64 - want[i]).abs() <= 1e-5 * (1.0 + want[i].abs()),
                "d={d} i={i}"
            );
            assert_eq!(got[i], inplace[i]);
        }
    }
}

#[test]
fn portable_and_avx2_agree() {
    #[cfg(target_arch = "x86_64")]
    if Isa::detect().avx2() {
        for &d in &[3usize, 8, 24, 33, 576, 2048] {
            let x = values(d, 7 * d as u64, 10.0);
            let w = values(d, 3, 1.0);
            let (mut a, mut b) = (vec![0f32; d], vec![0f32; d]);
            portable::row(&x, &w, 1e-6, &mut a);
            // SAFETY: AVX2 and FMA are available.
            unsafe { avx2::row(&x, &w, 1e-6, &mut b) };
            for i in 0..d {
                assert!(
                    (a[i] - b[i]).abs() <= 1e-5 * (1.0 + a[i].abs()),
                    "d={d} i={i}: {} vs {}",
                    a[i],
                    b[i]
                );
            }
        }
        return;
    }
    eprintln!("note: AVX2/FMA not available; only the portable path was tested");
}

#[test]
fn zero_row_gives_zero_not_nan() {
    let x = vec![0f32; 16];
    let w = vec![1f32; 16];
    let mut y = vec![1f32; 16];
    rmsnorm(&x, &w, 1e-6, &mut y);
    assert!(y.iter().all(|v| *v == 0.0));
}
