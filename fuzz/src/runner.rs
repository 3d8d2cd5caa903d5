//! Runs a target over mutants of its seeds for a stated time: every input on a worker thread
//! under `catch_unwind`, with a per-input time limit (a hang is an input still running when the
//! limit passes). Panics are grouped by where they happened; the first input of each group is
//! saved under `fuzz/crashes/<target>/`, where the replay test (tests/replay.rs) runs it from
//! then on, as a regression test, together with every seed.

use std::cell::RefCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::mutate::{mutate, Rng};
use crate::targets::{repo_root, Target, JSON_WORDS};

/// How long one run goes.
#[derive(Clone, Debug)]
pub struct Options {
    /// Seconds of fuzzing per target.
    pub seconds: f64,
    /// An input running longer than this is a hang.
    pub time_limit: Duration,
    /// The mutation generator's seed.
    pub seed: u64,
    /// Where crashing inputs go (`<dir>/<target>/`).
    pub crashes: PathBuf,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            seconds: 60.0,
            time_limit: Duration::from_secs(5),
            seed: 1,
            crashes: crashes_dir(),
        }
    }
}

/// Something a target must never do.
#[derive(Clone, Debug)]
pub struct Finding {
    /// `panic` or `hang`.
    pub kind: &'static str,
    /// Where it panicked and the message (or the time limit, for a hang).
    pub what: String,
    /// How many inputs hit it.
    pub count: u64,
    /// The first input that did, as saved.
    pub saved: PathBuf,
}

/// One target's run.
#[derive(Clone, Debug)]
pub struct Report {
    pub target: &'static str,
    pub seeds: usize,
    pub executions: u64,
    pub seconds: f64,
    pub findings: Vec<Finding>,
    /// A hang stopped the run early (its thread is still running).
    pub hung: bool,
}

impl Report {
    pub fn per_second(&self) -> f64 {
        self.executions as f64 / self.seconds.max(1e-9)
    }
}

/// `fuzz/corpus`.
pub fn corpus_dir() -> PathBuf {
    repo_root().join("fuzz/corpus")
}

/// `fuzz/crashes`.
pub fn crashes_dir() -> PathBuf {
    repo_root().join("fuzz/crashes")
}

/// The files of a directory (none if it does not exist), sorted by name.
pub fn files_in(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.is_file())
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files
}

/// A target's seeds, each with where it came from: its fixtures, seeds derived from fixtures,
/// and `fuzz/corpus/<target>/*`.
pub fn seeds(target: &Target) -> Vec<(String, Vec<u8>)> {
    let root = repo_root();
    let fixtures = target.fixture_seeds.iter().map(|rel| root.join(rel));
    let read = |p: PathBuf| {
        let bytes = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        (p.display().to_string(), bytes)
    };
    let derived = (target.derived_seeds)()
        .into_iter()
        .enumerate()
        .map(|(i, bytes)| (format!("{} derived seed {i}", target.name), bytes));
    fixtures
        .map(read)
        .chain(derived)
        .chain(
            files_in(&corpus_dir().join(target.name))
                .into_iter()
                .map(read),
        )
        .collect()
}

thread_local! {
    /// Where and why the last panic on this thread happened (set by the quiet hook).
    static LAST_PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Replaces the panic hook with one that records the panic for the runner instead of printing
/// it (the fuzzer's own process only: the hook is process-wide).
pub fn quiet_panics() {
    std::panic::set_hook(Box::new(|info| {
        let message = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_default();
        let at = info
            .location()
            .map(|l| format!("{}:{}", l.file(), l.line()))
            .unwrap_or_default();
        LAST_PANIC.with(|p| *p.borrow_mut() = Some(format!("{at}: {message}")));
    }));
}

/// Runs `f` on `input`: `Err` with where and why if it panicked.
pub fn run_one(f: &mut dyn FnMut(&[u8]), input: &[u8]) -> Result<(), String> {
    LAST_PANIC.with(|p| p.borrow_mut().take());
    catch_unwind(AssertUnwindSafe(|| f(input))).map_err(|payload| {
        LAST_PANIC
            .with(|p| p.borrow_mut().take())
            .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".into())
    })
}

/// A short stable name for an input (FNV-1a, hex).
fn digest(data: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in data {
        h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
    }
    format!("{h:016x}")
}

/// Saves a finding's input; returns its path.
fn save(dir: &Path, kind: &str, data: &[u8]) -> PathBuf {
    let _ = std::fs::create_dir_all(dir);
    let path = dir.join(format!("{kind}-{}", digest(data)));
    let _ = std::fs::write(&path, data);
    path
}

/// Where a panic happened, without its message (inputs hitting one spot are one finding).
fn place(what: &str) -> &str {
    what.split(": ").next().unwrap_or(what)
}

/// Fuzzes `target` for `options.seconds`.
pub fn fuzz(target: &'static Target, options: &Options) -> Report {
    let seeds = seeds(target);
    let corpus: Vec<Vec<u8>> = seeds.into_iter().map(|(_, b)| b).collect();
    let mut report = Report {
        target: target.name,
        seeds: corpus.len(),
        executions: 0,
        seconds: 0.0,
        findings: Vec::new(),
        hung: false,
    };
    let (to_worker, inputs) = mpsc::channel::<Vec<u8>>();
    let (to_runner, outcomes) = mpsc::channel::<Result<(), String>>();
    std::thread::Builder::new()
        .name(format!("fuzz-{}", target.name))
        .spawn(move || {
            let mut f = (target.make)();
            for input in inputs {
                let outcome = run_one(&mut *f, &input);
                if outcome.is_err() {
                    // The target may be left broken by the panic: build it afresh.
                    f = (target.make)();
                }
                if to_runner.send(outcome).is_err() {
                    return;
                }
            }
        })
        .expect("worker thread");
    let dir = options.crashes.join(target.name);
    let mut rng = Rng::new(options.seed ^ digest(target.name.as_bytes()).len() as u64);
    // JSON formats (their words are quoted) share the JSON words.
    let mut words: Vec<&str> = target.dictionary.to_vec();
    if target.dictionary.iter().any(|w| w.starts_with('"')) {
        words.extend(JSON_WORDS);
    }
    let others: Vec<&[u8]> = corpus.iter().map(Vec::as_slice).collect();
    let start = Instant::now();
    let deadline = Duration::from_secs_f64(options.seconds);
    let mut next = 0usize;
    while start.elapsed() < deadline {
        // The seeds themselves first, then mutants.
        let input = if next < corpus.len() {
            corpus[next].clone()
        } else {
            let seed = &corpus[rng.below(corpus.len())];
            mutate(seed, &others, &words, &mut rng)
        };
        next += 1;
        if to_worker.send(input.clone()).is_err() {
            break;
        }
        report.executions += 1;
        match outcomes.recv_timeout(options.time_limit) {
            Ok(Ok(())) => {}
            Ok(Err(what)) => {
                match report
                    .findings
                    .iter_mut()
                    .find(|f| f.kind == "panic" && place(&f.what) == place(&what))
                {
                    Some(f) => f.count += 1,
                    None => report.findings.push(Finding {
                        kind: "panic",
                        saved: save(&dir, "panic", &input),
                        what,
                        count: 1,
                    }),
                }
            }
            Err(_) => {
                report.findings.push(Finding {
                    kind: "hang",
                    what: format!("still running after {:?}", options.time_limit),
                    count: 1,
                    saved: save(&dir, "hang", &input),
                });
                report.hung = true;
                break;
            }
        }
    }
    report.seconds = start.elapsed().as_secs_f64();
    report
}
