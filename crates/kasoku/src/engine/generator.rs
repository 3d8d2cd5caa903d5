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

    /// Forgets everything in its cache.
    fn reset(&mut self);

    /// Prefills `prompt` after the longest prefix already in its cache and generates, handing
    /// each new token to `on_token` (which may end the answer): [`Session::generate`]'s
    /// semantics.
    fn generate(
        &mut self,
        prompt: &[u32],
        options: &GenerateOptions,
        on_token: &mut dyn FnMut(Emitted) -> Flow,
    ) -> Result<Generation, EngineError>;

    /// The server's call: reuses the longest prefix of `prompt` found in `cache` (a
    /// generator that cannot use the shared cache's CPU states reuses its own instead);
    /// without a cache, the whole prompt is computed. `cancelled` is asked between blocks of
    /// a long prefill; when it says so, the generation ends at once with no tokens.
    /// [`Session::generate_cached_until`]'s semantics.
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

    fn reset(&mut self) {
        Session::reset(self)
    }

    fn generate(
        &mut self,
        prompt: &[u32],
        options: &GenerateOptions,
        on_token: &mut dyn FnMut(Emitted) -> Flow,
    ) -> Result<Generation, EngineError> {
        Session::generate(self, prompt, options, on_token)
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
