//! Run statistics that every generation reports: time to first token, prefill and generation
//! speed, tokens per forward pass, peak memory, duration.

#![warn(missing_docs)]

use std::time::Duration;

/// Counters and timings of one generation.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GenerationStats {
    /// Prompt tokens actually computed (not reused from the cache).
    pub prompt_tokens: usize,
    /// Prompt tokens reused from an earlier turn's cache.
    pub cached_tokens: usize,
    /// Tokens of the answer.
    pub generated_tokens: usize,
    /// Forward passes of the target model during generation (after the prefill).
    pub decode_passes: usize,
    /// Tokens taken from those passes' logits, a final stop token included.
    pub decode_tokens: usize,
    /// Time spent computing the prompt.
    pub prefill_time: Duration,
    /// From the start of the request to the first generated token.
    pub time_to_first_token: Duration,
    /// Time spent generating after the first token.
    pub decode_time: Duration,
    /// The whole request.
    pub total_time: Duration,
    /// Speculative decoding's counters, when it ran.
    pub spec: Option<crate::spec::SpecStats>,
}

impl GenerationStats {
    /// Prompt tokens computed per second.
    pub fn prefill_tokens_per_second(&self) -> f64 {
        rate(self.prompt_tokens, self.prefill_time)
    }

    /// Generation speed over the tokens after the first (whose time is part of the TTFT).
    pub fn decode_tokens_per_second(&self) -> f64 {
        rate(self.generated_tokens.saturating_sub(1), self.decode_time)
    }

    /// Generated tokens per target forward pass (1.00 for plain decoding).
    pub fn tokens_per_pass(&self) -> f64 {
        if self.decode_passes == 0 {
            return if self.generated_tokens > 0 { 1.0 } else { 0.0 };
        }
        self.decode_tokens as f64 / self.decode_passes as f64
    }

    /// The human-readable summary printed after each answer.
    pub fn summary(&self) -> String {
        let mem = peak_rss_bytes()
            .map(|b| format!("{:.0} MiB", b as f64 / (1024.0 * 1024.0)))
            .unwrap_or("n/a".into());
        let cached = if self.cached_tokens > 0 {
            format!(" (+{} cached)", self.cached_tokens)
        } else {
            String::new()
        };
        format!(
            "time to first token {:.3} s | prefill {} tokens{} at {:.1} t/s | generation {} tokens at {:.1} t/s | {:.2} tokens/pass | peak memory {} | total {:.2} s",
            self.time_to_first_token.as_secs_f64(),
            self.prompt_tokens,
            cached,
            self.prefill_tokens_per_second(),
            self.generated_tokens,
            self.decode_tokens_per_second(),
            self.tokens_per_pass(),
            mem,
            self.total_time.as_secs_f64()
        )
    }
}

fn rate(tokens: usize, time: Duration) -> f64 {
    if tokens == 0 || time.is_zero() {
        0.0
    } else {
        tokens as f64 / time.as_secs_f64()
    }
}

/// Peak resident memory of this process (Linux `VmHWM`), if the platform reports it.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_and_tokens_per_pass() {
        let s = GenerationStats {
            prompt_tokens: 100,
            generated_tokens: 11,
            decode_passes: 5,
            decode_tokens: 10,
            prefill_time: Duration::from_millis(500),
            decode_time: Duration::from_secs(2),
            ..Default::default()
        };
        assert_eq!(s.prefill_tokens_per_second(), 200.0);
        assert_eq!(s.decode_tokens_per_second(), 5.0);
        assert_eq!(s.tokens_per_pass(), 2.0);
        assert!(s.summary().contains("2.00 tokens/pass"));
    }
}
