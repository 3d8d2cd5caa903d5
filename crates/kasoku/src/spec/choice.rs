//! Choosing among drafters by what they measurably deliver: each pass drafts with one of them,
//! and the one with the most committed tokens per second of drafting and verifying is used,
//! the others tried now and then to keep their measurements fresh. A block drafter merged
//! with prompt lookup costs a small pass per draft; on text that copies its context, lookup
//! alone (free) may deliver as much, and then it is the one chosen.
//!
//! Every drafter stays in step: all of them are told of every commit (with the layer outputs
//! any of them asked for), whichever drafted.

use std::time::Instant;

use super::drafter::{Accepted, DraftError, DraftRequest, Drafter, Features};
use crate::model::TokenTree;

/// Passes each option is tried before the measurements decide.
const TRY_FIRST: u64 = 4;
/// Every this many passes, an option other than the best is tried.
const EXPLORE_EVERY: u64 = 12;
/// Weight of the past in the rates (per pass of that option).
const DECAY: f64 = 0.95;

/// Which of several options delivers the most per second, from (tokens, seconds) samples.
#[derive(Clone, Debug)]
pub struct Chooser {
    /// Per option: decayed committed tokens, decayed seconds, samples.
    stats: Vec<(f64, f64, u64)>,
    passes: u64,
}

impl Chooser {
    pub fn new(options: usize) -> Chooser {
        Chooser {
            stats: vec![(0.0, 0.0, 0); options],
            passes: 0,
        }
    }

    /// Tokens per second of `option` so far (0 before any sample).
    pub fn rate(&self, option: usize) -> f64 {
        let (tokens, secs, _) = self.stats[option];
        if secs > 0.0 {
            tokens / secs
        } else {
            0.0
        }
    }

    /// The option for the next pass.
    pub fn choose(&mut self) -> usize {
        self.passes += 1;
        if let Some(i) = self.stats.iter().position(|s| s.2 < TRY_FIRST) {
            return i;
        }
        let n = self.stats.len();
        let best = (0..n)
            .max_by(|&a, &b| self.rate(a).total_cmp(&self.rate(b)))
            .unwrap_or(0);
        if n > 1 && self.passes.is_multiple_of(EXPLORE_EVERY) {
            // The others in turn.
            let k = (self.passes / EXPLORE_EVERY) as usize % (n - 1);
            return (0..n).filter(|&i| i != best).nth(k).unwrap_or(best);
        }
        best
    }

    /// A pass of `option` committed `tokens` in `secs` (drafting and verifying).
    pub fn record(&mut self, option: usize, tokens: usize, secs: f64) {
        let s = &mut self.stats[option];
        s.0 = s.0 * DECAY + tokens as f64;
        s.1 = s.1 * DECAY + secs.max(0.0);
        s.2 += 1;
    }
}

/// Several drafters, one chosen per pass by measured tokens per second.
pub struct ChoiceDrafter {
    options: Vec<Box<dyn Drafter>>,
    chooser: Chooser,
    /// The option that drafted the pending pass, and when its draft began.
    pending: Option<(usize, Instant)>,
}

impl ChoiceDrafter {
    /// `options` (at least one; the first names the statistics).
    pub fn new(options: Vec<Box<dyn Drafter>>) -> ChoiceDrafter {
        assert!(!options.is_empty(), "a choice needs at least one drafter");
        ChoiceDrafter {
            chooser: Chooser::new(options.len()),
            options,
            pending: None,
        }
    }

    /// Tokens per second measured for each option.
    pub fn rates(&self) -> Vec<f64> {
        (0..self.options.len())
            .map(|i| self.chooser.rate(i))
            .collect()
    }
}

impl Drafter for ChoiceDrafter {
    fn name(&self) -> &'static str {
        self.options[0].name()
    }

    fn wants_hidden(&self) -> bool {
        self.options.iter().any(|d| d.wants_hidden())
    }

    fn tap_layers(&self) -> Vec<usize> {
        // One set of layer outputs reaches every drafter: the union, in this order.
        let mut taps: Vec<usize> = Vec::new();
        for d in &self.options {
            for l in d.tap_layers() {
                if !taps.contains(&l) {
                    taps.push(l);
                }
            }
        }
        taps
    }

    fn flat_draft_cost(&self) -> bool {
        self.options.iter().any(|d| d.flat_draft_cost())
    }

    fn start(&mut self, prompt: &[u32], features: Features) -> Result<(), DraftError> {
        self.pending = None;
        for d in &mut self.options {
            d.start(prompt, features)?;
        }
        Ok(())
    }

    fn catch_up(&mut self, tokens: &[u32]) -> Result<(), DraftError> {
        for d in &mut self.options {
            d.catch_up(tokens)?;
        }
        Ok(())
    }

    fn draft(&mut self, req: &DraftRequest) -> Result<TokenTree, DraftError> {
        let option = self.chooser.choose();
        self.pending = Some((option, Instant::now()));
        self.options[option].draft(req)
    }

    fn accept(&mut self, accepted: &Accepted) -> Result<(), DraftError> {
        if let Some((option, since)) = self.pending.take() {
            let secs = since.elapsed().as_secs_f64();
            self.chooser.record(option, accepted.tokens.len(), secs);
        }
        for d in &mut self.options {
            d.accept(accepted)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two options: the one delivering more tokens per second wins, the other is still tried
    /// now and then, and a change in what they deliver changes the choice.
    #[test]
    fn the_option_with_the_best_rate_is_chosen_and_the_other_revisited() {
        let mut c = Chooser::new(2);
        // Option 0: 3 tokens in 40 ms; option 1: 1.2 tokens in 30 ms.
        let deliver = |o: usize, swap: bool| match (o, swap) {
            (0, false) | (1, true) => (3, 0.040),
            _ => (1, 0.025),
        };
        let mut picks = [0usize; 2];
        for _ in 0..120 {
            let o = c.choose();
            picks[o] += 1;
            let (t, s) = deliver(o, false);
            c.record(o, t, s);
        }
        assert!(picks[0] > 95 && picks[1] >= 8, "{picks:?}");
        assert!(c.rate(0) > c.rate(1));
        // The other option becomes the better one: within a while, it is chosen.
        for _ in 0..200 {
            let o = c.choose();
            let (t, s) = deliver(o, true);
            c.record(o, t, s);
        }
        let last: Vec<usize> = (0..10).map(|_| c.choose()).collect();
        assert!(last.iter().filter(|&&o| o == 1).count() >= 8, "{last:?}");
    }

    #[test]
    fn every_option_is_tried_first() {
        let mut c = Chooser::new(3);
        let mut seen = Vec::new();
        for _ in 0..3 * TRY_FIRST {
            let o = c.choose();
            seen.push(o);
            c.record(o, 1, 0.01);
        }
        for o in 0..3 {
            assert_eq!(seen.iter().filter(|&&x| x == o).count() as u64, TRY_FIRST);
        }
    }
}
