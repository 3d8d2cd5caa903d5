//! How many nodes a pass verifies. On a CPU a k-node pass costs noticeably more than a
//! 1-node pass, so drafting pays only when the expected accepted tokens outgrow that cost.
//! The policy measures both as it goes: the time of verifying `n` nodes, the time of a draft,
//! and the chance that level `d` of a draft is accepted when level `d − 1` was; it then picks
//! the budget with the best expected tokens per second, 0 (plain decoding) included, and
//! now and then tries the next larger budget to keep its estimates fresh.

use std::time::Duration;

/// Budgets the policy chooses among (nodes below the root). 7 and 15 make passes of 8 and 16
/// rows, whole tiles of a GPU's product kernels, whose cost jumps at the next row: on an H200
/// a 9-row pass of the 1.5B costs a third more than an 8-row one.
const CANDIDATES: [usize; 11] = [0, 1, 2, 3, 4, 6, 7, 8, 12, 15, 16];
/// Weight of a new measurement in the moving averages.
const EMA: f64 = 0.2;
/// Every this many passes, a budget above the best is tried ...
const EXPLORE_EVERY: u64 = 16;
/// ... and this often while fewer than [`WARM_UP`] passes have been measured.
const EXPLORE_EARLY: u64 = 4;
const WARM_UP: u64 = 64;

/// Limits of the policy.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PolicyConfig {
    /// Most nodes below the root.
    pub max_budget: usize,
    /// Deepest level a draft may reach.
    pub max_depth: usize,
    /// Adapt the budget to measurements (otherwise always `max_budget`).
    pub adaptive: bool,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            max_budget: 8,
            max_depth: 8,
            adaptive: true,
        }
    }
}

/// The adaptive budget.
#[derive(Clone, Debug)]
pub struct Policy {
    pub config: PolicyConfig,
    /// Seconds per pass by node count (index = nodes), moving averages.
    verify_cost: Vec<Option<f64>>,
    /// Seconds of drafting per level of the drafted tree (a draft model runs one pass per
    /// level; prompt lookup costs next to nothing), or per draft when `flat_draft`.
    draft_cost: Option<f64>,
    /// A draft costs the same whatever its depth (a block drafter's one pass).
    flat_draft: bool,
    /// The first pass of each size and the first draft only warm up (a GPU captures a graph
    /// for each new shape then): they are left out of the costs.
    first_pass_warms_up: bool,
    /// Pass sizes (nodes) seen so far, and whether a draft has been, when
    /// `first_pass_warms_up`.
    seen: Vec<bool>,
    draft_seen: bool,
    /// Per level d ≥ 1: (times offered with level d − 1 accepted, times accepted), decayed.
    levels: Vec<(f64, f64)>,
    passes: u64,
}

impl Policy {
    pub fn new(config: PolicyConfig) -> Policy {
        Policy {
            config,
            verify_cost: vec![None; config.max_budget + 2],
            draft_cost: None,
            flat_draft: false,
            first_pass_warms_up: false,
            seen: vec![false; config.max_budget + 2],
            draft_seen: false,
            levels: vec![(0.0, 0.0); config.max_depth + 1],
            passes: 0,
        }
    }

    /// Models a draft's cost as one pass whatever its depth (`true`, a block drafter) or as
    /// one per level (`false`, the default).
    pub fn set_flat_draft_cost(&mut self, flat: bool) {
        self.flat_draft = flat;
    }

    /// Leaves the first pass of each size, and the first draft, out of the measured costs
    /// (`true` for a device whose first run of a shape captures a graph and costs many runs).
    pub fn set_first_pass_warms_up(&mut self, on: bool) {
        self.first_pass_warms_up = on;
    }

    /// Whether first passes are left out ([`Policy::set_first_pass_warms_up`]).
    pub fn first_pass_warms_up(&self) -> bool {
        self.first_pass_warms_up
    }

    /// Nodes below the root the next pass may verify (0: decode plainly).
    pub fn budget(&mut self) -> usize {
        let max = self.config.max_budget;
        if !self.config.adaptive || max == 0 {
            return max;
        }
        self.passes += 1;
        if self.verify_cost[1].is_none() {
            // Measure plain decoding first: every choice is weighed against it.
            return 0;
        }
        let options: Vec<usize> = CANDIDATES.iter().copied().filter(|&b| b <= max).collect();
        let best = options
            .iter()
            .copied()
            .max_by(|&a, &b| self.rate(a).total_cmp(&self.rate(b)))
            .unwrap_or(0);
        let every = if self.passes < WARM_UP {
            EXPLORE_EARLY
        } else {
            EXPLORE_EVERY
        };
        if self.passes.is_multiple_of(every) {
            options.iter().copied().find(|&b| b > best).unwrap_or(best)
        } else {
            best
        }
    }

    /// Predicted tokens per second with budget `b`.
    pub fn rate(&self, b: usize) -> f64 {
        let depth = b.min(self.config.max_depth);
        let mut expected = 1.0;
        let mut reach = 1.0;
        for d in 1..=depth {
            reach *= self.level_rate(d);
            expected += reach;
        }
        let levels = if self.flat_draft { depth.min(1) } else { depth };
        let draft = self.draft_cost.unwrap_or(0.0) * levels as f64;
        expected / (draft + self.cost(b + 1))
    }

    /// Chance that level `d` is accepted given level `d − 1` was (optimistic before any
    /// measurement, so that drafting gets tried).
    fn level_rate(&self, d: usize) -> f64 {
        let (offered, accepted) = self.levels.get(d).copied().unwrap_or((0.0, 0.0));
        // A prior worth two observations at 0.7.
        (accepted + 1.4) / (offered + 2.0)
    }

    /// Seconds for a pass of `n` nodes: measured, else interpolated from a 1-node pass with a
    /// prior slope of 15% per node.
    fn cost(&self, n: usize) -> f64 {
        if let Some(Some(c)) = self.verify_cost.get(n) {
            return *c;
        }
        let base = self
            .verify_cost
            .iter()
            .enumerate()
            .take(n + 1)
            .rev()
            .find_map(|(k, c)| c.map(|c| (k, c)));
        match base {
            Some((k, c)) => c * (1.0 + 0.15 * (n - k) as f64),
            None => 1.0 + 0.15 * (n.saturating_sub(1)) as f64,
        }
    }

    /// Records a pass: `nodes` verified (root included) in `verify` time after a draft of
    /// `draft` time (none when no draft was asked for), whose tree reached `depth` levels,
    /// of which `accepted` were accepted.
    pub fn record(
        &mut self,
        nodes: usize,
        depth: usize,
        accepted: usize,
        draft: Option<Duration>,
        verify: Duration,
    ) {
        let ema = |old: Option<f64>, new: f64| Some(old.map_or(new, |o| o + EMA * (new - o)));
        let mut warm_up = false;
        if self.first_pass_warms_up {
            if let Some(seen) = self.seen.get_mut(nodes) {
                warm_up = !*seen;
                *seen = true;
            }
        }
        if let Some(slot) = self.verify_cost.get_mut(nodes).filter(|_| !warm_up) {
            *slot = ema(*slot, verify.as_secs_f64());
        }
        let first_draft = self.first_pass_warms_up && draft.is_some() && !self.draft_seen;
        if draft.is_some() {
            self.draft_seen = true;
        }
        if let Some(d) = draft.filter(|_| !warm_up && !first_draft) {
            let levels = if self.flat_draft {
                1.0
            } else {
                depth.max(1) as f64
            };
            self.draft_cost = ema(self.draft_cost, d.as_secs_f64() / levels);
        }
        for d in 1..=depth.min(self.config.max_depth) {
            if d > accepted + 1 {
                break;
            }
            let l = &mut self.levels[d];
            l.0 = l.0 * (1.0 - EMA / 4.0) + 1.0;
            l.1 = l.1 * (1.0 - EMA / 4.0) + if d <= accepted { 1.0 } else { 0.0 };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(x: f64) -> Duration {
        Duration::from_secs_f64(x / 1000.0)
    }

    #[test]
    fn drafting_stops_when_nothing_is_accepted() {
        let mut p = Policy::new(PolicyConfig::default());
        assert_eq!(p.budget(), 0, "plain decoding is measured first");
        p.record(1, 0, 0, None, ms(30.0));
        assert!(p.budget() > 0, "then drafting is tried");
        for _ in 0..200 {
            let b = p.budget();
            let nodes = b + 1;
            p.record(nodes, b, 0, Some(ms(0.1)), ms(30.0 + 10.0 * b as f64));
        }
        let zeros = (0..32).filter(|_| p.budget() == 0).count();
        assert!(zeros >= 28, "mostly plain decoding, got {zeros}/32");
    }

    #[test]
    fn drafting_grows_when_drafts_are_accepted_and_verification_is_cheap() {
        let mut p = Policy::new(PolicyConfig::default());
        for _ in 0..200 {
            let b = p.budget();
            p.record(b + 1, b, b, Some(ms(0.1)), ms(30.0 + 3.0 * b as f64));
        }
        assert!(p.budget() >= 6, "got {}", p.budget());
    }

    #[test]
    fn a_pass_of_whole_tiles_is_preferred_to_one_row_more() {
        // Verification cost in steps of 8 rows (a GPU's tiles): 9 rows cost a whole tile more.
        let cost = |nodes: usize| {
            1.0 + 0.25 * (nodes.min(8) - 1) as f64 + if nodes > 8 { 1.0 } else { 0.0 }
        };
        let mut p = Policy::new(PolicyConfig::default());
        for _ in 0..300 {
            let b = p.budget();
            p.record(b + 1, b, b, Some(ms(0.01)), ms(cost(b + 1)));
        }
        let sevens = (0..32).filter(|_| p.budget() == 7).count();
        assert!(sevens >= 28, "budget 7 (8 rows) mostly, got {sevens}/32");
    }

    #[test]
    fn a_drafter_costing_a_target_pass_per_level_is_turned_off() {
        let mut p = Policy::new(PolicyConfig::default());
        for _ in 0..300 {
            let b = p.budget();
            let draft = (b > 0).then(|| ms(30.0 * b as f64));
            p.record(b + 1, b, b, draft, ms(30.0 + 4.0 * b as f64));
        }
        let zeros = (0..32).filter(|_| p.budget() == 0).count();
        assert!(zeros >= 28, "mostly plain decoding, got {zeros}/32");
    }

    /// The 1.5B/0.5B case measured here: a draft level costs 40% of a target pass, verifying
    /// grows ~10% per node, 90% of draft tokens are accepted: drafting pays, and the policy
    /// finds it within a short answer.
    #[test]
    fn a_good_draft_model_is_used_within_a_short_answer() {
        let mut p = Policy::new(PolicyConfig::default());
        let mut rng = 12345u64;
        let mut tokens = 0;
        let mut passes = 0;
        while tokens < 128 {
            let b = p.budget();
            let mut accepted = 0;
            while accepted < b {
                rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1);
                if (rng >> 33).is_multiple_of(10) {
                    break;
                }
                accepted += 1;
            }
            let draft = (b > 0).then(|| ms(13.0 * b as f64));
            p.record(b + 1, b, accepted, draft, ms(33.0 * (1.0 + 0.1 * b as f64)));
            tokens += accepted + 1;
            passes += 1;
        }
        let last: Vec<usize> = (0..8).map(|_| p.budget()).collect();
        assert!(
            last.iter().filter(|&&b| b >= 2).count() >= 6,
            "budgets {last:?}"
        );
        assert!(
            tokens as f64 / passes as f64 > 2.0,
            "{tokens} tokens in {passes} passes"
        );
    }

    /// A block drafter costs one pass per draft, however deep its tree: measured on shallow
    /// trees (a wide tree of depth 2), its cost is not multiplied by the levels of a deeper
    /// budget, as a draft model's would be.
    #[test]
    fn a_flat_draft_cost_is_not_charged_per_level() {
        let config = PolicyConfig {
            max_budget: 16,
            max_depth: 16,
            adaptive: true,
        };
        let measured = |flat: bool| {
            let mut p = Policy::new(config);
            p.set_flat_draft_cost(flat);
            for _ in 0..50 {
                p.record(1, 0, 0, None, ms(30.0));
                p.record(9, 2, 2, Some(ms(8.0)), ms(38.0));
                p.record(17, 2, 2, Some(ms(8.0)), ms(46.0));
            }
            p
        };
        let (flat, per_level) = (measured(true), measured(false));
        // Same expected tokens; 8 ms against 4 ms × 16 levels of drafting.
        let ratio = flat.rate(16) / per_level.rate(16);
        let want = (64.0 + 46.0) / (8.0 + 46.0);
        assert!((ratio - want).abs() < 1e-9, "{ratio} vs {want}");
        // A 2-level draft costs the same in both models.
        assert!((flat.rate(2) - per_level.rate(2)).abs() < 1e-12);
    }

    #[test]
    fn fixed_budget_when_not_adaptive() {
        let mut p = Policy::new(PolicyConfig {
            max_budget: 5,
            max_depth: 5,
            adaptive: false,
        });
        p.record(6, 5, 0, None, ms(100.0));
        assert_eq!(p.budget(), 5);
    }

    #[test]
    fn a_devices_first_pass_of_each_size_and_first_draft_are_left_out() {
        // A GPU captures a graph on the first pass of each size (and the drafter's on its
        // first draft): a hundred times the pass's cost, once.
        let measured = |warm_up: bool| {
            let mut p = Policy::new(PolicyConfig::default());
            p.set_first_pass_warms_up(warm_up);
            assert_eq!(p.budget(), 0);
            p.record(1, 0, 0, None, ms(300.0));
            p.record(1, 0, 0, None, ms(3.0));
            p.record(5, 4, 4, Some(ms(50.0)), ms(400.0));
            p.record(5, 4, 4, Some(ms(0.1)), ms(4.0));
            p
        };
        let (device, plain) = (measured(true), measured(false));
        assert!((device.cost(1) - 0.003).abs() < 1e-12, "{}", device.cost(1));
        assert!((device.cost(5) - 0.004).abs() < 1e-12, "{}", device.cost(5));
        // Per level: 0.1 ms over 4 levels.
        assert!((device.draft_cost.unwrap() - 0.000025).abs() < 1e-12);
        // Four accepted drafts for a third more than a plain pass: drafting pays.
        assert!(device.rate(4) > 2.0 * device.rate(0));
        // Measuring every pass charges the captures to the costs for many passes.
        assert!(plain.cost(1) > 0.1 && plain.cost(5) > 0.1);
        // Once past the first pass of a size, every pass counts.
        let mut p = measured(true);
        p.record(5, 4, 4, Some(ms(0.1)), ms(8.0));
        assert!(p.cost(5) > 0.004);
    }
}
