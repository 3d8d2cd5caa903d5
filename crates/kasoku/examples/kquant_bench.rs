//! Measures the K-quant matrix products: GB/s of packed weight bytes for Qwen2.5-1.5B-shaped
//! matrices (1536×8960 and 8960×1536) in Q4_K and Q6_K, for 1..16 activation rows.
//!
//! `cargo run --release --example kquant_bench [-- THREADS...]` (default: 1 and 2 threads;
//! each thread count runs in a child process, since the pool is sized once per process).
//! Each cell: GB/s of the fastest of many calls (on a busy machine, a call that was not
//! preempted), its time relative to n = 1, and the GB/s of the median call.
//! "mem" rotates over enough copies of the matrix to exceed the last-level cache (what decode
//! sees); "hot" repeats one matrix that stays in cache (the kernels' compute ceiling).

use std::time::Instant;

use kasoku::kernels::matmul::{matmul, MatMulWeight};
use kasoku::kernels::threads;
use kasoku::quant::DType;

const SHAPES: [(usize, usize); 2] = [(1536, 8960), (8960, 1536)];
const NS: [usize; 5] = [1, 2, 4, 8, 16];
/// Bytes of weights to rotate over in "mem" mode (well above a 32 MiB L3).
const ROTATE_BYTES: usize = 256 << 20;

fn random_weights(dtype: DType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let mut s = seed | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let mut b: Vec<u8> = (0..rows * dtype.bytes_for(cols).unwrap())
        .map(|_| next() as u8)
        .collect();
    let d = half::f16::from_f32(0.01).to_le_bytes();
    for blk in b.chunks_exact_mut(dtype.block_bytes()) {
        let at: &[usize] = if dtype == DType::Q6K { &[208] } else { &[0, 2] };
        for &o in at {
            blk[o..o + 2].copy_from_slice(&d);
        }
    }
    b
}

/// Seconds per product: the fastest single call among many over `ws` (in rotation), and the
/// median. On a busy machine the minimum is the call that ran without being preempted.
fn time(ws: &[MatMulWeight], n: usize) -> (f64, f64) {
    let (rows, cols) = (ws[0].rows, ws[0].cols);
    let x: Vec<f32> = (0..n * cols)
        .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
        .collect();
    let mut y = vec![0f32; n * rows];
    let mut times = Vec::new();
    let start = Instant::now();
    while times.len() < 40 || (times.len() < 400 && start.elapsed().as_secs_f64() < 1.5) {
        for w in ws {
            let t = Instant::now();
            matmul(w, &x, n, &mut y);
            times.push(t.elapsed().as_secs_f64());
        }
    }
    std::hint::black_box(&y);
    times.sort_by(f64::total_cmp);
    (times[0], times[times.len() / 2])
}

fn run(nthreads: usize) {
    threads::set_threads(nthreads);
    println!(
        "\n## {nthreads} thread(s): GB/s of weight bytes, fastest call (its time / n=1's), median"
    );
    println!(
        "| matrix | mode | {} |",
        NS.map(|n| format!("n={n}")).join(" | ")
    );
    println!("|---|---|{}", "---|".repeat(NS.len()));
    for dtype in [DType::Q4K, DType::Q6K] {
        for (rows, cols) in SHAPES {
            let bytes = random_weights(dtype, rows, cols, 0x9e37_79b9);
            let one = MatMulWeight::new(dtype, rows, cols, &bytes).unwrap();
            let copies = ROTATE_BYTES.div_ceil(one.size_bytes());
            let mut ws = vec![one];
            for _ in 1..copies {
                ws.push(MatMulWeight::new(dtype, rows, cols, &bytes).unwrap());
            }
            for (mode, set) in [("mem", &ws[..]), ("hot", &ws[..1])] {
                let t1 = time(set, 1).0;
                let gbs = |t: f64| set[0].size_bytes() as f64 / t / 1e9;
                let cells: Vec<String> = NS
                    .iter()
                    .map(|&n| {
                        let (t, med) = time(set, n);
                        format!("{:.1} ({:.2}x) med {:.1}", gbs(t), t / t1, gbs(med))
                    })
                    .collect();
                println!("| {dtype} {rows}x{cols} | {mode} | {} |", cells.join(" | "));
            }
        }
    }
}

/// `prof DTYPE ROWS COLS N ITERS`: one thread, one hot matrix, a fixed number of products
/// (for `perf stat`, which counts cycles even on a busy machine).
fn prof(args: &[String]) {
    threads::set_threads(1);
    let dtype = match args[0].as_str() {
        "Q4K" => DType::Q4K,
        "Q5K" => DType::Q5K,
        _ => DType::Q6K,
    };
    let p: Vec<usize> = args[1..5]
        .iter()
        .map(|a| a.parse().expect("number"))
        .collect();
    let (rows, cols, n, iters) = (p[0], p[1], p[2], p[3]);
    let w = MatMulWeight::new(dtype, rows, cols, &random_weights(dtype, rows, cols, 1)).unwrap();
    let x: Vec<f32> = (0..n * cols)
        .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
        .collect();
    let mut y = vec![0f32; n * rows];
    for _ in 0..iters {
        matmul(&w, &x, n, &mut y);
    }
    std::hint::black_box(&y);
}

fn main() {
    let raw: Vec<String> = std::env::args().skip(1).collect();
    if raw.first().map(String::as_str) == Some("prof") {
        return prof(&raw[1..]);
    }
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    match args.as_slice() {
        [t] => run(*t),
        [] | [_, _, ..] => {
            let list = if args.is_empty() { vec![1, 2] } else { args };
            let exe = std::env::current_exe().expect("current exe");
            for t in list {
                let status = std::process::Command::new(&exe)
                    .arg(t.to_string())
                    .status()
                    .expect("run child");
                assert!(status.success(), "child for {t} threads failed");
            }
        }
    }
}
