//! A timing of the fused epilogues against their unfused kernels followed by the product's
//! own preparation of the rows, at Qwen2.5-Coder-1.5B's widths (ignored; run by hand).

use super::*;
use crate::kernels::activation::swiglu_inplace;
use crate::kernels::matmul::kasoku::Int8Acts;
use crate::quant::kasoku::{quantize, Rotation, TensorSpec};
use crate::test_util::Rng;

/// Seconds per call of `f`, the median of 7 rounds of `reps` calls.
fn time(reps: usize, mut f: impl FnMut()) -> f64 {
    let mut rounds: Vec<f64> = (0..7)
        .map(|_| {
            let t = std::time::Instant::now();
            for _ in 0..reps {
                f();
            }
            t.elapsed().as_secs_f64() / reps as f64
        })
        .collect();
    rounds.sort_by(f64::total_cmp);
    rounds[3]
}

/// `cargo test --release -p kasoku --lib fused::bench -- --ignored --nocapture`
#[test]
#[ignore]
fn fused_epilogue_speed() {
    let mut rng = Rng::new(1);
    let (hidden, ffn) = (1536, 8960);
    let rot = Some(Rotation::new(7, 32));
    let make = |rng: &mut Rng, cols: usize| {
        let s = TensorSpec::m(8, cols, 64, rot);
        MatMulWeight::kasoku(quantize(s, &rng.vec(8 * cols, 0.1)).unwrap().view())
    };
    let (wh, wf) = (make(&mut rng, hidden), make(&mut rng, ffn));
    let norm_w = rng.vec(hidden, 1.0);
    for n in [1, 8, 256] {
        let reps = 4096 / n;
        let x = rng.vec(n * hidden, 1.0);
        let (gate, up) = (rng.vec(n * ffn, 1.0), rng.vec(n * ffn, 1.0));
        let mut p = Prepared::default();
        let mut acts = Int8Acts::default();
        let mut normed = vec![0f32; n * hidden];
        let mut prod = vec![0f32; n * ffn];
        let signs_h = wh.kasoku.as_ref().unwrap().signs();
        let signs_f = wf.kasoku.as_ref().unwrap().signs();
        let norm_fused = time(reps, || rmsnorm(&x, &norm_w, 1e-6, &wh, &mut p));
        let norm_unfused = time(reps, || {
            crate::kernels::norm::rmsnorm(&x, &norm_w, 1e-6, &mut normed);
            acts.fill(&normed, n, hidden, signs_h);
        });
        let swiglu_fused = time(reps, || swiglu(&gate, &up, &wf, &mut p));
        let swiglu_unfused = time(reps, || {
            prod.copy_from_slice(&gate);
            swiglu_inplace(&mut prod, &up);
            acts.fill(&prod, n, ffn, signs_f);
        });
        eprintln!(
            "n={n:3}: rmsnorm {hidden}: fused {:.2} µs, unfused {:.2} µs; swiglu {ffn}: fused {:.2} µs, unfused {:.2} µs",
            norm_fused * 1e6,
            norm_unfused * 1e6,
            swiglu_fused * 1e6,
            swiglu_unfused * 1e6
        );
    }
}
