//! The host sampler's cost per draw on a vocabulary-sized row (Qwen's 151,936 logits, roughly
//! normal with a few strong candidates, as a language model's are), for the parameter sets a
//! GPU session samples with: `cargo run --release -p kasoku --example sampler_cost`.

use std::time::Instant;

use kasoku::sampler::{sample, SamplingParams};

fn main() {
    let vocab = 151_936;
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    let mut unit = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x >> 11) as f64 / (1u64 << 53) as f64
    };
    let rows: Vec<Vec<f32>> = (0..8)
        .map(|_| {
            let mut row: Vec<f32> = (0..vocab)
                .map(|_| {
                    // Box-Muller: a normal logit of deviation 2.5.
                    let (a, b) = (unit().max(1e-12), unit());
                    ((-2.0 * a.ln()).sqrt() * (std::f64::consts::TAU * b).cos() * 2.5) as f32
                })
                .collect();
            for k in 0..20 {
                let i = (unit() * vocab as f64) as usize;
                row[i] = 16.0 - k as f32 * 0.4;
            }
            row
        })
        .collect();
    let history: Vec<u32> = (0..200).map(|i| (i * 7919) % vocab as u32).collect();
    let base = SamplingParams {
        temperature: 0.8,
        seed: 3,
        ..Default::default()
    };
    let sets = [
        (
            "top-k 40, top-p 0.95, rep 1.05",
            SamplingParams {
                top_k: 40,
                top_p: 0.95,
                repetition_penalty: 1.05,
                ..base.clone()
            },
        ),
        (
            "top-k off, top-p 0.9",
            SamplingParams {
                top_p: 0.9,
                ..base.clone()
            },
        ),
        (
            "top-k off, min-p 0.05",
            SamplingParams {
                min_p: 0.05,
                ..base.clone()
            },
        ),
        ("top-k off, temperature only", base.clone()),
    ];
    let only = std::env::args().nth(1);
    for (what, params) in sets {
        if only.as_deref().is_some_and(|o| !what.contains(o)) {
            continue;
        }
        let draws = 200;
        let t = Instant::now();
        let mut check = 0u64;
        for d in 0..draws {
            check += sample(&params, &rows[d % rows.len()], &history, 1000 + d) as u64;
        }
        let us = t.elapsed().as_secs_f64() * 1e6 / draws as f64;
        println!("{what:32} {us:8.0} µs per draw (checksum {check})");
    }
}
