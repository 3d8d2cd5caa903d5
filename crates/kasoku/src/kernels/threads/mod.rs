//! The worker pool every multi-threaded kernel runs on, sized by `set_threads`.
//!
//! A persistent pool built for many short parallel loops (a decode step runs a few hundred):
//! the calling thread publishes a job and works on it too; workers take task indices from an
//! atomic counter, so there is no barrier beyond waiting for the tasks that were taken. Idle
//! workers spin for a while (a new job is seen within nanoseconds) and then park until woken,
//! so an idle process does not burn CPU.
//!
//! Only one job runs at a time: a `parallel_for` called while another is in flight (from
//! another thread, or nested inside a task) runs its tasks serially on the calling thread.
//!
//! Each thread taking part in a job (the caller, and every worker that entered) has a *slot*
//! number, `0` for the caller and `1 + i` for worker `i`, and runs its tasks one after the
//! other: so tasks with the same slot never run at the same time, and per-slot memory
//! ([`parts::Work`]) serves every task without locks. [`parts`] builds the safe ways for tasks
//! to write disjoint parts of one output on top of this.
//!
//! Protocol. `state` packs an epoch (bits 33..), a "closed" bit (32) and the number of workers
//! inside the current job (bits 0..32). A worker enters only by incrementing the count while
//! the epoch is the one it woke for and the job is open, and only then reads the job; the
//! caller, after its own share of tasks, closes the job and waits for the count to drop to
//! zero before returning (and before the job's closure goes out of scope).

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long an idle worker spins before parking.
const SPIN: Duration = Duration::from_micros(300);

const CLOSED: u64 = 1 << 32;
const COUNT_MASK: u64 = CLOSED - 1;
const EPOCH_SHIFT: u32 = 33;

pub(crate) mod parts;

pub(crate) use parts::{for_each, for_each_disjoint, Blocks, Work};

/// A job's task function: `(task, slot)`.
type TaskFn = dyn Fn(usize, usize) + Sync;

/// A type-erased `&TaskFn` whose lifetime the protocol guarantees.
#[derive(Clone, Copy)]
struct JobRef {
    f: *const TaskFn,
    tasks: usize,
}

struct Pool {
    /// Threads the next job may use (caller included).
    threads: AtomicUsize,
    /// Workers started so far (each has an index `0..spawned`).
    spawned: Mutex<usize>,
    /// Workers whose thread is running (its start-up, which allocates, is over).
    running: AtomicUsize,
    /// Set while a job is being published or run.
    busy: AtomicBool,
    /// Workers (by index) allowed into the current job.
    allowed: AtomicUsize,
    state: AtomicU64,
    job: Mutex<Option<JobRef>>,
    next: Padded<AtomicUsize>,
    panicked: AtomicBool,
    /// Workers parked (or about to park) on `wake`.
    sleepers: AtomicUsize,
    sleep_lock: Mutex<()>,
    wake: Condvar,
}

// SAFETY: the raw closure pointer in `job` is only dereferenced under the protocol above, while
// the caller that owns the closure waits; the closure is `Sync`.
unsafe impl Send for JobRef {}

#[repr(align(128))]
struct Padded<T>(T);

static POOL: OnceLock<Pool> = OnceLock::new();

fn pool() -> &'static Pool {
    POOL.get_or_init(|| {
        let n = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        Pool {
            threads: AtomicUsize::new(n),
            spawned: Mutex::new(0),
            running: AtomicUsize::new(0),
            busy: AtomicBool::new(false),
            allowed: AtomicUsize::new(0),
            state: AtomicU64::new(0),
            job: Mutex::new(None),
            next: Padded(AtomicUsize::new(0)),
            panicked: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            sleep_lock: Mutex::new(()),
            wake: Condvar::new(),
        }
    })
}

/// Sets the number of compute threads (at least 1). Takes effect for the next parallel loop.
pub fn set_threads(n: usize) {
    pool().threads.store(n.max(1), Ordering::SeqCst);
}

/// The number of compute threads.
pub fn num_threads() -> usize {
    pool().threads.load(Ordering::SeqCst)
}

/// Runs `f(task)` for every task in `0..tasks`, spread over the pool; returns when all are done.
/// Every task runs exactly once. A panic in a task is re-raised here after every other task has
/// finished.
pub fn parallel_for(tasks: usize, f: impl Fn(usize) + Sync + Send) {
    parallel_for_slots(tasks, usize::MAX, |t, _| f(t));
}

/// [`parallel_for`] on at most `slots` threads (at least 1), telling each task the slot of the
/// thread that runs it: `f(task, slot)` with `slot < slots`. Tasks with the same slot never
/// run at the same time.
pub(crate) fn parallel_for_slots(tasks: usize, slots: usize, f: impl Fn(usize, usize) + Sync) {
    let p = pool();
    let all = p.threads.load(Ordering::Relaxed);
    let threads = all.min(slots);
    if tasks <= 1
        || threads <= 1
        || p.busy
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
    {
        (0..tasks).for_each(|t| f(t, 0));
        return;
    }
    // Every worker the pool may use, so that a later job with more tasks does not spawn one
    // (and allocate) after the first.
    p.ensure_workers(all - 1);
    let f_ref: &(dyn Fn(usize, usize) + Sync) = &f;
    // SAFETY: erases the closure's lifetime; `run` does not return before every worker that
    // entered the job has left it, and none can enter after it is closed.
    let f = unsafe { std::mem::transmute::<&(dyn Fn(usize, usize) + Sync), *const TaskFn>(f_ref) };
    let job = JobRef { f, tasks };
    let result = p.run(job, threads - 1);
    p.busy.store(false, Ordering::Release);
    if let Err(e) = result {
        resume_unwind(e);
    }
}

impl Pool {
    fn ensure_workers(&'static self, want: usize) {
        let mut spawned = self.spawned.lock().unwrap();
        while *spawned < want {
            let index = *spawned;
            std::thread::Builder::new()
                .name(format!("kasoku-worker-{index}"))
                .spawn(move || self.worker(index))
                .expect("spawn worker thread");
            *spawned += 1;
        }
        // Wait until every worker runs: a thread's start-up allocates, and it must not happen
        // later, inside some pass that the caller ran alone while the worker was not yet
        // scheduled (passes allocate nothing once warmed up).
        while self.running.load(Ordering::Acquire) < *spawned {
            std::thread::yield_now();
        }
    }

    /// Publishes `job` for `workers` workers, takes part, and waits for it to finish.
    fn run(&self, job: JobRef, workers: usize) -> std::thread::Result<()> {
        *self.job.lock().unwrap() = Some(job);
        self.next.0.store(0, Ordering::Relaxed);
        self.panicked.store(false, Ordering::Relaxed);
        self.allowed.store(workers, Ordering::Relaxed);
        let epoch = (self.state.load(Ordering::Relaxed) >> EPOCH_SHIFT) + 1;
        // Workers see the job, `next`, `panicked` and `allowed` through this store.
        self.state.store(epoch << EPOCH_SHIFT, Ordering::SeqCst);
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            let _guard = self.sleep_lock.lock().unwrap();
            self.wake.notify_all();
        }
        let mine = catch_unwind(AssertUnwindSafe(|| self.work(job, 0)));
        // Close the job and wait for the workers inside it.
        self.state.fetch_or(CLOSED, Ordering::SeqCst);
        let mut spins = 0u32;
        while self.state.load(Ordering::Acquire) & COUNT_MASK != 0 {
            spins += 1;
            if spins < 1 << 16 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        *self.job.lock().unwrap() = None;
        mine?;
        if self.panicked.load(Ordering::Acquire) {
            return Err(Box::new("a parallel_for task panicked"));
        }
        Ok(())
    }

    /// Takes and runs tasks until none are left, as slot `slot`. Every index is taken once:
    /// `next` only grows.
    fn work(&self, job: JobRef, slot: usize) {
        loop {
            let t = self.next.0.fetch_add(1, Ordering::Relaxed);
            if t >= job.tasks {
                break;
            }
            // SAFETY: see `parallel_for_slots`: the closure outlives every entered job.
            unsafe { (*job.f)(t, slot) };
        }
    }

    fn worker(&self, index: usize) {
        self.running.fetch_add(1, Ordering::Release);
        let mut seen = self.state.load(Ordering::SeqCst) >> EPOCH_SHIFT;
        loop {
            let epoch = self.wait_for_epoch(seen);
            seen = epoch;
            if index >= self.allowed.load(Ordering::Relaxed) {
                continue;
            }
            // Enter: increment the count while the job of `epoch` is open.
            let mut s = self.state.load(Ordering::Acquire);
            let entered = loop {
                if s >> EPOCH_SHIFT != epoch || s & CLOSED != 0 {
                    break false;
                }
                match self.state.compare_exchange_weak(
                    s,
                    s + 1,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => break true,
                    Err(now) => s = now,
                }
            };
            if !entered {
                continue;
            }
            let job = *self.job.lock().unwrap();
            if let Some(job) = job {
                // Worker `index` is allowed in only while `index < allowed`, and `allowed` is
                // one less than the job's thread count: its slot, `1 + index`, is below it.
                if catch_unwind(AssertUnwindSafe(|| self.work(job, 1 + index))).is_err() {
                    self.panicked.store(true, Ordering::Release);
                }
            }
            self.state.fetch_sub(1, Ordering::Release);
        }
    }

    /// Spins, then parks, until the epoch differs from `seen`; returns the new epoch.
    fn wait_for_epoch(&self, seen: u64) -> u64 {
        let start = Instant::now();
        let mut i = 0u32;
        loop {
            let e = self.state.load(Ordering::Acquire) >> EPOCH_SHIFT;
            if e != seen {
                return e;
            }
            i = i.wrapping_add(1);
            if !i.is_multiple_of(256) || start.elapsed() < SPIN {
                std::hint::spin_loop();
                continue;
            }
            self.sleepers.fetch_add(1, Ordering::SeqCst);
            let mut guard = self.sleep_lock.lock().unwrap();
            loop {
                let e = self.state.load(Ordering::SeqCst) >> EPOCH_SHIFT;
                if e != seen {
                    drop(guard);
                    self.sleepers.fetch_sub(1, Ordering::SeqCst);
                    return e;
                }
                guard = self.wake.wait(guard).unwrap();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    #[test]
    fn every_task_runs_exactly_once() {
        for tasks in [0, 1, 2, 3, 17, 1000] {
            for _ in 0..50 {
                let hits: Vec<AtomicU32> = (0..tasks).map(|_| AtomicU32::new(0)).collect();
                parallel_for(tasks, |t| {
                    hits[t].fetch_add(1, Ordering::Relaxed);
                });
                assert!(
                    hits.iter().all(|h| h.load(Ordering::Relaxed) == 1),
                    "{tasks} tasks"
                );
            }
        }
    }

    #[test]
    fn nested_and_concurrent_calls_complete() {
        let total = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| {
                    for _ in 0..20 {
                        parallel_for(4, |_| {
                            parallel_for(5, |_| {
                                total.fetch_add(1, Ordering::Relaxed);
                            });
                        });
                    }
                });
            }
        });
        assert_eq!(total.load(Ordering::Relaxed), 3 * 20 * 4 * 5);
    }

    #[test]
    fn a_task_panic_reaches_the_caller_and_the_pool_survives() {
        let r = catch_unwind(|| {
            parallel_for(16, |t| {
                if t == 11 {
                    panic!("task 11");
                }
            })
        });
        assert!(r.is_err());
        let count = AtomicUsize::new(0);
        parallel_for(16, |_| {
            count.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(count.load(Ordering::Relaxed), 16);
    }

    #[test]
    fn workers_wake_after_parking() {
        parallel_for(4, |_| {});
        std::thread::sleep(SPIN * 4);
        let count = AtomicUsize::new(0);
        parallel_for(64, |_| {
            count.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(count.load(Ordering::Relaxed), 64);
    }
}
