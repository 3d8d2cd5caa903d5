//! An llguidance matcher as kasoku's [`TokenConstraint`]: its mask over the model's vocabulary,
//! with every stop token allowed wherever the grammar allows its end.

use std::sync::Mutex;

use llguidance::Matcher;

use kasoku::constraint::{ConstraintError, TokenConstraint, TokenMask};

/// One generation's grammar state.
pub struct GrammarConstraint {
    // llguidance's matcher is Send but not Sync; the engine uses a state from one thread at
    // a time, and the lock is never contended.
    matcher: Mutex<Matcher>,
    vocab: usize,
    stop_tokens: Vec<u32>,
}

impl GrammarConstraint {
    pub(crate) fn new(matcher: Matcher, vocab: usize, stop_tokens: Vec<u32>) -> Self {
        GrammarConstraint {
            matcher: Mutex::new(matcher),
            vocab,
            stop_tokens,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Matcher> {
        self.matcher.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the text so far is a complete answer.
    pub fn is_accepting(&self) -> bool {
        self.lock().is_accepting().unwrap_or(false)
    }
}

impl TokenConstraint for GrammarConstraint {
    fn mask(&mut self) -> Result<TokenMask, ConstraintError> {
        let mut m = self.lock();
        let vob = m
            .compute_mask_or_eos()
            .map_err(|e| ConstraintError(e.to_string()))?;
        let eos = m
            .tok_env()
            .map(|env| env.tok_trie().eos_token())
            .map_err(|e| ConstraintError(e.to_string()))?;
        drop(m);
        let mut mask = TokenMask::from_words(vob.as_slice().to_vec(), self.vocab);
        if mask.is_allowed(eos) {
            for &t in &self.stop_tokens {
                mask.allow(t);
            }
        }
        if mask.count() == 0 {
            return Err(ConstraintError(
                "the grammar allows no token here".to_string(),
            ));
        }
        Ok(mask)
    }

    fn advance(&mut self, token: u32) -> Result<(), ConstraintError> {
        let mut m = self.lock();
        let eos = m
            .tok_env()
            .map(|env| env.tok_trie().eos_token())
            .map_err(|e| ConstraintError(e.to_string()))?;
        // Any stop token is the grammar's end.
        let token = if self.stop_tokens.contains(&token) {
            eos
        } else {
            token
        };
        m.consume_token(token)
            .map_err(|e| ConstraintError(e.to_string()))
    }

    fn fork(&self) -> Box<dyn TokenConstraint> {
        Box::new(GrammarConstraint {
            matcher: Mutex::new(self.lock().clone()),
            vocab: self.vocab,
            stop_tokens: self.stop_tokens.clone(),
        })
    }
}
