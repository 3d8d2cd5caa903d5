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
    // A copy only when penalties or a mask change the row.
    let changed;
    let logits = if params.has_penalties() || mask.is_some() {
        let mut copy = logits.to_vec();
        apply_penalties(params, &mut copy, history);
        if let Some(mask) = mask {
            mask.apply(&mut copy);
        }
        changed = copy;
        &changed[..]
    } else {
        logits
    };
    if params.is_greedy() {
        return argmax(logits);
    }
    let allowed: Vec<(u32, f32)> = match mask {
        None => (0..logits.len() as u32)
            .zip(logits.iter().copied())
            .collect(),
        Some(m) => logits
            .iter()
            .enumerate()
            .filter(|&(i, _)| m.is_allowed(i as u32))
            .map(|(i, &l)| (i as u32, l))
            .collect(),
    };
    let candidates = if params.top_k > 0 && params.top_k < allowed.len() {
        Candidates::TopK(top_k_of(allowed, params.top_k))
    } else {
        Candidates::All(allowed)
    };
    draw(params, candidates, position).unwrap_or_else(|| argmax(logits))
}

/// What a draw chooses among: tokens with their logits (penalties and mask applied).
#[derive(Clone, Debug, PartialEq)]
pub enum Candidates {
    /// Every token the draw may take, in ascending id order (top-k off, or not narrower
    /// than what is allowed).
    All(Vec<(u32, f32)>),
    /// Exactly the `top_k` first tokens in the sampler's order ([`by_logit`]), in any order.
    TopK(Vec<(u32, f32)>),
}

/// The sampler's order: logit descending by `total_cmp`, ties by the smaller id. Total, so
/// every correct sort or selection by it gives the same sequence.
pub fn by_logit(a: &(u32, f32), b: &(u32, f32)) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// The first `k` of `candidates` in the sampler's order ([`by_logit`]), in no particular
/// order (all of them when `k` is not smaller).
pub fn top_k_of(mut candidates: Vec<(u32, f32)>, k: usize) -> Vec<(u32, f32)> {
    if k == 0 {
        return Vec::new();
    }
    if k < candidates.len() {
        // A threshold first narrows a long list cheaply (to a superset of the first k).
        if k * 8 < candidates.len() {
            if let Some(front) = partition_above(&mut candidates, k) {
                candidates.truncate(front);
            }
        }
        if k < candidates.len() {
            candidates.select_nth_unstable_by(k - 1, by_logit);
            candidates.truncate(k);
        }
    }
    candidates
}

/// The draw of the chain after penalties, mask and top-k: top-p and min-p (on the softmax at
/// temperature 1, as llama.cpp does), temperature, then the (seed, position)-keyed uniform.
/// The one piece of sampling arithmetic, whether the candidates come from a whole row on the
/// host or from a device's top-k selection. `None` when there is no candidate.
///
/// Exact sums in a fixed order that needs no sort: the softmax denominators run over the
/// candidates as given (a top-k list sorted first, a whole row in id order), except the
/// final one after a top-p or min-p cut, which runs over the kept prefix in the sampler's
/// order. The sampler's order itself is only established as far as the cuts and the draw
/// walk need it ([`Ranked`]), so a whole vocabulary is rarely sorted.
pub fn draw(params: &SamplingParams, candidates: Candidates, position: usize) -> Option<u32> {
    let mut ranked = match candidates {
        Candidates::All(all) => Ranked::new(all, true),
        Candidates::TopK(mut top) => {
            top.sort_unstable_by(by_logit);
            Ranked::new(top, false)
        }
    };
    let n = ranked.len();
    if n == 0 {
        return None;
    }
    let cuts = params.top_p < 1.0 || params.min_p > 0.0;
    let mut keep = n;
    if cuts {
        // Probabilities at temperature 1 over every candidate, in the list's order.
        let given = ranked.given();
        let max = given.iter().fold(f32::NEG_INFINITY, |m, c| m.max(c.1));
        let sum = sum_exp(given, |l| l - max);
        let prob = |l: f32| (exp_nonpositive((l - max) as f64) / sum) as f32;
        if params.top_p < 1.0 {
            let mut cum = 0.0f64;
            for i in 0..n {
                cum += prob(ranked.get(i).1) as f64;
                if cum >= params.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
        }
        if params.min_p > 0.0 {
            let threshold = prob(ranked.get(0).1) * params.min_p;
            let mut count = 0;
            while count < keep && prob(ranked.get(count).1) >= threshold {
                count += 1;
            }
            keep = count.max(1);
        }
    }
    // The final softmax at the temperature: over the kept prefix in the sampler's order
    // after a cut, else over the candidates as given.
    let scaled_sum = |list: &[(u32, f32)]| {
        let max = list
            .iter()
            .fold(f32::NEG_INFINITY, |m, c| m.max(c.1 / params.temperature));
        (max, sum_exp(list, |l| l / params.temperature - max))
    };
    let (max, sum) = if cuts {
        scaled_sum(ranked.prefix(keep))
    } else {
        scaled_sum(ranked.given())
    };
    let u = uniform(params.seed, position as u64);
    let mut cum = 0.0f64;
    for i in 0..keep {
        let c = ranked.get(i);
        let e = exp_nonpositive((c.1 / params.temperature - max) as f64);
        cum += (e / sum) as f32 as f64;
        if u < cum {
            return Some(c.0);
        }
    }
    Some(ranked.get(keep - 1).0)
}

/// Partial sums of [`sum_exp`]: candidate `i` goes to partial `i % SUM_LANES`.
const SUM_LANES: usize = 1024;

/// `Σ exp(arg(logit))` over `list` (each `arg` ≤ 0: a logit less the largest), in f64, in one
/// fixed order that needs no sort: partial `j` adds candidates `j, j + 1024, …` in turn, then
/// the partials are added pairwise, halving (`p[j] += p[j + 512]`, then `+ 256`, … down to
/// one): the order a 1024-thread GPU block reduces in. The exponentials are
/// [`exp_nonpositive`]'s, a block of 1024 at a time ([`exp_block`]: vector instructions
/// where the processor has them, the same bits).
fn sum_exp(list: &[(u32, f32)], arg: impl Fn(f32) -> f32) -> f64 {
    let mut partial = [0f64; SUM_LANES];
    let mut block = [0f64; SUM_LANES];
    for chunk in list.chunks(SUM_LANES) {
        let block = &mut block[..chunk.len()];
        for (b, c) in block.iter_mut().zip(chunk) {
            *b = arg(c.1) as f64;
        }
        exp_block(block);
        for (p, e) in partial.iter_mut().zip(block.iter()) {
            *p += *e;
        }
    }
    let mut half = SUM_LANES;
    while half > 1 {
        half /= 2;
        let (low, high) = partial.split_at_mut(half);
        for (a, b) in low.iter_mut().zip(&high[..half]) {
            *a += *b;
        }
    }
    partial[0]
}

/// `e^x` for `x ≤ 0` from IEEE additions and multiplications alone (no library call, no
/// fused multiply-add), so that a vector version ([`exp_block`]) gives the same bits: `x =
/// k·ln 2 + r` with `|r| ≤ ln 2 / 2` (Cody and Waite's two-part ln 2), `e^r` by its Taylor
/// series to degree 13 (truncation below 1e-17) in Horner's order, times `2^k`. Within 2 ulp
/// of the library's `exp`; 0 below -708 (where `e^x` is subnormal: nothing beside the largest
/// candidate's 1) and for NaN; positive `x` count as 0.
#[inline]
fn exp_nonpositive(x: f64) -> f64 {
    // NaN too.
    if x.is_nan() || x < EXP_MIN {
        return 0.0;
    }
    let x = if x > 0.0 { 0.0 } else { x };
    let t = x * std::f64::consts::LOG2_E + EXP_SHIFT;
    let k = t - EXP_SHIFT;
    let r = (x - k * LN2_HI) - k * LN2_LO;
    let mut p = EXP_TAYLOR[0];
    for c in &EXP_TAYLOR[1..] {
        p = p * r + c;
    }
    // 2^k from k's bits in t's mantissa (k in -1022..=0: a normal number).
    let k_bits = t.to_bits().wrapping_sub(EXP_SHIFT.to_bits());
    p * f64::from_bits(k_bits.wrapping_add(1023) << 52)
}

const EXP_MIN: f64 = -708.0;
/// 1.5 · 2^52: adding it rounds to an integer (kept in the low mantissa bits).
const EXP_SHIFT: f64 = 6_755_399_441_055_744.0;
/// ln 2's leading 32 bits (k · LN2_HI is exact) and the rest (fdlibm's `ln2_hi`, `ln2_lo`).
const LN2_HI: f64 = f64::from_bits(0x3FE6_2E42_FEE0_0000);
const LN2_LO: f64 = f64::from_bits(0x3DEA_39EF_3579_3C76);
/// 1/13!, 1/12!, …, 1/1!, 1/0!: Horner's coefficients of e^r.
const EXP_TAYLOR: [f64; 14] = [
    1.0 / 6_227_020_800.0,
    1.0 / 479_001_600.0,
    1.0 / 39_916_800.0,
    1.0 / 3_628_800.0,
    1.0 / 362_880.0,
    1.0 / 40_320.0,
    1.0 / 5_040.0,
    1.0 / 720.0,
    1.0 / 120.0,
    1.0 / 24.0,
    1.0 / 6.0,
    0.5,
    1.0,
    1.0,
];

/// [`exp_nonpositive`] of every value of `v`, in place: four at a time with AVX2 where the
/// processor has it (the same operations in the same order, so the same bits), else one by
/// one.
fn exp_block(v: &mut [f64]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is present (checked just above).
        unsafe { exp_block_avx2(v) };
        return;
    }
    for x in v.iter_mut() {
        *x = exp_nonpositive(*x);
    }
}

/// [`exp_block`] with AVX2: [`exp_nonpositive`] on four lanes, operation for operation.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn exp_block_avx2(v: &mut [f64]) {
    use std::arch::x86_64::*;
    let quads = v.len() / 4;
    let (min, zero) = (_mm256_set1_pd(EXP_MIN), _mm256_setzero_pd());
    let shift = _mm256_set1_pd(EXP_SHIFT);
    for q in 0..quads {
        let at = v.as_mut_ptr().add(4 * q);
        let x = _mm256_loadu_pd(at);
        // All ones where x >= -708 (false for NaN); those lanes keep their value.
        let kept = _mm256_cmp_pd::<_CMP_GE_OQ>(x, min);
        // min(x, 0): 0 for positive x (and -0.0 to 0.0, which gives the same 1 below).
        let x = _mm256_blendv_pd(min, _mm256_min_pd(x, zero), kept);
        let t = _mm256_add_pd(
            _mm256_mul_pd(x, _mm256_set1_pd(std::f64::consts::LOG2_E)),
            shift,
        );
        let k = _mm256_sub_pd(t, shift);
        let r = _mm256_sub_pd(
            _mm256_sub_pd(x, _mm256_mul_pd(k, _mm256_set1_pd(LN2_HI))),
            _mm256_mul_pd(k, _mm256_set1_pd(LN2_LO)),
        );
        let mut p = _mm256_set1_pd(EXP_TAYLOR[0]);
        for &c in &EXP_TAYLOR[1..] {
            p = _mm256_add_pd(_mm256_mul_pd(p, r), _mm256_set1_pd(c));
        }
        let k_bits = _mm256_sub_epi64(
            _mm256_castpd_si256(t),
            _mm256_set1_epi64x(EXP_SHIFT.to_bits() as i64),
        );
        let scale = _mm256_castsi256_pd(_mm256_slli_epi64::<52>(_mm256_add_epi64(
            k_bits,
            _mm256_set1_epi64x(1023),
        )));
        let e = _mm256_and_pd(_mm256_mul_pd(p, scale), kept);
        _mm256_storeu_pd(at, e);
    }
    for x in v[4 * quads..].iter_mut() {
        *x = exp_nonpositive(*x);
    }
}

/// Candidates put in the sampler's order ([`by_logit`]) lazily: a prefix is sorted only as
/// far as it is read, in growing steps (a selection, then a sort of what it selected), and
/// the whole rest at once (radix sort) when the prefix asked for is a large part of it.
struct Ranked {
    items: Vec<(u32, f32)>,
    /// The first `sorted` items are the first in the sampler's order, sorted.
    sorted: usize,
    /// Whether the unsorted rest is still in ascending id order (as given).
    rest_id_ordered: bool,
    /// Whether sorting has moved items from the order given.
    reordered: bool,
}

impl Ranked {
    /// `items` in ascending id order (`id_ordered`), or already sorted.
    fn new(items: Vec<(u32, f32)>, id_ordered: bool) -> Ranked {
        let sorted = if id_ordered { 0 } else { items.len() };
        Ranked {
            items,
            sorted,
            rest_id_ordered: id_ordered,
            reordered: false,
        }
    }

    fn len(&self) -> usize {
        self.items.len()
    }

    /// The candidates in the order they were given: valid only before the first
    /// [`Ranked::get`] or [`Ranked::prefix`] of an id-ordered list (which reorder it).
    fn given(&self) -> &[(u32, f32)] {
        debug_assert!(!self.reordered, "the given order was read after sorting");
        &self.items
    }

    /// Candidate `i` in the sampler's order (`i < len`).
    fn get(&mut self, i: usize) -> (u32, f32) {
        self.sort_through(i + 1);
        self.items[i]
    }

    /// The first `n` candidates in the sampler's order.
    fn prefix(&mut self, n: usize) -> &[(u32, f32)] {
        self.sort_through(n);
        &self.items[..n]
    }

    fn sort_through(&mut self, n: usize) {
        let len = self.items.len();
        if n <= self.sorted {
            return;
        }
        let start = self.sorted;
        let rest = &mut self.items[start..];
        let want = n.max(2 * start).max(64).min(len) - start;
        if want * 8 >= rest.len() {
            sort_by_logit(rest, self.rest_id_ordered);
            self.sorted = len;
        } else if let Some(front) = partition_above(rest, want) {
            sort_by_logit(&mut rest[..front], false);
            self.sorted = start + front;
        } else {
            rest.select_nth_unstable_by(want - 1, by_logit);
            rest[..want].sort_unstable_by(by_logit);
            self.sorted = start + want;
        }
        self.rest_id_ordered = false;
        self.reordered = true;
    }
}

/// A logit's bits as an unsigned key that orders as `total_cmp`.
fn monotone(l: f32) -> u32 {
    let b = l.to_bits();
    if b >> 31 == 1 {
        !b
    } else {
        b | 0x8000_0000
    }
}

/// Moves to the front of `items` every candidate whose logit is at or above a threshold
/// (by `total_cmp`) that at least `want` of them reach, and returns how many: those are the
/// first of `items` in the sampler's order, in some order. The threshold starts 4 below the
/// largest logit and moves down, doubling the distance, until enough pass (a count is one
/// comparison per candidate, cheaper than a selection); `None` when none of a few does (or
/// the largest logit is not finite).
fn partition_above(items: &mut [(u32, f32)], want: usize) -> Option<usize> {
    let top = items.iter().fold(f32::NEG_INFINITY, |m, c| m.max(c.1));
    if !top.is_finite() {
        return None;
    }
    let mut delta = 4.0f32;
    let threshold = loop {
        let key = monotone(top - delta);
        let count = items.iter().filter(|c| monotone(c.1) >= key).count();
        if count >= want {
            break key;
        }
        if delta >= 256.0 {
            return None;
        }
        delta *= 2.0;
    };
    let mut front = 0;
    for i in 0..items.len() {
        if monotone(items[i].1) >= threshold {
            items.swap(front, i);
            front += 1;
        }
    }
    Some(front)
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
    for (token, count) in penalty_counts(params, history) {
        if let Some(l) = logits.get_mut(token as usize) {
            *l = penalize(params, *l, count);
        }
    }
}

/// The tokens the penalties change, with their occurrences in the penalty window (distinct
/// tokens, in no particular order; none when no penalty is set).
pub fn penalty_counts(params: &SamplingParams, history: &[u32]) -> Vec<(u32, u32)> {
    if !params.has_penalties() {
        return Vec::new();
    }
    let window = &history[history.len().saturating_sub(params.penalty_last_n)..];
    let mut counts: HashMap<u32, u32> = HashMap::new();
    for &t in window {
        *counts.entry(t).or_default() += 1;
    }
    counts.into_iter().collect()
}

/// `logit` after the penalties for a token seen `count` times in the window (repetition:
/// positive logits divided, negative multiplied; then presence and frequency subtracted).
pub fn penalize(params: &SamplingParams, logit: f32, count: u32) -> f32 {
    let l = if logit > 0.0 {
        logit / params.repetition_penalty
    } else {
        logit * params.repetition_penalty
    };
    l - (params.presence_penalty + params.frequency_penalty * count as f32)
}

/// What a device selects for a top-k draw ([`TopKPlan::for_request`]).
#[derive(Clone, Debug, PartialEq)]
pub struct TopKPlan {
    /// How many of the row's largest raw logits to select: `top_k` and one per penalized token.
    pub count: usize,
    /// The penalized tokens within the vocabulary and their counts ([`penalty_counts`]):
    /// their raw logits are gathered too.
    pub penalized: Vec<(u32, u32)>,
}

impl TopKPlan {
    /// The selection a sampled top-k draw at `history` needs from a row of `vocab` logits, when
    /// a device selecting at most `max` can make it and it is smaller than the row; `None`
    /// when the row itself is needed (greedy, top-k off, or a selection as large as the row).
    pub fn for_request(
        params: &SamplingParams,
        history: &[u32],
        vocab: usize,
        max: usize,
    ) -> Option<TopKPlan> {
        if params.is_greedy() || params.top_k == 0 {
            return None;
        }
        let mut penalized = penalty_counts(params, history);
        penalized.retain(|p| (p.0 as usize) < vocab);
        let count = params.top_k.checked_add(penalized.len())?;
        (count <= max && count < vocab).then_some(TopKPlan { count, penalized })
    }
}

/// The candidates of a top-k draw from a device's selection, without the row: `top` holds the
/// row's `top_k + penalized.len()` largest raw logits (any order) and `raw` the raw logits
/// of the `penalized` tokens ([`penalty_counts`], ids within the vocabulary), in that order.
/// Returns the penalized row's top-k, exactly as [`sample`] selects it: every token outside
/// the top-k of the unpenalized tokens is below `top`'s last, and the penalized tokens
/// (whose logits the penalties may raise or lower) are all given.
pub fn penalized_top_k(
    params: &SamplingParams,
    top: &[(u32, f32)],
    penalized: &[(u32, u32)],
    raw: &[f32],
) -> Candidates {
    let is_penalized: std::collections::HashSet<u32> = penalized.iter().map(|p| p.0).collect();
    let mut merged: Vec<(u32, f32)> = top
        .iter()
        .filter(|c| !is_penalized.contains(&c.0))
        .copied()
        .collect();
    merged.extend(
        penalized
            .iter()
            .zip(raw)
            .map(|(&(id, count), &l)| (id, penalize(params, l, count))),
    );
    Candidates::TopK(top_k_of(merged, params.top_k))
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

    /// A small xorshift generator for the tests' random rows.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    /// A row with many ties (coarse values), a few very large or very small logits.
    fn random_row(rng: &mut Rng, vocab: usize) -> Vec<f32> {
        (0..vocab)
            .map(|_| match rng.below(50) {
                0 => f32::NEG_INFINITY,
                1 => 12.0 + rng.below(4) as f32,
                2 => -0.0,
                3 => 0.0,
                _ => (rng.below(96) as f32) * 0.125 - 6.0,
            })
            .collect()
    }

    #[test]
    fn a_device_top_k_selection_draws_as_the_whole_row() {
        let mut rng = Rng(0x5DEE_CE66);
        let mut compared = 0;
        for case in 0..600 {
            let vocab = [40, 300, 3000][case % 3];
            let row = random_row(&mut rng, vocab);
            let params = SamplingParams {
                temperature: [0.3, 0.8, 1.0, 1.7][rng.below(4)],
                top_k: [1, 2, 5, 40, 100, 290][rng.below(6)],
                top_p: [1.0, 0.95, 0.7, 0.3][rng.below(4)],
                min_p: [0.0, 0.0, 0.05, 0.3][rng.below(4)],
                repetition_penalty: [1.0, 1.3, 0.8][rng.below(3)],
                presence_penalty: [0.0, 0.7, -1.5][rng.below(3)],
                frequency_penalty: [0.0, 0.4, -0.6][rng.below(3)],
                penalty_last_n: [64, 8][rng.below(2)],
                seed: rng.next(),
            };
            // Histories with repeats, and ids past the vocabulary (which no penalty reaches).
            let history: Vec<u32> = (0..rng.below(80))
                .map(|_| rng.below(vocab + 5) as u32)
                .collect();
            let Some(plan) = TopKPlan::for_request(&params, &history, vocab, 256) else {
                continue;
            };
            // The device: the `count` largest raw logits in some order, and the gathered ones.
            let all: Vec<(u32, f32)> = row
                .iter()
                .enumerate()
                .map(|(i, &l)| (i as u32, l))
                .collect();
            let mut top = top_k_of(all, plan.count);
            top.reverse();
            let raw: Vec<f32> = plan.penalized.iter().map(|p| row[p.0 as usize]).collect();
            for position in [history.len(), history.len() + 17] {
                let want = sample(&params, &row, &history, position);
                let got = draw(
                    &params,
                    penalized_top_k(&params, &top, &plan.penalized, &raw),
                    position,
                );
                assert_eq!(got, Some(want), "case {case}: {params:?}");
                compared += 1;
            }
        }
        assert!(compared > 600, "{compared} draws compared");
    }

    #[test]
    fn plans_leave_the_row_to_the_host_when_a_selection_cannot_help() {
        let hot = SamplingParams {
            temperature: 0.8,
            top_k: 40,
            presence_penalty: 0.5,
            ..Default::default()
        };
        let plan = TopKPlan::for_request(&hot, &[3, 3, 9, 70_000], 1000, 256).unwrap();
        assert_eq!(plan.count, 42);
        let mut ids: Vec<(u32, u32)> = plan.penalized.clone();
        ids.sort();
        assert_eq!(ids, [(3, 2), (9, 1)]);
        assert!(TopKPlan::for_request(&hot, &[], 41, 256).is_some());
        assert!(
            TopKPlan::for_request(&hot, &[], 40, 256).is_none(),
            "not smaller"
        );
        assert!(
            TopKPlan::for_request(&hot, &[], 1000, 39).is_none(),
            "over the device's max"
        );
        let off = SamplingParams {
            top_k: 0,
            ..hot.clone()
        };
        assert!(TopKPlan::for_request(&off, &[], 1000, 256).is_none());
        let greedy = SamplingParams {
            temperature: 0.0,
            ..hot
        };
        assert!(TopKPlan::for_request(&greedy, &[], 1000, 256).is_none());
    }

    #[test]
    fn the_lazy_order_gives_the_sorted_prefixes() {
        let mut rng = Rng(77);
        for vocab in [10, 500, 20_000] {
            let row = random_row(&mut rng, vocab);
            let all: Vec<(u32, f32)> = row
                .iter()
                .enumerate()
                .map(|(i, &l)| (i as u32, l))
                .collect();
            let mut want = all.clone();
            want.sort_unstable_by(by_logit);
            let bits = |v: &[(u32, f32)]| -> Vec<(u32, u32)> {
                v.iter().map(|&(i, l)| (i, l.to_bits())).collect()
            };
            for steps in [
                vec![1, 2, 70, 71, vocab],
                vec![vocab / 3, vocab],
                vec![vocab],
            ] {
                let mut ranked = Ranked::new(all.clone(), true);
                for n in steps.into_iter().map(|n| n.clamp(1, vocab)) {
                    assert_eq!(
                        bits(ranked.prefix(n)),
                        bits(&want[..n]),
                        "vocab {vocab} n {n}"
                    );
                    assert_eq!(ranked.get(n - 1).0, want[n - 1].0);
                }
            }
        }
    }

    #[test]
    fn whole_rows_draw_from_the_nucleus_without_a_full_sort_of_the_answer() {
        // The nucleus of a peaked row is its few largest tokens: every draw lands there.
        let mut rng = Rng(5);
        let mut row = random_row(&mut rng, 10_000);
        for (i, l) in row.iter_mut().enumerate().take(10) {
            *l = 40.0 - i as f32;
        }
        let p = SamplingParams {
            temperature: 1.0,
            top_p: 0.9,
            seed: 9,
            ..Default::default()
        };
        for pos in 0..200 {
            assert!(sample(&p, &row, &[], pos) < 3);
        }
    }

    #[test]
    fn the_sum_adds_in_partials_then_halving() {
        let mut rng = Rng(17);
        let row = random_row(&mut rng, 70_777);
        let all: Vec<(u32, f32)> = row
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, l))
            .collect();
        let max = row.iter().fold(f32::NEG_INFINITY, |m, &l| m.max(l));
        // The same order by hand: partial j over j, j + 1024, …, then halving.
        let mut partial = [0f64; SUM_LANES];
        for (i, c) in all.iter().enumerate() {
            partial[i % SUM_LANES] += exp_nonpositive((c.1 - max) as f64);
        }
        let mut half = SUM_LANES;
        while half > 1 {
            half /= 2;
            for j in 0..half {
                partial[j] += partial[j + half];
            }
        }
        assert_eq!(sum_exp(&all, |l| l - max).to_bits(), partial[0].to_bits());
        let short = &all[..3000];
        let mut partial = [0f64; SUM_LANES];
        for (i, c) in short.iter().enumerate() {
            partial[i % SUM_LANES] += exp_nonpositive((c.1 - max) as f64);
        }
        let plain = sum_exp(short, |l| l - max);
        assert!((plain - partial.iter().sum::<f64>()).abs() < 1e-9 * plain);
    }

    #[test]
    fn the_sampler_exponential_is_the_library_one_within_two_ulp_and_the_same_in_blocks() {
        let mut rng = Rng(3);
        let mut worst = 0u64;
        let mut xs = Vec::new();
        for i in 0..200_000 {
            let x = match i % 4 {
                0 => -(rng.below(1 << 20) as f64) / (1 << 20) as f64,
                1 => -(rng.below(708 << 20) as f64) / (1 << 20) as f64,
                2 => -((rng.next() >> 11) as f64) / (1u64 << 53) as f64 * 708.0,
                _ => -(rng.below(100) as f64) * 0.125,
            };
            let (got, want) = (exp_nonpositive(x), x.exp());
            worst = worst.max(got.to_bits().abs_diff(want.to_bits()));
            xs.push(x);
        }
        assert!(worst <= 2, "{worst} ulp");
        let specials = [
            0.0,
            -0.0,
            1.5,
            -708.0,
            -708.5,
            -800.0,
            f64::NAN,
            f64::NEG_INFINITY,
        ];
        for (&x, want) in specials
            .iter()
            .zip([1.0, 1.0, 1.0, -1.0, 0.0, 0.0, 0.0, 0.0])
        {
            if want >= 0.0 {
                assert_eq!(exp_nonpositive(x), want, "{x}");
            }
        }
        // Blocks (vector instructions where present) give the scalar bits, tails included.
        xs.extend(specials);
        for len in [xs.len(), 1027, 3] {
            let mut block = xs[..len].to_vec();
            exp_block(&mut block);
            for (x, e) in xs.iter().zip(&block) {
                assert_eq!(e.to_bits(), exp_nonpositive(*x).to_bits(), "{x}");
            }
        }
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
