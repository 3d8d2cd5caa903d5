//! Prefix cache shared by the sessions of one model: snapshots of model states keyed by the
//! tokens they hold, so a new prompt starts from the longest cached prefix and prefills only
//! the rest. Attention-only states can be cut back to any shorter prefix; a hybrid model's
//! recurrent (Gated DeltaNet + conv) state cannot be rewound, so for those the cache stores
//! snapshots at block boundaries of the prompt, at the prompt's end and after the answer, and
//! only an entry whose whole token list prefixes the prompt is usable. A byte budget bounds the
//! snapshots; the least recently used go first.

use std::sync::Mutex;
use std::time::Instant;

use super::session::{EngineError, FinishReason, Flow, GenerateOptions, Generation, Session};
use super::stats::GenerationStats;
use crate::model::{LayerState, ModelState};

/// Default snapshot spacing for recurrent states, in prompt tokens.
pub const DEFAULT_BLOCK: usize = 256;

/// Prefill block (tokens) between cancellation checks for attention-only models.
const PREFILL_BLOCK: usize = 512;

/// Snapshots of model states, keyed by token prefix, under a byte budget with LRU eviction.
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
    state: ModelState,
    bytes: usize,
    last_used: u64,
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

/// Bytes a state holds (KV rows, recurrent and conv states).
pub fn state_bytes(state: &ModelState) -> usize {
    state
        .layers
        .iter()
        .map(|l| match l {
            LayerState::Kv(c) => 2 * c.len() * c.kv_dim() * 4,
            LayerState::Gdn(g) => (g.conv.len() + g.ssm.len()) * 4,
        })
        .sum()
}

/// Whether a state can be cut back to a shorter prefix (every layer is attention).
pub fn is_rewindable(state: &ModelState) -> bool {
    state.layers.iter().all(|l| matches!(l, LayerState::Kv(_)))
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl PrefixCache {
    /// A cache holding at most `budget_bytes` of snapshots; recurrent states are snapshotted
    /// every `block` prompt tokens (at least 1).
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

    /// How many tokens of `prompt` (at most `limit`) an entry can supply.
    fn usable(entry: &Entry, prompt: &[u32], limit: usize) -> usize {
        let common = common_prefix(&entry.tokens, prompt).min(limit);
        if common == entry.tokens.len() || is_rewindable(&entry.state) {
            common
        } else {
            0
        }
    }

    /// The state of the longest cached prefix of `prompt` of at most `limit` tokens, if it is
    /// longer than `better_than`: its length and a copy of the state holding exactly it.
    pub fn lookup(
        &mut self,
        prompt: &[u32],
        limit: usize,
        better_than: usize,
    ) -> Option<(usize, ModelState)> {
        self.lookups += 1;
        let (index, len) = self
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| (i, Self::usable(e, prompt, limit)))
            .max_by_key(|&(i, len)| (len, self.entries[i].last_used))?;
        if len <= better_than || len == 0 {
            return None;
        }
        self.clock += 1;
        self.hits += 1;
        let entry = &mut self.entries[index];
        entry.last_used = self.clock;
        let mut state = entry.state.clone();
        if state.len() > len && !state.truncate(len) {
            return None;
        }
        Some((len, state))
    }

    /// Whether a snapshot of `bytes` would be kept at all.
    pub fn fits(&self, bytes: usize) -> bool {
        bytes > 0 && bytes <= self.budget
    }

    /// Whether an entry with exactly these tokens exists (marks it used).
    pub fn touch(&mut self, tokens: &[u32]) -> bool {
        self.clock += 1;
        let clock = self.clock;
        match self.entries.iter_mut().find(|e| e.tokens == tokens) {
            Some(e) => {
                e.last_used = clock;
                true
            }
            None => false,
        }
    }

    /// Stores `state`, which holds exactly `tokens`, evicting least recently used entries to
    /// stay within the budget. Entries it makes redundant (a rewindable prefix of it) go.
    pub fn insert(&mut self, tokens: Vec<u32>, state: ModelState) {
        let bytes = state_bytes(&state);
        if tokens.is_empty() || tokens.len() != state.len() || !self.fits(bytes) {
            return;
        }
        if self.touch(&tokens) {
            return;
        }
        if is_rewindable(&state) {
            let mut freed = 0;
            self.entries.retain(|e| {
                let redundant = e.tokens.len() < tokens.len()
                    && is_rewindable(&e.state)
                    && tokens.starts_with(&e.tokens);
                if redundant {
                    freed += e.bytes;
                }
                !redundant
            });
            self.used -= freed;
        }
        self.clock += 1;
        self.used += bytes;
        self.entries.push(Entry {
            tokens,
            state,
            bytes,
            last_used: self.clock,
        });
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
    /// or in `cache`, and leaving snapshots of this prompt's prefixes (and of the conversation
    /// after the answer) in `cache` for later requests. Without a cache, the session starts
    /// over, so that all of the prompt is computed. `stats.cached_tokens` counts the reuse.
    pub fn generate_cached(
        &mut self,
        cache: Option<&Mutex<PrefixCache>>,
        prompt: &[u32],
        options: &GenerateOptions,
        on_token: &mut dyn FnMut(u32) -> Flow,
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
        on_token: &mut dyn FnMut(u32) -> Flow,
    ) -> Result<Generation, EngineError> {
        options.sampling.validate()?;
        if prompt.is_empty() || prompt.len() >= self.ctx_size() {
            // `generate` reports these.
            return self.generate(prompt, options, on_token);
        }
        let start = Instant::now();
        // The last prompt token is always computed by `generate`: it yields the first logits.
        let limit = prompt.len() - 1;
        let rewindable = is_rewindable(&self.state);
        match cache {
            Some(cache) => self.restore_prefix(cache, prompt, limit, rewindable),
            None => self.reset(),
        }
        let reused = self.tokens.len();

        // Prefill up to `limit` in blocks; recurrent states are snapshotted at block ends.
        let block = match cache {
            Some(c) if !rewindable => lock(c).block(),
            _ => PREFILL_BLOCK,
        };
        let mut pos = reused;
        while pos < limit {
            if cancelled() {
                let elapsed = start.elapsed();
                return Ok(Generation {
                    tokens: Vec::new(),
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
            self.model
                .forward_hidden(&mut self.state, &prompt[pos..next])?;
            self.tokens.extend_from_slice(&prompt[pos..next]);
            pos = next;
            if let Some(c) = cache.filter(|_| !rewindable) {
                self.snapshot(c);
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
            self.snapshot(c);
        }
        Ok(generation)
    }

    /// Starts from the longest usable prefix of `prompt` (at most `limit` tokens): this
    /// session's own, or a copy of the cache's if that is longer.
    fn restore_prefix(
        &mut self,
        cache: &Mutex<PrefixCache>,
        prompt: &[u32],
        limit: usize,
        rewindable: bool,
    ) {
        let common = common_prefix(&self.tokens, prompt).min(limit);
        let own = if common == self.tokens.len() || rewindable {
            common
        } else {
            0
        };
        let found = lock(cache).lookup(prompt, limit, own);
        match found {
            Some((len, mut state)) => {
                state.max_len = self.state.max_len;
                self.state = state;
                self.tokens = prompt[..len].to_vec();
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
    }

    /// Puts a copy of the current state into `cache` (if it fits and is new).
    fn snapshot(&self, cache: &Mutex<PrefixCache>) {
        let bytes = state_bytes(&self.state);
        {
            let mut c = lock(cache);
            if !c.fits(bytes) || c.touch(&self.tokens) {
                return;
            }
        }
        let state = self.state.clone();
        lock(cache).insert(self.tokens.clone(), state);
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
            sampling: SamplingParams::default(),
            max_tokens,
            stop_tokens: Vec::new(),
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
        let per_token = state_bytes(&s.state) / s.tokens.len();
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
