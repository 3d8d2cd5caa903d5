//! Measures kasoku's formats M and L against the GGUF formats they replace (Q4_K, Q8_0; Q6_K
//! for reference) on Qwen2.5-Coder-1.5B's matrix shapes, at 1..16 activation rows and 1 and 2
//! threads. Configurations are interleaved round by round (format A, B, C, … then again), so
//! that the memory bandwidth, which drifts by 2× within minutes on this machine, hits them
//! all alike; each cell is the median over rounds of a round's median product time.
//!
//! `cargo run --release -p kasoku --example kasoku_bench [-- OPTIONS]`:
//! - `threads=1,2`, `rows=1,2,4,8,16`, `rounds=9`, `formats=Q4_K,M64,Q8_0,L32,LROW`
//!   (also M32, M128, Q6_K, Q4_0), `shapes=down,gate` (`down` = 1536×8960, `gate` = 8960×1536,
//!   `qkv` = 2048×1536, `o` = 1536×1536, `head` = 151936×1536);
//! - `kernel` (`kshape=512x4096`): single-thread compute cost instead, on an in-cache matrix, by thread
//!   CPU time (robust to a busy machine): ns per (8 weight rows × 64 columns × activation row).
//!
//! Weights stream from memory: each configuration rotates over enough copies of its matrix
//! to exceed 256 MiB (well above the last-level cache), as decoding sees them.

use std::time::Instant;

use kasoku::kernels::matmul::kasoku::{self as kq, KasokuMatrix};
use kasoku::kernels::matmul::{matmul, MatMulWeight};
use kasoku::kernels::threads;
use kasoku::quant::kasoku::{quantize, Rotation, TensorSpec};
use kasoku::quant::DType;

const ROTATE_BYTES: usize = 256 << 20;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Fmt {
    Gguf(DType),
    M(usize),
    L32,
    LRow,
}

impl Fmt {
    fn parse(s: &str) -> Option<Fmt> {
        Some(match s.to_ascii_uppercase().as_str() {
            "M32" => Fmt::M(32),
            "M64" | "M" => Fmt::M(64),
            "M128" => Fmt::M(128),
            "L32" | "L" => Fmt::L32,
            "LROW" => Fmt::LRow,
            other => Fmt::Gguf(DType::from_name(other)?),
        })
    }

    fn name(self) -> String {
        match self {
            Fmt::Gguf(d) => d.name().to_string(),
            Fmt::M(g) => format!("M{g}"),
            Fmt::L32 => "L32".into(),
            Fmt::LRow => "Lrow".into(),
        }
    }
}

enum Weight {
    Gguf(MatMulWeight),
    Kasoku(KasokuMatrix),
}

impl Weight {
    fn bytes(&self) -> usize {
        match self {
            Weight::Gguf(w) => w.size_bytes(),
            Weight::Kasoku(w) => w.size_bytes(),
        }
    }

    fn rows(&self) -> usize {
        match self {
            Weight::Gguf(w) => w.rows,
            Weight::Kasoku(w) => w.rows(),
        }
    }

    fn product(&self, x: &[f32], n: usize, y: &mut [f32]) {
        match self {
            Weight::Gguf(w) => matmul(w, x, n, y),
            Weight::Kasoku(w) => kq::matmul(w, x, n, y),
        }
    }
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn f32(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

/// Random GGUF-format rows with small finite scales.
fn gguf_bytes(dtype: DType, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    let mut b: Vec<u8> = (0..rows * dtype.bytes_for(cols).unwrap())
        .map(|_| rng.next() as u8)
        .collect();
    let d = half::f16::from_f32(0.01).to_le_bytes();
    let at: &[usize] = match dtype {
        DType::Q6K => &[208],
        DType::Q4K | DType::Q5K | DType::Q4_1 | DType::Q5_1 => &[0, 2],
        _ => &[0],
    };
    for blk in b.chunks_exact_mut(dtype.block_bytes()) {
        for &o in at {
            blk[o..o + 2].copy_from_slice(&d);
        }
    }
    b
}

/// `copies` packed copies of one random matrix of format `f`.
fn make(f: Fmt, rows: usize, cols: usize, min_bytes: usize) -> Vec<Weight> {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let one = |rng: &mut Rng| -> Box<dyn Fn() -> Weight> {
        match f {
            Fmt::Gguf(d) => {
                let bytes = gguf_bytes(d, rows, cols, rng);
                Box::new(move || Weight::Gguf(MatMulWeight::new(d, rows, cols, &bytes).unwrap()))
            }
            _ => {
                let values: Vec<f32> = (0..rows * cols).map(|_| rng.f32() * 0.05).collect();
                let rot = Some(Rotation::new(7, 32));
                let spec = match f {
                    Fmt::M(g) => TensorSpec::m(rows, cols, g, rot),
                    Fmt::L32 => TensorSpec::l(rows, cols, false, rot),
                    _ => TensorSpec::l(rows, cols, true, rot),
                };
                let q = quantize(spec, &values).unwrap();
                Box::new(move || Weight::Kasoku(KasokuMatrix::new(q.view())))
            }
        }
    };
    let build = one(&mut rng);
    let first = build();
    let copies = min_bytes.div_ceil(first.bytes()).max(1);
    let mut v = vec![first];
    for _ in 1..copies {
        v.push(build());
    }
    v
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn shape(name: &str) -> (usize, usize) {
    match name {
        "down" => (1536, 8960),
        "gate" => (8960, 1536),
        "qkv" => (2048, 1536),
        "o" => (1536, 1536),
        "head" => (151936, 1536),
        other => panic!("unknown shape {other}"),
    }
}

fn list<T>(args: &[String], key: &str, default: &str, f: impl Fn(&str) -> T) -> Vec<T> {
    let v = args
        .iter()
        .find_map(|a| a.strip_prefix(&format!("{key}=")))
        .unwrap_or(default);
    v.split(',').filter(|s| !s.is_empty()).map(f).collect()
}

/// Thread CPU time in ns (Linux), for the compute mode.
fn thread_cpu_ns() -> u64 {
    #[repr(C)]
    struct Timespec {
        sec: i64,
        nsec: i64,
    }
    extern "C" {
        fn clock_gettime(clock: i32, tp: *mut Timespec) -> i32;
    }
    let mut t = Timespec { sec: 0, nsec: 0 };
    // SAFETY: `t` is a valid timespec for the call to fill (3 = CLOCK_THREAD_CPUTIME_ID).
    unsafe { clock_gettime(3, &mut t) };
    t.sec as u64 * 1_000_000_000 + t.nsec as u64
}

fn kernel_cost(formats: &[Fmt], ns: &[usize], (rows, cols): (usize, usize)) {
    threads::set_threads(1);
    println!("## compute: 1 thread, {rows}x{cols} in cache, CPU ns per 8 rows x 64 columns x activation row");
    println!(
        "| format | {} |",
        ns.iter()
            .map(|n| format!("n={n}"))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    println!("|---|{}", "---|".repeat(ns.len()));
    for &f in formats {
        let w = make(f, rows, cols, 0).remove(0);
        let cells: Vec<String> = ns
            .iter()
            .map(|&n| {
                let x: Vec<f32> = (0..n * cols)
                    .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
                    .collect();
                let mut y = vec![0f32; n * rows];
                let reps = (400 / n).max(10);
                let mut best = f64::MAX;
                for _ in 0..5 {
                    let t0 = thread_cpu_ns();
                    for _ in 0..reps {
                        w.product(&x, n, &mut y);
                    }
                    best = best.min((thread_cpu_ns() - t0) as f64 / reps as f64);
                }
                format!("{:.2}", best / (rows / 8 * cols / 64 * n) as f64)
            })
            .collect();
        println!("| {} | {} |", f.name(), cells.join(" | "));
    }
    // The activation transform alone (rotation + int8), per row of `cols` values.
    let signs = Rotation::new(7, 32).signs(cols);
    let cells: Vec<String> = ns
        .iter()
        .map(|&n| {
            let x: Vec<f32> = (0..n * cols)
                .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
                .collect();
            let reps = (400 / n).max(10);
            let mut best = f64::MAX;
            for _ in 0..5 {
                let t0 = thread_cpu_ns();
                for _ in 0..reps {
                    std::hint::black_box(kq::Int8Acts::new(&x, n, cols, Some(&signs)));
                }
                best = best.min((thread_cpu_ns() - t0) as f64 / reps as f64);
            }
            format!("{:.2}", best / (rows / 8 * cols / 64 * n) as f64)
        })
        .collect();
    println!("| (activations only) | {} |", cells.join(" | "));
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let formats = list(&args, "formats", "Q4_K,M64,Q8_0,L32,LROW", |s| {
        Fmt::parse(s).unwrap_or_else(|| panic!("unknown format {s}"))
    });
    let ns = list(&args, "rows", "1,2,4,8,16", |s| {
        s.parse::<usize>().expect("rows")
    });
    if args.iter().any(|a| a == "kernel") {
        let dims = list(&args, "kshape", "512x4096", |s| {
            let (r, c) = s.split_once('x').expect("kshape=ROWSxCOLS");
            (r.parse().expect("rows"), c.parse().expect("cols"))
        })[0];
        kernel_cost(&formats, &ns, dims);
        return;
    }
    let thread_counts = list(&args, "threads", "1,2", |s| {
        s.parse::<usize>().expect("threads")
    });
    let rounds = list(&args, "rounds", "9", |s| {
        s.parse::<usize>().expect("rounds")
    })[0];
    let shapes = list(&args, "shapes", "down,gate", |s| s.to_string());
    println!(
        "kasoku_bench: {} rounds, formats {}, interleaved per round",
        rounds,
        formats
            .iter()
            .map(|f| f.name())
            .collect::<Vec<_>>()
            .join(" ")
    );
    for sh in &shapes {
        let (rows, cols) = shape(sh);
        let sets: Vec<Vec<Weight>> = formats
            .iter()
            .map(|&f| make(f, rows, cols, ROTATE_BYTES))
            .collect();
        for &t in &thread_counts {
            threads::set_threads(t);
            println!("\n### {sh} {rows}x{cols}, {t} thread(s): GB/s of packed weights, µs per product (time ÷ that format's n=1 time)");
            println!(
                "| format | bits/w | {} |",
                ns.iter()
                    .map(|n| format!("n={n}"))
                    .collect::<Vec<_>>()
                    .join(" | ")
            );
            println!("|---|---|{}", "---|".repeat(ns.len()));
            // times[format][n] = per-round medians
            let mut times = vec![vec![Vec::new(); ns.len()]; formats.len()];
            let xs: Vec<Vec<f32>> = ns
                .iter()
                .map(|&n| {
                    (0..n * cols)
                        .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
                        .collect()
                })
                .collect();
            let mut ys: Vec<Vec<f32>> = ns.iter().map(|&n| vec![0f32; n * rows]).collect();
            for round in 0..=rounds {
                for fi in 0..formats.len() {
                    let fi = (fi + round) % formats.len();
                    let set = &sets[fi];
                    for (ni, &n) in ns.iter().enumerate() {
                        let samples = set.len().clamp(8, 40);
                        let mut ts: Vec<f64> = (0..samples)
                            .map(|i| {
                                let start = Instant::now();
                                set[i % set.len()].product(&xs[ni], n, &mut ys[ni]);
                                start.elapsed().as_secs_f64()
                            })
                            .collect();
                        if round > 0 {
                            // round 0 warms up
                            times[fi][ni].push(median(&mut ts));
                        }
                    }
                }
            }
            for (fi, f) in formats.iter().enumerate() {
                let w = &sets[fi][0];
                let bpw = w.bytes() as f64 * 8.0 / (w.rows().div_ceil(8) * 8 * cols) as f64;
                let t1 = median(&mut times[fi][0].clone());
                let cells: Vec<String> = (0..ns.len())
                    .map(|ni| {
                        let t = median(&mut times[fi][ni].clone());
                        format!(
                            "{:.1} {:.0}µs ({:.2}x)",
                            w.bytes() as f64 / t / 1e9,
                            t * 1e6,
                            t / t1
                        )
                    })
                    .collect();
                println!("| {} | {bpw:.3} | {} |", f.name(), cells.join(" | "));
            }
        }
    }
    std::hint::black_box(());
}
