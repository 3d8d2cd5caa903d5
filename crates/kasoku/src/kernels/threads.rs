//! The worker pool every multi-threaded kernel runs on, sized by `set_threads`.

use std::sync::OnceLock;

static POOL: OnceLock<rayon::ThreadPool> = OnceLock::new();

/// Sets the number of compute threads. Effective only before the first kernel runs.
pub fn set_threads(n: usize) {
    let _ = POOL.set(rayon::ThreadPoolBuilder::new().num_threads(n.max(1)).build().expect("thread pool"));
}

/// The number of compute threads.
pub fn num_threads() -> usize {
    pool().current_num_threads()
}

fn pool() -> &'static rayon::ThreadPool {
    POOL.get_or_init(|| {
        let n = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        rayon::ThreadPoolBuilder::new().num_threads(n).build().expect("thread pool")
    })
}

/// Runs `f(task)` for every task in `0..tasks`, spread over the pool; returns when all are done.
pub fn parallel_for(tasks: usize, f: impl Fn(usize) + Sync + Send) {
    if tasks <= 1 {
        if tasks == 1 {
            f(0);
        }
        return;
    }
    pool().scope(|s| {
        let f = &f;
        for t in 0..tasks {
            s.spawn(move |_| f(t));
        }
    });
}
