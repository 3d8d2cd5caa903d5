//! Statistics of speculative decoding: how many draft tokens each target pass accepted, how
//! large the verified trees were, and the time spent drafting and verifying.

use std::time::Duration;

/// Counters of one generation's speculative passes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SpecStats {
    /// The drafter's name.
    pub drafter: String,
    /// Target passes that verified a tree (passes without a draft are not counted here).
    pub verify_passes: usize,
    /// Tree nodes verified, roots included.
    pub verified_nodes: usize,
    /// `accepted_histogram[k]`: passes that accepted `k` draft tokens.
    pub accepted_histogram: Vec<usize>,
    pub draft_time: Duration,
    pub verify_time: Duration,
}

impl SpecStats {
    pub fn record(&mut self, nodes: usize, accepted: usize) {
        self.verify_passes += 1;
        self.verified_nodes += nodes;
        if self.accepted_histogram.len() <= accepted {
            self.accepted_histogram.resize(accepted + 1, 0);
        }
        self.accepted_histogram[accepted] += 1;
    }

    /// Draft tokens accepted over all passes.
    pub fn accepted_tokens(&self) -> usize {
        self.accepted_histogram
            .iter()
            .enumerate()
            .map(|(k, &c)| k * c)
            .sum()
    }

    /// Mean draft tokens accepted per verifying pass.
    pub fn mean_accepted(&self) -> f64 {
        if self.verify_passes == 0 {
            0.0
        } else {
            self.accepted_tokens() as f64 / self.verify_passes as f64
        }
    }

    /// Mean nodes per verified tree.
    pub fn mean_tree_size(&self) -> f64 {
        if self.verify_passes == 0 {
            0.0
        } else {
            self.verified_nodes as f64 / self.verify_passes as f64
        }
    }

    /// One line for the statistics printout.
    pub fn summary(&self) -> String {
        let hist: Vec<String> = self
            .accepted_histogram
            .iter()
            .enumerate()
            .map(|(k, c)| format!("{k}:{c}"))
            .collect();
        format!(
            "speculation ({}): {} verify passes, {:.2} nodes/tree, {:.2} accepted/pass [{}] | drafting {:.3} s, verifying {:.3} s",
            self.drafter,
            self.verify_passes,
            self.mean_tree_size(),
            self.mean_accepted(),
            hist.join(" "),
            self.draft_time.as_secs_f64(),
            self.verify_time.as_secs_f64()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_means() {
        let mut s = SpecStats::default();
        s.record(5, 2);
        s.record(3, 0);
        s.record(5, 4);
        assert_eq!(s.accepted_histogram, vec![1, 0, 1, 0, 1]);
        assert_eq!(s.accepted_tokens(), 6);
        assert!((s.mean_accepted() - 2.0).abs() < 1e-12);
        assert!((s.mean_tree_size() - 13.0 / 3.0).abs() < 1e-12);
        assert!(s.summary().contains("0:1 1:0 2:1"));
    }
}
