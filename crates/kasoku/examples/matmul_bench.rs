//! Measures the legacy-format, K-quant and float matrix products: GB/s of packed weight bytes for
//! Qwen2.5-1.5B-shaped matrices (1536×8960 and 8960×1536) at 1..16 activation rows, plus the
//! worker pool's per-call overhead.
//!
//! `cargo run --release --example matmul_bench [-- THREADS... FORMATS... hot]`, e.g.
//! `-- 1 2 Q4_0 Q8_0 Q4_K` (defaults: 1 and 2 threads; Q4_0, Q4_1, Q8_0). Each thread count runs in
//! a child process. "mem" rotates over enough copies of the matrix to exceed the last-level
//! cache (what decode sees); with `hot`, one matrix that stays in cache is measured too (the
//! kernels' compute ceiling). `-- kernel [FORMATS...]` measures single-thread compute cost per
//! block and activation row on an in-cache matrix, by CPU time (robust to a busy machine).
//! (`MATMUL_BENCH_ROWS` / `MATMUL_BENCH_COLS` change its 512×4096 shape.)
//! `MATMUL_BENCH_CPU=1` times the "mem" products by the calling thread's CPU time instead of
//! wall time (meaningful for 1 thread, or with a spinning pool that has the cores to itself).

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
    match dtype {
        DType::F32 => {
            for e in b.chunks_exact_mut(4) {
                e.copy_from_slice(&((next() % 2000) as f32 / 1000.0 - 1.0).to_le_bytes());
            }
        }
        DType::F16 => {
            for e in b.chunks_exact_mut(2) {
                e.copy_from_slice(
                    &half::f16::from_f32((next() % 2000) as f32 / 1000.0 - 1.0).to_le_bytes(),
                );
            }
        }
        DType::BF16 => {}
        DType::Q4K | DType::Q5K => {
            // d, dmin: small finite scales (the 6-bit sub-block scales stay random).
            let d = half::f16::from_f32(0.01).to_le_bytes();
            for blk in b.chunks_exact_mut(dtype.block_bytes()) {
                blk[0..2].copy_from_slice(&d);
                blk[2..4].copy_from_slice(&d);
            }
        }
        DType::Q6K => {
            let d = half::f16::from_f32(0.01).to_le_bytes();
            for blk in b.chunks_exact_mut(dtype.block_bytes()) {
                blk[208..210].copy_from_slice(&d);
            }
        }
        _ => {
            let d = half::f16::from_f32(0.01).to_le_bytes();
            for blk in b.chunks_exact_mut(dtype.block_bytes()) {
                blk[0..2].copy_from_slice(&d);
                if matches!(dtype, DType::Q4_1 | DType::Q5_1) {
                    blk[2..4].copy_from_slice(&d);
                }
            }
        }
    }
    b
}

/// Seconds per product: each product is timed alone, rotating over `ws`, and the 20th
/// percentile is reported (on a busy machine most samples are slowed by other processes; the
/// fast ones are the undisturbed runs).
fn time(ws: &[MatMulWeight], n: usize) -> f64 {
    let (rows, cols) = (ws[0].rows, ws[0].cols);
    let x: Vec<f32> = (0..n * cols)
        .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
        .collect();
    let mut y = vec![0f32; n * rows];
    let samples = (3 * ws.len()).max(60);
    let cpu_clock = std::env::var_os("MATMUL_BENCH_CPU").is_some();
    let mut t: Vec<f64> = (0..samples)
        .map(|i| {
            let (start, c0) = (
                Instant::now(),
                if cpu_clock { thread_cpu_ns() } else { None },
            );
            matmul(&ws[i % ws.len()], &x, n, &mut y);
            match (c0, thread_cpu_ns()) {
                (Some(a), Some(b)) if cpu_clock => (b - a) as f64 * 1e-9,
                _ => start.elapsed().as_secs_f64(),
            }
        })
        .collect();
    std::hint::black_box(&y);
    t.sort_by(|a, b| a.partial_cmp(b).unwrap());
    t[samples / 5]
}

/// Microseconds per call of an empty `parallel_for` with `tasks` tasks (best of 5 × 2000).
fn pool_overhead(tasks: usize) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..2000 {
            threads::parallel_for(tasks, |i| {
                std::hint::black_box(i);
            });
        }
        best = best.min(t.elapsed().as_secs_f64() / 2000.0 * 1e6);
    }
    best
}

fn run(nthreads: usize, formats: &[DType], hot: bool) {
    threads::set_threads(nthreads);
    println!(
        "\n## {nthreads} thread(s) (pool reports {})",
        threads::num_threads()
    );
    println!(
        "empty parallel_for: {:.2} µs (8 tasks), {:.2} µs (2 tasks)",
        pool_overhead(8),
        pool_overhead(2)
    );
    println!("GB/s of weight bytes, time per product, (time relative to n=1)");
    println!(
        "| matrix | mode | {} |",
        NS.map(|n| format!("n={n}")).join(" | ")
    );
    println!("|---|---|{}", "---|".repeat(NS.len()));
    for &dtype in formats {
        for (rows, cols) in SHAPES {
            let bytes = random_weights(dtype, rows, cols, 0x9e37_79b9);
            let one = MatMulWeight::new(dtype, rows, cols, &bytes).unwrap();
            let copies = ROTATE_BYTES.div_ceil(one.size_bytes());
            let mut ws = vec![one];
            for _ in 1..copies {
                ws.push(MatMulWeight::new(dtype, rows, cols, &bytes).unwrap());
            }
            let modes: &[(&str, &[MatMulWeight])] = if hot {
                &[("mem", &ws[..]), ("hot", &ws[..1])]
            } else {
                &[("mem", &ws[..])]
            };
            for &(mode, set) in modes {
                time(set, 1); // warm up
                let t1 = time(set, 1);
                let cells: Vec<String> = NS
                    .iter()
                    .map(|&n| {
                        let t = if n == 1 { t1 } else { time(set, n) };
                        format!(
                            "{:.1} {:.0}µs ({:.2}x)",
                            set[0].size_bytes() as f64 / t / 1e9,
                            t * 1e6,
                            t / t1
                        )
                    })
                    .collect();
                println!("| {dtype} {rows}x{cols} | {mode} | {} |", cells.join(" | "));
            }
        }
    }
}

/// Nanoseconds of CPU time this thread has run (`CLOCK_THREAD_CPUTIME_ID`), if known.
#[cfg(target_os = "linux")]
fn thread_cpu_ns() -> Option<u64> {
    #[repr(C)]
    struct Timespec {
        sec: i64,
        nsec: i64,
    }
    extern "C" {
        fn clock_gettime(clock: i32, tp: *mut Timespec) -> i32;
    }
    const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
    let mut t = Timespec { sec: 0, nsec: 0 };
    // SAFETY: `t` is a valid timespec for the call to fill.
    let rc = unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut t) };
    (rc == 0).then(|| t.sec as u64 * 1_000_000_000 + t.nsec as u64)
}

#[cfg(not(target_os = "linux"))]
fn thread_cpu_ns() -> Option<u64> {
    None
}

/// Single-thread compute cost: a 512×4096 matrix that stays in L2, timed by this thread's CPU
/// time (robust to other processes on the machine). Prints ns per (8-row block × activation row).
fn kernel_cost(formats: &[DType]) {
    threads::set_threads(1);
    let size = |var: &str, default: usize| {
        std::env::var(var)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let (rows, cols) = (
        size("MATMUL_BENCH_ROWS", 512),
        size("MATMUL_BENCH_COLS", 4096),
    );
    println!("\n## compute: 1 thread, {rows}x{cols} in cache, CPU ns per 8 rows x 32 columns x activation row");
    println!("| format | {} |", NS.map(|n| format!("n={n}")).join(" | "));
    println!("|---|{}", "---|".repeat(NS.len()));
    for &dtype in formats {
        let w =
            MatMulWeight::new(dtype, rows, cols, &random_weights(dtype, rows, cols, 7)).unwrap();
        let cells: Vec<String> = NS
            .iter()
            .map(|&n| {
                let x: Vec<f32> = (0..n * cols)
                    .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
                    .collect();
                let mut y = vec![0f32; n * rows];
                let reps = 2000 / n;
                let mut best = f64::MAX;
                for _ in 0..5 {
                    let (t0, w0) = (thread_cpu_ns(), Instant::now());
                    for _ in 0..reps {
                        matmul(&w, &x, n, &mut y);
                    }
                    let ns = match (t0, thread_cpu_ns()) {
                        (Some(a), Some(b)) => (b - a) as f64,
                        _ => w0.elapsed().as_nanos() as f64,
                    };
                    best = best.min(ns / reps as f64);
                }
                let units = (rows / 8 * cols / 32 * n) as f64;
                format!("{:.2}", best / units)
            })
            .collect();
        println!("| {dtype} | {} |", cells.join(" | "));
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let counts: Vec<usize> = args.iter().filter_map(|a| a.parse().ok()).collect();
    let mut formats: Vec<DType> = args.iter().filter_map(|a| DType::from_name(a)).collect();
    let hot = args.iter().any(|a| a == "hot");
    if args.iter().any(|a| a == "kernel") {
        if formats.is_empty() {
            formats = vec![
                DType::Q4_0,
                DType::Q4_1,
                DType::Q5_0,
                DType::Q5_1,
                DType::Q8_0,
                DType::F16,
                DType::BF16,
                DType::F32,
            ];
        }
        kernel_cost(&formats);
        return;
    }
    if formats.is_empty() {
        formats = vec![DType::Q4_0, DType::Q4_1, DType::Q8_0];
    }
    if let (true, [t]) = (
        std::env::var_os("MATMUL_BENCH_CHILD").is_some(),
        counts.as_slice(),
    ) {
        run(*t, &formats, hot);
        return;
    }
    let list = if counts.is_empty() {
        vec![1, 2]
    } else {
        counts
    };
    let exe = std::env::current_exe().expect("current exe");
    let rest: Vec<&String> = args
        .iter()
        .filter(|a| a.parse::<usize>().is_err())
        .collect();
    for t in list {
        let status = std::process::Command::new(&exe)
            .env("MATMUL_BENCH_CHILD", "1")
            .arg(t.to_string())
            .args(&rest)
            .status()
            .expect("run child");
        assert!(status.success(), "child for {t} threads failed");
    }
}
