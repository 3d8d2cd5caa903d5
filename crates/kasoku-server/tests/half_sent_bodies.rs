//! Memory held for request bodies returns to its baseline after 100 clients each send half a
//! body and stall (half of them then hang up, half wait for the body deadline), and while they
//! stall the server holds no more than its body-memory budget. Counted by a global allocator
//! that tracks the bytes live in this process (the server runs in it, on its own threads), so
//! the count does not depend on what the C allocator keeps for reuse.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::Write;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::{Duration, Instant};

use common::Running;
use kasoku_server::ServerConfig;
use serde_json::json;

/// The system allocator, counting live bytes.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so
// `System`'s guarantees hold; the counter is only arithmetic on the sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as received (the caller upholds `alloc`'s contract).
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` with `layout` (through `alloc`/`realloc`).
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as received.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded as received (`ptr` came from this allocator with `layout`).
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_add(
                new_size as isize - layout.size() as isize,
                Ordering::Relaxed,
            );
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn live_mib() -> f64 {
    LIVE.load(Ordering::Relaxed) as f64 / (1 << 20) as f64
}

#[test]
fn memory_returns_to_baseline_after_100_half_sent_bodies() {
    const BODY: usize = 1 << 20;
    const BUDGET: usize = 32 << 20;
    let server = Running::tiny(ServerConfig {
        max_body_bytes: BODY,
        body_memory_bytes: BUDGET,
        body_timeout: Duration::from_secs(2),
        ..ServerConfig::default()
    });
    // Warm up: one request end to end, so that lazily made buffers exist before the baseline.
    let ok = json!({"model": "tiny", "prompt": "one", "max_tokens": 2}).to_string();
    for _ in 0..3 {
        assert_eq!(
            server.request("POST", "/v1/completions", Some(&ok)).status,
            200
        );
    }
    std::thread::sleep(Duration::from_millis(300));
    let baseline = live_mib();

    let half = vec![b' '; BODY / 2];
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {BODY}\r\n\r\n",
        server.addr
    );
    let mut stalled: Vec<std::net::TcpStream> = (0..100)
        .map(|_| {
            let mut s = server.connect();
            s.write_all(head.as_bytes()).unwrap();
            // A body refused for memory is answered and closed: its write may fail.
            let _ = s.write_all(&half);
            s
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let held = live_mib() - baseline;
    assert!(
        held < (BUDGET >> 20) as f64 * 1.5 + 8.0,
        "{held:.1} MiB held for stalled bodies (budget {} MiB)",
        BUDGET >> 20
    );
    // Half hang up; the others stall until the body deadline.
    stalled.truncate(50);
    let start = Instant::now();
    let settled = loop {
        let now = live_mib() - baseline;
        if now < 2.0 {
            break now;
        }
        if start.elapsed() > Duration::from_secs(30) {
            break now;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        settled < 2.0,
        "{settled:.1} MiB still held 30 s after the bodies stalled (peak {held:.1} MiB over a baseline of {baseline:.1} MiB)"
    );
    drop(stalled);
    eprintln!(
        "baseline {baseline:.1} MiB, held while stalled {held:.1} MiB, after {settled:.2} MiB"
    );
}
