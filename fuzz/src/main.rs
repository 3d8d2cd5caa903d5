//! `kasoku-fuzz [SECONDS_PER_TARGET] [--target NAME]... [--time-limit-ms N] [--seed N]`:
//! fuzzes each target (all by default) for the stated time and prints, per target, the
//! executions, executions per second and findings (each saved under fuzz/crashes/<target>/).
//! Exits 1 when anything was found.

use std::time::Duration;

use kasoku_fuzz::runner::{self, Options};
use kasoku_fuzz::targets::{self, TARGETS};

fn main() {
    let mut options = Options::default();
    let mut names: Vec<String> = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = |what: &str| {
            args.next()
                .unwrap_or_else(|| fail(&format!("{arg} needs {what}")))
        };
        match arg.as_str() {
            "--target" => names.push(value("a name")),
            "--time-limit-ms" => {
                let ms = value("milliseconds")
                    .parse()
                    .unwrap_or_else(|_| fail("bad --time-limit-ms"));
                options.time_limit = Duration::from_millis(ms);
            }
            "--seed" => {
                options.seed = value("a number")
                    .parse()
                    .unwrap_or_else(|_| fail("bad --seed"))
            }
            "-h" | "--help" => {
                println!("kasoku-fuzz [SECONDS_PER_TARGET] [--target NAME]... [--time-limit-ms N] [--seed N]");
                println!(
                    "targets: {}",
                    TARGETS
                        .iter()
                        .map(|t| t.name)
                        .collect::<Vec<_>>()
                        .join(", ")
                );
                return;
            }
            seconds => {
                options.seconds = seconds
                    .parse()
                    .unwrap_or_else(|_| fail(&format!("unknown argument {seconds}")))
            }
        }
    }
    let chosen: Vec<_> = if names.is_empty() {
        TARGETS.iter().collect()
    } else {
        names
            .iter()
            .map(|n| targets::target(n).unwrap_or_else(|| fail(&format!("no target {n}"))))
            .collect()
    };
    // One worker thread in all: the model targets' forward passes would otherwise take every
    // core of the pool.
    kasoku::kernels::threads::set_threads(1);
    runner::quiet_panics();
    let mut found = 0;
    let mut hung = false;
    println!(
        "{:<15} {:>6} {:>12} {:>10} {:>8}  findings",
        "target", "seeds", "executions", "exec/s", "seconds"
    );
    for target in chosen {
        let report = runner::fuzz(target, &options);
        println!(
            "{:<15} {:>6} {:>12} {:>10.0} {:>8.1}  {}",
            report.target,
            report.seeds,
            report.executions,
            report.per_second(),
            report.seconds,
            report.findings.len()
        );
        for f in &report.findings {
            println!(
                "  {} x{}: {}\n    saved: {}",
                f.kind,
                f.count,
                f.what,
                f.saved.display()
            );
        }
        found += report.findings.len();
        hung |= report.hung;
        if hung {
            // The hung input's thread cannot be stopped; the other targets would share a core
            // with it.
            println!("stopping: a hang leaves its thread running");
            break;
        }
    }
    std::process::exit(i32::from(found > 0));
}

fn fail(message: &str) -> ! {
    eprintln!("kasoku-fuzz: {message}");
    std::process::exit(2)
}
