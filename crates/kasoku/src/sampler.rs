//! Token sampling: penalties, top-k, top-p, min-p, temperature, and a random draw whose noise
//! is keyed by (seed, absolute position), so that any decoding strategy that computes the same
//! logits at the same position (plain or speculative) picks the same token.
//!
//! The order of operations follows llama.cpp's default chain: penalties, top-k, top-p, min-p,
//! temperature, then the draw. Temperature 0 means greedy (after penalties).

#![warn(missing_docs)]

use std::collections::HashMap;

use crate::constraint::TokenMask;

/// Sampling parameters. `Default` is greedy with no penalties.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 = greedy.
    pub temperature: f32,
    /// 0 = disabled.
    pub top_k: usize,
    /// 1.0 = disabled.
    pub top_p: f32,
    /// 0.0 = disabled.
    pub min_p: f32,
    /// 1.0 = disabled. CTRL-style: positive logits divided by it, negative multiplied.
    pub repetition_penalty: f32,
    /// Subtracted once from the logit of every token present in the penalty window.
    pub presence_penalty: f32,
    /// Subtracted per occurrence in the penalty window.
    pub frequency_penalty: f32,
    /// How many of the most recent context tokens (prompt and generated) the penalties look at.
    pub penalty_last_n: usize,
    /// Seeds the random draws (with the position: the same seed gives the same text).
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            penalty_last_n: 64,
            seed: 0,
        }
    }
}

/// An invalid sampling parameter, named.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("invalid sampling parameter {name} = {value}: {expected}")]
pub struct ParamError {
    /// The parameter.
    pub name: &'static str,
    /// The value given.
    pub value: String,
    /// What it should be.
    pub expected: &'static str,
}

impl SamplingParams {
    /// Checks every value's range.
    pub fn validate(&self) -> Result<(), ParamError> {
        let bad = |name, value: f32, expected| {
            Err(ParamError {
                name,
                value: value.to_string(),
                expected,
            })
        };
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return bad("temperature", self.temperature, "a finite number >= 0");
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p", self.top_p, "in (0, 1]");
        }
        if !(self.min_p >= 0.0 && self.min_p <= 1.0) {
            return bad("min_p", self.min_p, "in [0, 1]");
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return bad(
                "repetition_penalty",
                self.repetition_penalty,
                "a finite number > 0",
            );
        }
        if !(self.presence_penalty.is_finite() && self.presence_penalty.abs() <= 2.0) {
            return bad("presence_penalty", self.presence_penalty, "in [-2, 2]");
        }
        if !(self.frequency_penalty.is_finite() && self.frequency_penalty.abs() <= 2.0) {
            return bad("frequency_penalty", self.frequency_penalty, "in [-2, 2]");
        }
        Ok(())
    }

    /// Whether any repetition penalty changes the logits (they read the history).
    pub fn has_penalties(&self) -> bool {
        let none = self.repetition_penalty == 1.0
            && self.presence_penalty == 0.0
            && self.frequency_penalty == 0.0;
        !none && self.penalty_last_n > 0
    }

    /// Whether the draw is the most likely token (temperature 0).
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }
}

/// Picks the next token from `logits` for absolute `position`, given the context so far
/// (`history`: every token before `position`, prompt included). A pure function of its inputs.
pub fn sample(params: &SamplingParams, logits: &[f32], history: &[u32], position: usize) -> u32 {
    sample_masked(params, logits, history, position, None)
}

/// [`sample`] over the tokens `mask` allows only (constrained decoding): the others get no
/// probability, and the chain runs on what remains. `mask` must allow at least one token.
pub fn sample_masked(
    params: &SamplingParams,
    logits: &[f32],
    history: &[u32],
    position: usize,
    mask: Option<&TokenMask>,
) -> u32 {
    let mut logits = logits.to_vec();
    apply_penalties(params, &mut logits, history);
    if let Some(mask) = mask {
        mask.apply(&mut logits);
    }
    if params.is_greedy() {
        return argmax(&logits);
    }
    let mut candidates: Vec<(u32, f32)> = logits
        .iter()
        .enumerate()
        .filter(|&(i, _)| mask.is_none_or(|m| m.is_allowed(i as u32)))
        .map(|(i, &l)| (i as u32, l))
        .collect();
    // Sort by logit, descending; ties broken by id for determinism.
    let keep = if params.top_k > 0 {
        params.top_k.min(candidates.len())
    } else {
        candidates.len()
    };
    let by_logit = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
    // Still in ascending id order unless top-k selected.
    let id_ordered = keep == candidates.len();
    if keep < candidates.len() {
        candidates.select_nth_unstable_by(keep - 1, by_logit);
        candidates.truncate(keep);
    }
    sort_by_logit(&mut candidates, id_ordered);

    // top-p and min-p act on the softmax at temperature 1, as llama.cpp does.
    let probs = softmax(&candidates.iter().map(|c| c.1).collect::<Vec<_>>());
    if params.top_p < 1.0 {
        let mut cum = 0.0f64;
        let mut cut = candidates.len();
        for (i, p) in probs.iter().enumerate() {
            cum += *p as f64;
            if cum >= params.top_p as f64 {
                cut = i + 1;
                break;
            }
        }
        candidates.truncate(cut);
    }
    if params.min_p > 0.0 && !candidates.is_empty() {
        let threshold = probs[0] * params.min_p;
        let cut = probs
            .iter()
            .take(candidates.len())
            .take_while(|&&p| p >= threshold)
            .count()
            .max(1);
        candidates.truncate(cut);
    }

    let scaled: Vec<f32> = candidates
        .iter()
        .map(|c| c.1 / params.temperature)
        .collect();
    let probs = softmax(&scaled);
    let u = uniform(params.seed, position as u64);
    let mut cum = 0.0f64;
    for (c, p) in candidates.iter().zip(&probs) {
        cum += *p as f64;
        if u < cum {
            return c.0;
        }
    }
    candidates
        .last()
        .map(|c| c.0)
        .unwrap_or_else(|| argmax(&logits))
}

/// Index of the largest logit (the first one on ties).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// Below this many candidates a comparison sort is as fast as the radix sort.
const RADIX_MIN: usize = 2048;

/// Sorts `candidates` by logit, descending, ties by ascending id: the order of
/// `b.logit.total_cmp(a.logit).then(a.id.cmp(b.id))`, which is total, so every correct sort
/// gives the same sequence. Large lists (a whole vocabulary when top-k is off: 152k for Qwen)
/// take an LSD radix sort on a key that orders as that comparison (3× faster than the
/// comparison sort at that size); when the input is already in ascending id order
/// (`id_ordered`), the stable passes over the logit alone keep ties in id order.
fn sort_by_logit(candidates: &mut [(u32, f32)], id_ordered: bool) {
    if candidates.len() < RADIX_MIN {
        candidates.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        return;
    }
    // `total_cmp`'s order as unsigned bits, inverted for descending.
    let descending = |l: f32| {
        let b = l.to_bits();
        !(if b >> 31 == 1 { !b } else { b | 0x8000_0000 })
    };
    let mut keys: Vec<u64> = candidates
        .iter()
        .map(|&(id, l)| (descending(l) as u64) << 32 | id as u64)
        .collect();
    let mut spare = vec![0u64; keys.len()];
    let mut count = vec![0usize; 1 << 16];
    let first_pass = if id_ordered { 2 } else { 0 };
    for pass in first_pass..4 {
        let shift = pass * 16;
        let digit = |k: u64| ((k >> shift) & 0xffff) as usize;
        count.fill(0);
        for &k in &keys {
            count[digit(k)] += 1;
        }
        if count.contains(&keys.len()) {
            continue; // one digit everywhere: this pass would not move anything
        }
        let mut sum = 0;
        for c in count.iter_mut() {
            (*c, sum) = (sum, sum + *c);
        }
        for &k in &keys {
            let d = digit(k);
            spare[count[d]] = k;
            count[d] += 1;
        }
        std::mem::swap(&mut keys, &mut spare);
    }
    let logit = |k: u64| {
        let o = !((k >> 32) as u32);
        f32::from_bits(if o >> 31 == 1 { o & 0x7fff_ffff } else { !o })
    };
    for (c, &k) in candidates.iter_mut().zip(&keys) {
        *c = (k as u32, logit(k));
    }
}

fn apply_penalties(params: &SamplingParams, logits: &mut [f32], history: &[u32]) {
    if !params.has_penalties() {
        return;
    }
    let window = &history[history.len().saturating_sub(params.penalty_last_n)..];
    let mut counts: HashMap<u32, u32> = HashMap::new();
    for &t in window {
        *counts.entry(t).or_default() += 1;
    }
    for (&token, &count) in &counts {
        let Some(l) = logits.get_mut(token as usize) else {
            continue;
        };
        if *l > 0.0 {
            *l /= params.repetition_penalty;
        } else {
            *l *= params.repetition_penalty;
        }
        *l -= params.presence_penalty + params.frequency_penalty * count as f32;
    }
}

fn softmax(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f64> = logits.iter().map(|&l| ((l - max) as f64).exp()).collect();
    let sum: f64 = exps.iter().sum();
    exps.iter().map(|&e| (e / sum) as f32).collect()
}

/// A uniform number in [0, 1) that depends only on (seed, position): SplitMix64 finalisation
/// of a combined key, 53 random bits.
pub fn uniform(seed: u64, position: u64) -> f64 {
    let mut z =
        seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ position.wrapping_add(0xD1B5_4A32_D192_ED03);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_radix_sort_orders_as_the_comparison() {
        let mut x: u64 = 0x9E37_79B9;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let special = [
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -f32::NAN,
            1e-40,
        ];
        for n in [RADIX_MIN, 5000, 151_936] {
            // Coarse values (many ties), specials, and ids from 0 or scattered.
            let list: Vec<(u32, f32)> = (0..n as u32)
                .map(|i| {
                    let r = next();
                    let l = if r % 17 == 0 {
                        special[(r >> 8) as usize % special.len()]
                    } else {
                        ((r >> 20) % 64) as f32 * 0.25 - 8.0
                    };
                    (i * 3, l)
                })
                .collect();
            let want = {
                let mut w = list.clone();
                w.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
                w
            };
            let bits = |v: &[(u32, f32)]| -> Vec<(u32, u32)> {
                v.iter().map(|&(i, l)| (i, l.to_bits())).collect()
            };
            let mut got = list.clone();
            sort_by_logit(&mut got, true);
            assert_eq!(bits(&got), bits(&want), "id-ordered, n {n}");
            let mut shuffled = list.clone();
            for i in (1..shuffled.len()).rev() {
                shuffled.swap(i, next() as usize % (i + 1));
            }
            sort_by_logit(&mut shuffled, false);
            assert_eq!(bits(&shuffled), bits(&want), "shuffled, n {n}");
        }
    }

    fn params(temperature: f32) -> SamplingParams {
        SamplingParams {
            temperature,
            ..Default::default()
        }
    }

    #[test]
    fn greedy_takes_the_largest_logit() {
        assert_eq!(sample(&params(0.0), &[0.1, 2.0, -1.0, 1.9], &[], 0), 1);
    }

    #[test]
    fn same_seed_and_position_same_token_and_positions_differ() {
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
        let p = SamplingParams {
            temperature: 1.0,
            seed: 42,
            ..Default::default()
        };
        let a: Vec<u32> = (0..200).map(|pos| sample(&p, &logits, &[], pos)).collect();
        let b: Vec<u32> = (0..200).map(|pos| sample(&p, &logits, &[], pos)).collect();
        assert_eq!(a, b);
        let distinct: std::collections::HashSet<_> = a.iter().collect();
        assert!(
            distinct.len() > 10,
            "draws should vary across positions: {distinct:?}"
        );
        let q = SamplingParams { seed: 43, ..p };
        let c: Vec<u32> = (0..200).map(|pos| sample(&q, &logits, &[], pos)).collect();
        assert_ne!(a, c);
    }

    #[test]
    fn draws_follow_the_distribution() {
        // Two tokens with probabilities 0.25 / 0.75 at temperature 1.
        let logits = [0.0f32, 3f32.ln()];
        let p = SamplingParams {
            temperature: 1.0,
            seed: 7,
            ..Default::default()
        };
        let ones = (0..20000)
            .filter(|&pos| sample(&p, &logits, &[], pos) == 1)
            .count();
        let frac = ones as f64 / 20000.0;
        assert!((frac - 0.75).abs() < 0.015, "fraction of token 1: {frac}");
    }

    #[test]
    fn top_k_one_is_greedy() {
        let logits: Vec<f32> = (0..30).map(|i| ((i * 7) % 11) as f32).collect();
        let p = SamplingParams {
            temperature: 5.0,
            top_k: 1,
            seed: 3,
            ..Default::default()
        };
        for pos in 0..100 {
            assert_eq!(sample(&p, &logits, &[], pos), argmax(&logits));
        }
    }

    #[test]
    fn top_p_and_min_p_remove_the_tail() {
        // probabilities ~ [0.665, 0.245, 0.090] at temperature 1
        let logits = [2.0f32, 1.0, 0.0];
        let top_p = SamplingParams {
            temperature: 1.0,
            top_p: 0.8,
            seed: 1,
            ..Default::default()
        };
        let min_p = SamplingParams {
            temperature: 1.0,
            min_p: 0.2,
            seed: 1,
            ..Default::default()
        };
        for pos in 0..2000 {
            assert_ne!(sample(&top_p, &logits, &[], pos), 2);
            assert_ne!(sample(&min_p, &logits, &[], pos), 2);
        }
        let seen: std::collections::HashSet<u32> = (0..2000)
            .map(|pos| sample(&top_p, &logits, &[], pos))
            .collect();
        assert_eq!(seen.len(), 2);
    }

    #[test]
    fn penalties_change_the_greedy_choice() {
        let logits = [1.0f32, 0.9, 0.0];
        let history = [0u32, 0, 0];
        let rep = SamplingParams {
            repetition_penalty: 1.5,
            ..Default::default()
        };
        assert_eq!(sample(&rep, &logits, &history, 3), 1);
        let pres = SamplingParams {
            presence_penalty: 0.2,
            ..Default::default()
        };
        assert_eq!(sample(&pres, &logits, &history, 3), 1);
        let freq = SamplingParams {
            frequency_penalty: 0.04,
            ..Default::default()
        };
        assert_eq!(sample(&freq, &logits, &history, 3), 1);
        let weak = SamplingParams {
            frequency_penalty: 0.03,
            ..Default::default()
        };
        assert_eq!(sample(&weak, &logits, &history, 3), 0);
        // Outside the window, no effect.
        let windowed = SamplingParams {
            presence_penalty: 0.2,
            penalty_last_n: 1,
            ..Default::default()
        };
        assert_eq!(sample(&windowed, &logits, &[0, 0, 2], 3), 0);
    }

    #[test]
    fn validation_names_the_parameter() {
        let p = SamplingParams {
            top_p: 1.5,
            ..Default::default()
        };
        assert_eq!(p.validate().unwrap_err().name, "top_p");
        let p = SamplingParams {
            temperature: -1.0,
            ..Default::default()
        };
        assert_eq!(p.validate().unwrap_err().name, "temperature");
        assert!(SamplingParams::default().validate().is_ok());
    }
}
