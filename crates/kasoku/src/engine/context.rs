//! How many tokens a session's context holds: the model's own context unless memory says
//! otherwise, checked when the model is loaded, before anything is served.
//!
//! KV caches grow as they fill, so nothing is reserved up front; the check is that the
//! sessions could all fill their contexts (and the prefix cache its budget), next to the
//! weights and one pass's scratch, within the memory available. Planned before loading
//! (`LoadedModel::load_within`), the weights are counted from the checkpoint's
//! `model::Footprint`, so a model that cannot fit is refused before anything is packed;
//! planned after loading, `MemAvailable` already excludes them. A context asked for explicitly that cannot fit is
//! refused with the numbers; a default one is shortened to what fits, with a note saying so.
//! Prompts longer than the context are refused where they arrive, never cut.

use crate::model::KvType;

/// A default context is never shortened below this many tokens (below, it is refused).
pub const MIN_DEFAULT_CONTEXT: usize = 2048;
/// A shortened default context is a multiple of this.
const ROUND: usize = 1024;
/// The share of the available memory the KV caches and prefix cache may plan for (the rest
/// is left for scratch buffers and the rest of the machine).
const USABLE_PERCENT: u64 = 90;

/// What the context is planned against.
#[derive(Clone, Debug)]
pub struct ContextRequest {
    /// `--ctx-size`, when given.
    pub requested: Option<usize>,
    /// The model's own context length.
    pub model_max: usize,
    /// KV cache bytes per token of one session (target model, and a draft model's if any).
    pub kv_bytes_per_token: usize,
    /// The cache type, for messages.
    pub kv_type: KvType,
    /// Sessions that may each fill a context at once.
    pub sessions: usize,
    /// Other memory to plan for (the prefix cache's budget).
    pub other_bytes: u64,
    /// Weights still to be allocated: a [`crate::model::Footprint`]'s when planning before
    /// loading, 0 once they are loaded (`available` then excludes them).
    pub weight_bytes: u64,
    /// One pass's scratch ([`crate::model::Footprint::scratch_bytes`]).
    pub scratch_bytes: u64,
    /// Memory available (`MemAvailable`), or `None` when unknown (then nothing is checked).
    pub available: Option<u64>,
}

/// The chosen context.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContextPlan {
    /// Tokens each session holds, prompt and answer together.
    pub tokens: usize,
    /// Why it is not the model's own (a default shortened for memory), to tell the user.
    pub note: Option<String>,
}

/// A context that cannot be served.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct ContextError(pub String);

impl ContextRequest {
    /// Memory planned whatever the context: weights, scratch, prefix cache.
    fn fixed_bytes(&self) -> u64 {
        self.weight_bytes
            .saturating_add(self.scratch_bytes)
            .saturating_add(self.other_bytes)
    }

    /// The bytes `tokens` of context need: every session's KV cache full, and the rest.
    pub fn bytes_for(&self, tokens: usize) -> u64 {
        (self.sessions.max(1) as u64)
            .saturating_mul(tokens as u64)
            .saturating_mul(self.kv_bytes_per_token as u64)
            .saturating_add(self.fixed_bytes())
    }

    /// Chooses the context (see the module documentation).
    pub fn plan(&self) -> Result<ContextPlan, ContextError> {
        let plain = |tokens| ContextPlan { tokens, note: None };
        let want = self.requested.unwrap_or(self.model_max).max(1);
        let Some(available) = self.available else {
            return Ok(plain(want));
        };
        let usable = available / 100 * USABLE_PERCENT;
        if self.bytes_for(want) <= usable {
            return Ok(plain(want));
        }
        let per_context = (self.sessions.max(1) as u64) * self.kv_bytes_per_token.max(1) as u64;
        let fits = usable.saturating_sub(self.fixed_bytes()) / per_context;
        let fits = (fits as usize) / ROUND * ROUND;
        let mut rest = String::new();
        for (bytes, what) in [
            (self.weight_bytes, "weights"),
            (self.scratch_bytes, "scratch"),
            (self.other_bytes, "prefix cache"),
        ] {
            if bytes > 0 {
                rest.push_str(&format!(" plus {} of {what}", gib(bytes)));
            }
        }
        let why = format!(
            "a context of {want} tokens needs {} of KV cache ({} per token in {} × {want} tokens \
             × {} session(s)){rest}, but {} of memory is available ({} usable, keeping {}% free)",
            gib(self.bytes_for(want) - self.fixed_bytes()),
            kib(self.kv_bytes_per_token as u64),
            self.kv_type,
            self.sessions.max(1),
            gib(available),
            gib(usable),
            100 - USABLE_PERCENT,
        );
        let advice = if self.fixed_bytes() > usable {
            "the model itself does not fit: choose a smaller model or a lighter quantization, or \
             free memory"
        } else {
            "choose a smaller --ctx-size, a smaller cache type (--cache-type q8_0), fewer \
             sessions (--parallel) or a smaller prefix cache"
        };
        if self.requested.is_some() || fits < MIN_DEFAULT_CONTEXT.min(want) {
            return Err(ContextError(format!("{why}: {advice}")));
        }
        Ok(ContextPlan {
            tokens: fits,
            note: Some(format!(
                "context shortened from the model's {want} to {fits} tokens: {why} (to change \
                 it, {advice})"
            )),
        })
    }
}

/// `MemAvailable` from /proc/meminfo, in bytes (`None` where there is no such file).
pub fn available_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// `bytes` in GiB, or MiB below one GiB.
fn gib(bytes: u64) -> String {
    if bytes >= 1 << 30 {
        format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
    }
}

/// `bytes` in KiB, or bytes below one KiB.
fn kib(bytes: u64) -> String {
    if bytes >= 1024 {
        format!("{:.1} KiB", bytes as f64 / 1024.0)
    } else {
        format!("{bytes} bytes")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(requested: Option<usize>, available_gib: Option<u64>) -> ContextRequest {
        ContextRequest {
            requested,
            model_max: 32768,
            // Qwen2.5-Coder-0.5B in f16: 24 layers × 2 × 2 heads × 64 × 2 bytes.
            kv_bytes_per_token: 12288,
            kv_type: KvType::F16,
            sessions: 2,
            other_bytes: 1 << 30,
            weight_bytes: 0,
            scratch_bytes: 0,
            available: available_gib.map(|g| g << 30),
        }
    }

    #[test]
    fn the_models_context_when_it_fits() {
        // 2 × 32768 × 12 KiB = 768 MiB + 1 GiB prefix cache, within 90% of 2 GiB.
        assert_eq!(request(None, Some(2)).plan().unwrap().tokens, 32768);
        assert_eq!(request(None, None).plan().unwrap().tokens, 32768);
        assert_eq!(request(Some(4096), Some(2)).plan().unwrap().tokens, 4096);
        // Beyond the model's own when asked (and it fits).
        assert_eq!(request(Some(65536), Some(3)).plan().unwrap().tokens, 65536);
    }

    #[test]
    fn a_default_is_shortened_to_what_fits_with_a_note() {
        let mut r = request(None, Some(1));
        r.other_bytes = 0;
        // 0.9 GiB usable / (2 × 12 KiB) = 39321 tokens: the model's 32768 fit.
        assert_eq!(r.plan().unwrap().note, None);
        r.sessions = 4;
        let plan = r.plan().unwrap();
        // 0.9 GiB / 48 KiB = 19660 → 19456.
        assert_eq!(plan.tokens, 19456);
        let note = plan.note.unwrap();
        assert!(
            note.contains("32768") && note.contains("--ctx-size"),
            "{note}"
        );
    }

    #[test]
    fn what_cannot_fit_is_refused_with_numbers() {
        let err = request(Some(32768), Some(1)).plan().unwrap_err().0;
        assert!(
            err.contains("32768 tokens") && err.contains("GiB") && err.contains("12.0 KiB"),
            "{err}"
        );
        // A default that would fall below the floor is refused too.
        let mut r = request(None, Some(1));
        r.kv_bytes_per_token = 1 << 20;
        assert!(r.plan().is_err());
    }

    #[test]
    fn weights_and_scratch_count_and_a_model_too_large_is_refused() {
        let mut r = request(None, Some(2));
        // 2 × 32768 × 12 KiB = 768 MiB + 1 GiB of prefix cache fit 1.8 GiB usable; 512 MiB
        // of weights and 64 MiB of scratch leave 243 MiB: 2 × 10376 tokens, rounded down.
        r.weight_bytes = 512 << 20;
        r.scratch_bytes = 64 << 20;
        let plan = r.plan().unwrap();
        assert_eq!(plan.tokens, 10240);
        let note = plan.note.unwrap();
        assert!(
            note.contains("512.0 MiB of weights") && note.contains("64.0 MiB of scratch"),
            "{note}"
        );
        // Weights beyond the memory: refused whatever the context, saying so.
        r.weight_bytes = 3 << 30;
        let err = r.plan().unwrap_err().0;
        assert!(
            err.contains("3.0 GiB of weights") && err.contains("the model itself does not fit"),
            "{err}"
        );
    }
}
