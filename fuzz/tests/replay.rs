//! Every target's seeds and every input the fuzzer ever saved (fuzz/crashes/<target>/) run
//! through the target: none may panic, and each must finish within seconds. A crash found by
//! `tools/fuzz.sh` stays here as a regression test once it is fixed.

use std::time::{Duration, Instant};

use kasoku_fuzz::runner::{crashes_dir, files_in, run_one, seeds};
use kasoku_fuzz::targets::TARGETS;

/// Far above any input's time in this (optimized) test build.
const LIMIT: Duration = Duration::from_secs(10);

#[test]
fn seeds_and_saved_crashes_run_clean() {
    let mut failures = Vec::new();
    let mut ran = 0;
    for target in TARGETS {
        let mut f = (target.make)();
        let saved = files_in(&crashes_dir().join(target.name))
            .into_iter()
            .map(|p| (p.display().to_string(), std::fs::read(&p).unwrap()));
        let inputs: Vec<(String, Vec<u8>)> = seeds(target).into_iter().chain(saved).collect();
        assert!(!inputs.is_empty(), "{}: no seeds", target.name);
        for (name, input) in inputs {
            let start = Instant::now();
            if let Err(what) = run_one(&mut *f, &input) {
                failures.push(format!("{}: {name}: panicked: {what}", target.name));
                f = (target.make)();
            }
            if start.elapsed() > LIMIT {
                failures.push(format!(
                    "{}: {name}: took {:?}",
                    target.name,
                    start.elapsed()
                ));
            }
            ran += 1;
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    eprintln!("{ran} inputs replayed");
}
