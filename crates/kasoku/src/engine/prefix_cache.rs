//! Prefix cache shared by the sessions of one model: model states keyed by the tokens they
//! hold, so a new prompt starts from the longest cached prefix and prefills only the rest.
//!
//! An entry keeps the whole state after a request (prompt and answer). Attention KV caches can
//! be cut back to any shorter prefix; a hybrid model's recurrent layers (Gated DeltaNet +
//! conv state) cannot be rewound, so an entry of such a model also keeps *checkpoints*: copies
//! of only the recurrent layers' states at block boundaries of the prompt (every `block`
//! tokens), at the prompt's end and where its prefix was restored from. A prefix is usable up
//! to the longest checkpoint inside it (KV truncated, recurrent layers replaced). A byte budget
//! bounds all entries; the least recently used go first.

use std::sync::Mutex;
use std::time::Instant;

use super::session::{
    Emitted, EngineError, FinishReason, Flow, GenerateOptions, Generation, Session,
};
use super::stats::GenerationStats;
use crate::model::{Batch, Checkpoint, Logits, ModelState};
use crate::spec::Features;

/// Default checkpoint spacing for recurrent states, in prompt tokens.
pub const DEFAULT_BLOCK: usize = 256;

/// Prefill block (tokens) between cancellation checks for attention-only models.
const PREFILL_BLOCK: usize = 512;

/// Model states keyed by token prefix, under a byte budget with LRU eviction.
#[derive(Debug)]
pub struct PrefixCache {
    budget: usize,
    block: usize,
    used: usize,
    clock: u64,
    entries: Vec<Entry>,
    hits: u64,
    lookups: u64,
}

#[derive(Debug)]
struct Entry {
    tokens: Vec<u32>,
    /// Holds exactly `tokens`.
    state: ModelState,
    /// Recurrent-layer states at shorter lengths, ascending (hybrid models only).
    checkpoints: Vec<Checkpoint>,
    bytes: usize,
    last_used: u64,
}

/// A prefix taken from the cache.
#[derive(Debug)]
pub struct Restored {
    /// Tokens of the prompt it holds.
    pub len: usize,
    /// The state holding exactly those tokens.
    pub state: ModelState,
    /// The entry's checkpoints up to `len`, to carry into the next entry.
    pub checkpoints: Vec<Checkpoint>,
}

/// Counters of a cache, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefixCacheStats {
    pub entries: usize,
    pub bytes: usize,
    pub budget: usize,
    pub lookups: u64,
    pub hits: u64,
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Cuts `state` back to `len` tokens: to `checkpoint` when it is at `len` (a hybrid model's
/// recurrent layers), else by truncation (attention-only models).
fn rewind(state: &mut ModelState, len: usize, checkpoint: Option<&Checkpoint>) -> bool {
    if len == state.len() {
        return true;
    }
    match checkpoint {
        Some(cp) if cp.len() == len => state.restore(cp),
        _ => state.truncate(len),
    }
}

impl Entry {
    /// How many tokens of `prompt` (at most `limit`) this entry can supply.
    fn usable(&self, prompt: &[u32], limit: usize) -> usize {
        let common = common_prefix(&self.tokens, prompt).min(limit);
        if common == self.tokens.len() || self.state.is_rewindable() {
            return common;
        }
        self.checkpoints
            .iter()
            .map(|c| c.len())
            .filter(|&l| l <= common)
            .max()
            .unwrap_or(0)
    }

    fn has_prefix_at(&self, len: usize) -> bool {
        len == self.tokens.len()
            || self.state.is_rewindable()
            || self.checkpoints.iter().any(|c| c.len() == len)
    }
}

impl PrefixCache {
    /// A cache holding at most `budget_bytes`; recurrent states are checkpointed every `block`
    /// prompt tokens (at least 1).
    pub fn new(budget_bytes: usize, block: usize) -> PrefixCache {
        PrefixCache {
            budget: budget_bytes,
            block: block.max(1),
            used: 0,
            clock: 0,
            entries: Vec::new(),
            hits: 0,
            lookups: 0,
        }
    }

    pub fn block(&self) -> usize {
        self.block
    }

    pub fn stats(&self) -> PrefixCacheStats {
        PrefixCacheStats {
            entries: self.entries.len(),
            bytes: self.used,
            budget: self.budget,
            lookups: self.lookups,
            hits: self.hits,
        }
    }

    pub fn clear(&mut self) {
        self.entries.clear();
        self.used = 0;
    }

    /// The longest cached prefix of `prompt` of at most `limit` tokens, if it is longer than
    /// `better_than`: a copy of the state holding exactly it.
    pub fn lookup(&mut self, prompt: &[u32], limit: usize, better_than: usize) -> Option<Restored> {
        self.lookups += 1;
        let (index, len) = self
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| (i, e.usable(prompt, limit)))
            .max_by_key(|&(i, len)| (len, self.entries[i].last_used))?;
        if len <= better_than || len == 0 {
            return None;
        }
        self.clock += 1;
        let entry = &mut self.entries[index];
        entry.last_used = self.clock;
        let mut state = entry.state.fork();
        let checkpoint = entry.checkpoints.iter().find(|c| c.len() == len);
        if !rewind(&mut state, len, checkpoint) {
            return None;
        }
        self.hits += 1;
        let checkpoints = entry
            .checkpoints
            .iter()
            .filter(|c| c.len() <= len)
            .cloned()
            .collect();
        Some(Restored {
            len,
            state,
            checkpoints,
        })
    }

    /// Whether an entry of `bytes` would be kept at all.
    pub fn fits(&self, bytes: usize) -> bool {
        bytes > 0 && bytes <= self.budget
    }

    /// Stores `state`, which holds exactly `tokens`, with recurrent checkpoints at shorter
    /// lengths (empty for attention-only models), evicting least recently used entries to stay
    /// within the budget. Entries it makes redundant (a prefix it can restore as well) go.
    pub fn insert(
        &mut self,
        tokens: Vec<u32>,
        state: ModelState,
        mut checkpoints: Vec<Checkpoint>,
    ) {
        checkpoints.retain(|c| !c.is_empty() && c.len() < tokens.len());
        checkpoints.sort_by_key(|c| c.len());
        checkpoints.dedup_by_key(|c| c.len());
        let bytes = state.bytes() + checkpoints.iter().map(Checkpoint::bytes).sum::<usize>();
        if tokens.is_empty() || tokens.len() != state.len() || !self.fits(bytes) {
            return;
        }
        self.clock += 1;
        if let Some(e) = self.entries.iter_mut().find(|e| e.tokens == tokens) {
            e.last_used = self.clock;
            return;
        }
        let new = Entry {
            tokens,
            state,
            checkpoints,
            bytes,
            last_used: self.clock,
        };
        let mut freed = 0;
        self.entries.retain(|e| {
            let redundant = e.tokens.len() < new.tokens.len()
                && new.tokens.starts_with(&e.tokens)
                && new.has_prefix_at(e.tokens.len())
                && e.checkpoints.iter().all(|c| new.has_prefix_at(c.len()));
            if redundant {
                freed += e.bytes;
            }
            !redundant
        });
        self.used -= freed;
        self.used += bytes;
        self.entries.push(new);
        while self.used > self.budget {
            let Some(oldest) = self
                .entries
                .iter()
                .enumerate()
                .min_by_key(|(_, e)| e.last_used)
                .map(|(i, _)| i)
            else {
                break;
            };
            let e = self.entries.swap_remove(oldest);
            self.used -= e.bytes;
        }
    }
}

impl Session {
    /// Like [`Session::generate`], reusing the longest prefix of `prompt` found in this session
    /// or in `cache`, and leaving this request's state (with recurrent checkpoints along the
    /// prompt) in `cache` for later requests. Without a cache, the session starts over, so
    /// that all of the prompt is computed. `stats.cached_tokens` counts the reuse.
    pub fn generate_cached(
        &mut self,
        cache: Option<&Mutex<PrefixCache>>,
        prompt: &[u32],
        options: &GenerateOptions,
        on_token: &mut dyn FnMut(Emitted) -> Flow,
    ) -> Result<Generation, EngineError> {
        self.generate_cached_until(cache, prompt, options, &|| false, on_token)
    }

    /// [`Session::generate_cached`] that also asks `cancelled` between blocks of the prefill,
    /// so that a long prompt is not computed for a client that has gone: then the generation
    /// ends at once with no tokens and finish reason `Stop`.
    pub fn generate_cached_until(
        &mut self,
        cache: Option<&Mutex<PrefixCache>>,
        prompt: &[u32],
        options: &GenerateOptions,
        cancelled: &dyn Fn() -> bool,
        on_token: &mut dyn FnMut(Emitted) -> Flow,
    ) -> Result<Generation, EngineError> {
        options.validate()?;
        if prompt.is_empty() || prompt.len() >= self.ctx_size() {
            // `generate` reports these.
            return self.generate(prompt, options, on_token);
        }
        let start = Instant::now();
        // The last prompt token is always computed by `generate`: it yields the first logits.
        let limit = prompt.len() - 1;
        let rewindable = self.state.is_rewindable();
        let mut checkpoints = match cache {
            Some(cache) => self.restore_prefix(cache, prompt, limit, rewindable),
            None => {
                self.reset();
                Vec::new()
            }
        };
        let reused = self.tokens.len();
        let checkpointing = cache.is_some() && !rewindable;
        if checkpointing && reused > 0 && !checkpoints.iter().any(|c| c.len() == reused) {
            checkpoints.push(self.state.checkpoint());
        }

        // Prefill up to `limit` in blocks; recurrent states are checkpointed at block ends.
        let block = match cache {
            Some(c) if !rewindable => lock(c).block(),
            _ => PREFILL_BLOCK,
        };
        // A drafter that keeps the target's layer outputs (DFlash) is handed each block's as
        // it is computed, so it holds the whole prompt's and not just the last token's.
        let (hidden, taps) = self
            .spec
            .as_ref()
            .filter(|s| !s.drafter.tap_layers().is_empty())
            .map_or((false, Vec::new()), |s| {
                (s.drafter.wants_hidden(), s.drafter.tap_layers())
            });
        let mut pos = reused;
        while pos < limit {
            if cancelled() {
                if let Some(c) = cache {
                    self.store(c, checkpoints);
                }
                let elapsed = start.elapsed();
                return Ok(Generation {
                    tokens: Vec::new(),
                    logprobs: Vec::new(),
                    finish: FinishReason::Stop,
                    stats: GenerationStats {
                        cached_tokens: reused,
                        prompt_tokens: pos - reused,
                        prefill_time: elapsed,
                        total_time: elapsed,
                        ..Default::default()
                    },
                });
            }
            let next = ((pos / block + 1) * block).min(limit);
            let batch = Batch::chain(&prompt[pos..next])
                .logits(Logits::None)
                .hidden(hidden)
                .taps(&taps);
            self.model.run(&mut self.state, &batch, &mut self.out)?;
            self.tokens.extend_from_slice(&prompt[pos..next]);
            if let (false, Some(spec)) = (taps.is_empty(), self.spec.as_mut()) {
                let features = Features {
                    hidden: hidden.then_some(&self.out.hidden[..]),
                    taps: Some(&self.out.taps[..]),
                    device_taps: None,
                };
                spec.drafter.start(&prompt[..next], features)?;
            }
            pos = next;
            if checkpointing {
                checkpoints.push(self.state.checkpoint());
            }
        }
        let own_prefill = start.elapsed();

        let mut generation = self.generate(prompt, options, on_token)?;
        let stats = &mut generation.stats;
        stats.cached_tokens = reused;
        stats.prompt_tokens = prompt.len() - reused;
        stats.prefill_time += own_prefill;
        stats.time_to_first_token += own_prefill;
        stats.total_time += own_prefill;
        if let Some(c) = cache {
            self.store(c, checkpoints);
        }
        Ok(generation)
    }

    /// Starts from the longest usable prefix of `prompt` (at most `limit` tokens): this
    /// session's own, or a copy of the cache's if that is longer. Returns the checkpoints that
    /// came with it.
    fn restore_prefix(
        &mut self,
        cache: &Mutex<PrefixCache>,
        prompt: &[u32],
        limit: usize,
        rewindable: bool,
    ) -> Vec<Checkpoint> {
        let common = common_prefix(&self.tokens, prompt).min(limit);
        let own = if common == self.tokens.len() || rewindable {
            common
        } else {
            0
        };
        let found = lock(cache).lookup(prompt, limit, own);
        match found {
            Some(mut r) => {
                // The entry may come from a session of another context size.
                if r.state.set_max_len(self.ctx_size()) {
                    self.state = r.state;
                    self.tokens = prompt[..r.len].to_vec();
                    return r.checkpoints;
                }
                self.reset();
            }
            None if own < self.tokens.len() => {
                if own > 0 && self.state.truncate(own) {
                    self.tokens.truncate(own);
                } else {
                    self.reset();
                }
            }
            None => {}
        }
        Vec::new()
    }

    /// Puts a copy of the current state into `cache` (if it fits and is new).
    fn store(&self, cache: &Mutex<PrefixCache>, checkpoints: Vec<Checkpoint>) {
        let bytes = self.state.bytes();
        if !lock(cache).fits(bytes) {
            return;
        }
        let state = self.state.clone();
        lock(cache).insert(self.tokens.clone(), state, checkpoints);
    }
}

/// The cache stays usable even if a thread panicked while holding it.
fn lock(cache: &Mutex<PrefixCache>) -> std::sync::MutexGuard<'_, PrefixCache> {
    cache.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::sync::Arc;

    use super::*;
    use crate::engine::SamplingParams;
    use crate::model::Model;

    fn fixture(rel: &str) -> Arc<Model> {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures")
            .join(rel);
        Arc::new(Model::load(path).unwrap())
    }

    fn greedy(max_tokens: usize) -> GenerateOptions {
        GenerateOptions {
            logprobs: None,
            sampling: SamplingParams::default(),
            max_tokens,
            stop_tokens: Vec::new(),
            constraint: None,
        }
    }

    fn prompt(len: usize, salt: u32) -> Vec<u32> {
        (0..len as u32).map(|i| 3 + (i * 7 + salt) % 90).collect()
    }

    fn run(session: &mut Session, cache: Option<&Mutex<PrefixCache>>, p: &[u32]) -> Generation {
        session
            .generate_cached(cache, p, &greedy(6), &mut |_| Flow::Continue)
            .unwrap()
    }

    #[test]
    fn shared_prefixes_are_reused_and_answers_match_a_fresh_session() {
        for (fixture_path, hybrid) in [
            ("llama/tiny/model-f32.gguf", false),
            ("qwen3_5/tiny/model-f32.gguf", true),
        ] {
            let model = fixture(fixture_path);
            let cache = Mutex::new(PrefixCache::new(64 << 20, 16));
            let a = prompt(50, 0);
            let mut b = a[..40].to_vec();
            b.extend(prompt(9, 5));
            // Two sessions: the second finds the first's work only through the cache.
            let mut s1 = Session::new(Arc::clone(&model), 128);
            let mut s2 = Session::new(Arc::clone(&model), 128);
            let first = run(&mut s1, Some(&cache), &a);
            assert_eq!(first.stats.cached_tokens, 0);
            if hybrid {
                // One entry: the whole state once, plus the recurrent layers at 16, 32, 48, 49.
                let st = lock(&cache).stats();
                let whole = s1.state.bytes();
                assert_eq!(st.entries, 1);
                let recurrent = s1.state.checkpoint().bytes();
                assert_eq!(st.bytes, whole + 4 * recurrent);
            }
            let second = run(&mut s2, Some(&cache), &b);
            // Hybrid: the last block boundary inside the shared 40 tokens; attention: all 40.
            let expect = if hybrid { 32 } else { 40 };
            assert_eq!(second.stats.cached_tokens, expect, "{fixture_path}");
            assert_eq!(second.stats.prompt_tokens, b.len() - expect);
            let fresh = run(&mut Session::new(Arc::clone(&model), 128), None, &b);
            assert_eq!(second.tokens, fresh.tokens, "{fixture_path}");
            // The same prompt again: all but its last token come from the cache.
            let again = run(&mut s2, Some(&cache), &a);
            assert_eq!(again.stats.cached_tokens, a.len() - 1, "{fixture_path}");
            assert_eq!(again.tokens, first.tokens, "{fixture_path}");
            // A follow-up turn continues from the snapshot taken after the answer.
            let mut turn = a.clone();
            turn.extend(&first.tokens);
            turn.extend([9, 8, 7]);
            let follow = run(
                &mut Session::new(Arc::clone(&model), 128),
                Some(&cache),
                &turn,
            );
            assert!(
                follow.stats.cached_tokens >= a.len(),
                "{fixture_path}: {}",
                follow.stats.cached_tokens
            );
            let fresh = run(&mut Session::new(Arc::clone(&model), 128), None, &turn);
            assert_eq!(follow.tokens, fresh.tokens, "{fixture_path}");
            // One entry per conversation: the follow-up replaced the first turn's entry, whose
            // prefixes (checkpoints included) it can restore as well.
            assert_eq!(lock(&cache).stats().entries, 2, "{fixture_path}");
        }
    }

    #[test]
    fn a_cancelled_prefill_stops_between_blocks() {
        let model = fixture("qwen3_5/tiny/model-f32.gguf");
        let cache = Mutex::new(PrefixCache::new(64 << 20, 16));
        let mut s = Session::new(Arc::clone(&model), 128);
        let checks = std::cell::Cell::new(0);
        let cancel_on_third = || {
            checks.set(checks.get() + 1);
            checks.get() >= 3
        };
        let g = s
            .generate_cached_until(
                Some(&cache),
                &prompt(60, 2),
                &greedy(6),
                &cancel_on_third,
                &mut |_| Flow::Continue,
            )
            .unwrap();
        assert!(g.tokens.is_empty());
        assert_eq!(g.finish, FinishReason::Stop);
        assert_eq!(g.stats.prompt_tokens, 32, "two 16-token blocks computed");
        // What was computed is cached.
        let again = run(&mut Session::new(model, 128), Some(&cache), &prompt(60, 2));
        assert_eq!(again.stats.cached_tokens, 32);
    }

    #[test]
    fn without_a_cache_everything_is_recomputed() {
        let model = fixture("llama/tiny/model-f32.gguf");
        let mut s = Session::new(model, 128);
        let a = prompt(30, 1);
        run(&mut s, None, &a);
        let again = run(&mut s, None, &a);
        assert_eq!(again.stats.cached_tokens, 0);
        assert_eq!(again.stats.prompt_tokens, a.len());
    }

    #[test]
    fn the_budget_evicts_least_recently_used_entries() {
        let model = fixture("llama/tiny/model-f32.gguf");
        let mut s = Session::new(Arc::clone(&model), 128);
        let probe = run(&mut s, None, &prompt(20, 0));
        let per_token = s.state.bytes() / s.tokens.len();
        drop(probe);
        // Room for about two 26-token snapshots.
        let cache = Mutex::new(PrefixCache::new(per_token * 55, 16));
        let prompts: Vec<Vec<u32>> = (0..3).map(|i| prompt(20, 11 * i + 1)).collect();
        for p in &prompts[..2] {
            run(&mut Session::new(Arc::clone(&model), 128), Some(&cache), p);
        }
        assert_eq!(lock(&cache).stats().entries, 2);
        // Use the first again, then add a third: the second (least recent) goes.
        let hit = run(
            &mut Session::new(Arc::clone(&model), 128),
            Some(&cache),
            &prompts[0],
        );
        assert_eq!(hit.stats.cached_tokens, 19);
        run(
            &mut Session::new(Arc::clone(&model), 128),
            Some(&cache),
            &prompts[2],
        );
        let stats = lock(&cache).stats();
        assert!(stats.bytes <= stats.budget);
        let hit = run(
            &mut Session::new(Arc::clone(&model), 128),
            Some(&cache),
            &prompts[0],
        );
        assert_eq!(hit.stats.cached_tokens, 19);
        let miss = run(
            &mut Session::new(Arc::clone(&model), 128),
            Some(&cache),
            &prompts[1],
        );
        assert_eq!(miss.stats.cached_tokens, 0);
    }
}
