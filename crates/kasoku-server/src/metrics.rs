//! Server counters and latency histograms, rendered in Prometheus' text format at /metrics.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// Upper bounds (seconds) of the latency histograms' buckets.
const BUCKETS: [f64; 12] = [
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// A cumulative histogram of durations.
#[derive(Debug, Default)]
pub struct Histogram {
    inner: Mutex<HistogramData>,
}

#[derive(Debug, Default)]
struct HistogramData {
    counts: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

impl Histogram {
    pub fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        let mut h = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        for (i, &le) in BUCKETS.iter().enumerate() {
            if s <= le {
                h.counts[i] += 1;
            }
        }
        h.count += 1;
        h.sum += s;
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let h = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        for (i, le) in BUCKETS.iter().enumerate() {
            let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {}", h.counts[i]);
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", h.count);
        let _ = writeln!(out, "{name}_sum {}", h.sum);
        let _ = writeln!(out, "{name}_count {}", h.count);
    }
}

/// Everything /metrics reports.
#[derive(Debug, Default)]
pub struct Metrics {
    pub requests_ok: AtomicU64,
    pub requests_error: AtomicU64,
    pub requests_cancelled: AtomicU64,
    pub requests_rejected: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub cached_tokens: AtomicU64,
    pub completion_tokens: AtomicU64,
    pub decode_passes: AtomicU64,
    pub decode_tokens: AtomicU64,
    pub queue_wait: Histogram,
    pub time_to_first_token: Histogram,
    pub request_duration: Histogram,
}

/// Gauges read at render time.
pub struct Gauges {
    /// Where the sessions run (`cpu`, `cuda:0`).
    pub device: String,
    pub queue_depth: usize,
    pub running: usize,
    pub sessions: usize,
    pub connections: usize,
    pub cache_bytes: usize,
    pub cache_entries: usize,
    pub cache_hits: u64,
    pub cache_lookups: u64,
}

pub fn add(counter: &AtomicU64, n: usize) {
    counter.fetch_add(n as u64, Ordering::Relaxed);
}

impl Metrics {
    pub fn render(&self, g: &Gauges) -> String {
        let mut out = String::new();
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        // A device name is ours (cpu, cuda:N): nothing in it needs escaping.
        let _ = writeln!(
            out,
            "# HELP kasoku_device_info Where the sessions run.\n# TYPE kasoku_device_info gauge\nkasoku_device_info{{device=\"{}\"}} 1",
            g.device
        );
        let _ = writeln!(
            out,
            "# HELP kasoku_requests_total Generation requests by outcome.\n# TYPE kasoku_requests_total counter"
        );
        for (label, c) in [
            ("ok", &self.requests_ok),
            ("error", &self.requests_error),
            ("cancelled", &self.requests_cancelled),
            ("rejected", &self.requests_rejected),
        ] {
            let _ = writeln!(
                out,
                "kasoku_requests_total{{outcome=\"{label}\"}} {}",
                get(c)
            );
        }
        let counters = [
            (
                "kasoku_prompt_tokens_total",
                "Prompt tokens computed (not from the cache).",
                &self.prompt_tokens,
            ),
            (
                "kasoku_cached_prompt_tokens_total",
                "Prompt tokens reused from the prefix cache.",
                &self.cached_tokens,
            ),
            (
                "kasoku_completion_tokens_total",
                "Tokens generated.",
                &self.completion_tokens,
            ),
            (
                "kasoku_decode_passes_total",
                "Target forward passes during decoding.",
                &self.decode_passes,
            ),
            (
                "kasoku_decode_tokens_total",
                "Tokens taken from decoding passes.",
                &self.decode_tokens,
            ),
        ];
        for (name, help, c) in counters {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
                get(c)
            );
        }
        let passes = get(&self.decode_passes);
        let tpp = if passes == 0 {
            0.0
        } else {
            get(&self.decode_tokens) as f64 / passes as f64
        };
        let gauges = [
            (
                "kasoku_queue_depth",
                "Requests waiting for a session.",
                g.queue_depth as f64,
            ),
            (
                "kasoku_requests_running",
                "Requests being generated.",
                g.running as f64,
            ),
            (
                "kasoku_sessions",
                "Sessions (--parallel).",
                g.sessions as f64,
            ),
            (
                "kasoku_connections_open",
                "HTTP connections open now.",
                g.connections as f64,
            ),
            (
                "kasoku_tokens_per_pass",
                "Decoded tokens per target forward pass, since start.",
                tpp,
            ),
            (
                "kasoku_prefix_cache_bytes",
                "Bytes held by prefix cache snapshots.",
                g.cache_bytes as f64,
            ),
            (
                "kasoku_prefix_cache_entries",
                "Prefix cache snapshots.",
                g.cache_entries as f64,
            ),
            (
                "kasoku_prefix_cache_hits",
                "Prefix cache lookups that found a prefix.",
                g.cache_hits as f64,
            ),
            (
                "kasoku_prefix_cache_lookups",
                "Prefix cache lookups.",
                g.cache_lookups as f64,
            ),
        ];
        for (name, help, v) in gauges {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {v}");
        }
        self.queue_wait.render(
            &mut out,
            "kasoku_queue_wait_seconds",
            "Time from arrival to a session taking the request.",
        );
        self.time_to_first_token.render(
            &mut out,
            "kasoku_time_to_first_token_seconds",
            "Time from arrival to the first generated token.",
        );
        self.request_duration.render(
            &mut out,
            "kasoku_request_duration_seconds",
            "Time from arrival to the end of generation.",
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_gauges_and_cumulative_buckets() {
        let m = Metrics::default();
        add(&m.requests_ok, 2);
        add(&m.decode_passes, 4);
        add(&m.decode_tokens, 8);
        m.request_duration.observe(Duration::from_millis(30));
        m.request_duration.observe(Duration::from_secs(3));
        let text = m.render(&Gauges {
            device: "cuda:1".into(),
            queue_depth: 1,
            running: 0,
            sessions: 2,
            connections: 1,
            cache_bytes: 0,
            cache_entries: 0,
            cache_hits: 0,
            cache_lookups: 0,
        });
        assert!(text.contains("kasoku_device_info{device=\"cuda:1\"} 1\n"));
        assert!(text.contains("kasoku_requests_total{outcome=\"ok\"} 2"));
        assert!(text.contains("kasoku_tokens_per_pass 2\n"));
        assert!(text.contains("kasoku_queue_depth 1\n"));
        assert!(text.contains("kasoku_request_duration_seconds_bucket{le=\"0.025\"} 0"));
        assert!(text.contains("kasoku_request_duration_seconds_bucket{le=\"0.05\"} 1"));
        assert!(text.contains("kasoku_request_duration_seconds_bucket{le=\"5\"} 2"));
        assert!(text.contains("kasoku_request_duration_seconds_count 2"));
    }
}
