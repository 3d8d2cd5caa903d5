//! Times every matrix product of a real model in forward order (the weights stream from
//! memory as in a forward pass) at several activation row counts: the total per pass and the
//! GB/s of each matrix role and format. It isolates the matrix products of the verify curve
//! (`kasoku bench --verify`) from attention, norms and sampling.
//!
//! `cargo run --release -p kasoku --example model_matmuls -- MODEL.gguf [ROWS] [REPS]`,
//! e.g. `-- qwen2.5-coder-1.5b-instruct-q4_k_m.gguf 1,2,4,8 8` (the defaults).

use std::collections::BTreeMap;
use std::time::Instant;

use kasoku::kernels::matmul::{matmul, MatMulWeight};
use kasoku::model::Model;

fn main() {
    let mut args = std::env::args().skip(1);
    let path = args
        .next()
        .expect("usage: model_matmuls MODEL [ROWS] [REPS]");
    let rows: Vec<usize> = args
        .next()
        .unwrap_or_else(|| "1,2,4,8".into())
        .split(',')
        .map(|s| s.parse().expect("ROWS: comma-separated counts"))
        .collect();
    let reps: usize = args.next().map_or(8, |s| s.parse().expect("REPS: a count"));
    let model = Model::load(&path).expect("model");
    // Each matrix's role: its GGUF name without the block number (`attn_qkv.weight`, ...).
    let mats: Vec<(String, &MatMulWeight)> = model
        .matrices()
        .into_iter()
        .map(|(name, w)| {
            let role = name
                .splitn(3, '.')
                .nth(2)
                .map_or(name.clone(), str::to_string);
            let role = if name.starts_with("blk.") { role } else { name };
            (role, w)
        })
        .collect();
    for &n in &rows {
        let xs: Vec<Vec<f32>> = mats
            .iter()
            .map(|(_, w)| {
                (0..n * w.cols)
                    .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
                    .collect()
            })
            .collect();
        let mut ys: Vec<Vec<f32>> = mats.iter().map(|(_, w)| vec![0f32; n * w.rows]).collect();
        let mut totals = Vec::with_capacity(reps);
        let mut by_kind: BTreeMap<String, (f64, usize)> = BTreeMap::new();
        // One untimed pass first (buffers, page faults).
        for rep in 0..=reps {
            let start = Instant::now();
            for (k, (role, w)) in mats.iter().enumerate() {
                let t = Instant::now();
                matmul(w, &xs[k], n, &mut ys[k]);
                if rep > 0 {
                    let e = by_kind.entry(format!("{role} {}", w.format())).or_default();
                    e.0 += t.elapsed().as_secs_f64();
                    e.1 += w.size_bytes();
                }
            }
            if rep > 0 {
                totals.push(start.elapsed().as_secs_f64() * 1e3);
            }
        }
        totals.sort_by(f64::total_cmp);
        print!(
            "n={n}: median {:.2} ms (min {:.2}) |",
            totals[totals.len() / 2],
            totals[0]
        );
        for (kind, (secs, bytes)) in &by_kind {
            print!(" {kind} {:.1} GB/s |", *bytes as f64 / secs / 1e9);
        }
        println!();
    }
}
