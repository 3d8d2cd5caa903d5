//! What answers requests, whatever it runs on: [`Generator`] is implemented by the CPU's
//! [`Session`] and by [`DeviceSession`](super::device::DeviceSession) over a model on a device
//! (a GPU), so a server or a command line holds either behind one interface.

#![warn(missing_docs)]

use std::sync::Mutex;

use super::prefix_cache::PrefixCache;
use super::session::{Emitted, EngineError, Flow, GenerateOptions, Generation, Session};

/// One conversation's generator: a KV cache of [`Generator::ctx_size`] tokens and the passes
/// that fill it.
pub trait Generator {
    /// Where its passes run, for statistics (`cpu`, `cuda:0`).
    fn device(&self) -> String;

    /// Tokens its cache holds, prompt and answer together.
    fn ctx_size(&self) -> usize;

    /// Prefills `prompt` (reusing what it can: its own cache, and `cache` where the generator
    /// can use one) and generates, handing each new token to `on_token`. `cancelled` is asked
    /// between blocks of a long prefill; when it says so, the generation ends at once with no
    /// tokens. The semantics are [`Session::generate_cached_until`]'s.
    fn generate_until(
        &mut self,
        cache: Option<&Mutex<PrefixCache>>,
        prompt: &[u32],
        options: &GenerateOptions,
        cancelled: &dyn Fn() -> bool,
        on_token: &mut dyn FnMut(Emitted) -> Flow,
    ) -> Result<Generation, EngineError>;
}

impl Generator for Session {
    fn device(&self) -> String {
        "cpu".into()
    }

    fn ctx_size(&self) -> usize {
        Session::ctx_size(self)
    }

    fn generate_until(
        &mut self,
        cache: Option<&Mutex<PrefixCache>>,
        prompt: &[u32],
        options: &GenerateOptions,
        cancelled: &dyn Fn() -> bool,
        on_token: &mut dyn FnMut(Emitted) -> Flow,
    ) -> Result<Generation, EngineError> {
        self.generate_cached_until(cache, prompt, options, cancelled, on_token)
    }
}
