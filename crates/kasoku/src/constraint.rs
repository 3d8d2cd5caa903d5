//! Constrained decoding's hook: a [`TokenConstraint`] says which tokens may come next (a JSON
//! schema, a grammar, a forced tool call), the sampler draws only from those, and the engine
//! advances the constraint past every token it emits. The acceptance walk of speculative
//! decoding forks the constraint at the root and advances the fork down the tree, so each node
//! is sampled from the distribution plain decoding would mask at that position: speculative
//! output still equals plain output token for token.
//!
//! The engine knows nothing of grammars; implementations (kasoku-grammar's llguidance wrapper,
//! the tests' toy rules) live elsewhere.

use std::fmt;
use std::sync::Arc;

/// A set of token ids over a vocabulary, one bit per id.
#[derive(Clone, PartialEq, Eq)]
pub struct TokenMask {
    words: Vec<u32>,
    len: usize,
}

impl TokenMask {
    /// No token allowed, over `len` ids.
    pub fn none(len: usize) -> TokenMask {
        TokenMask {
            words: vec![0; len.div_ceil(32)],
            len,
        }
    }

    /// Every token allowed, over `len` ids.
    pub fn all(len: usize) -> TokenMask {
        let mut m = TokenMask::none(len);
        for id in 0..len {
            m.allow(id as u32);
        }
        m
    }

    /// Bits as 32-bit words (id `i` is bit `i % 32` of word `i / 32`), over `len` ids; bits
    /// past `len` are ignored.
    pub fn from_words(mut words: Vec<u32>, len: usize) -> TokenMask {
        words.resize(len.div_ceil(32), 0);
        if !len.is_multiple_of(32) {
            if let Some(last) = words.last_mut() {
                *last &= (1u32 << (len % 32)) - 1;
            }
        }
        TokenMask { words, len }
    }

    /// The number of ids the mask covers.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn allow(&mut self, id: u32) {
        if (id as usize) < self.len {
            self.words[id as usize / 32] |= 1 << (id % 32);
        }
    }

    pub fn is_allowed(&self, id: u32) -> bool {
        (id as usize) < self.len && self.words[id as usize / 32] & (1 << (id % 32)) != 0
    }

    /// How many ids are allowed.
    pub fn count(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// The allowed ids, ascending.
    pub fn allowed(&self) -> impl Iterator<Item = u32> + '_ {
        self.words.iter().enumerate().flat_map(|(i, &w)| {
            (0..32)
                .filter(move |b| w & (1 << b) != 0)
                .map(move |b| (i * 32 + b) as u32)
        })
    }

    /// Sets the logit of every id the mask does not allow (ids past its length included) to
    /// minus infinity.
    pub fn apply(&self, logits: &mut [f32]) {
        for (i, l) in logits.iter_mut().enumerate() {
            if !self.is_allowed(i as u32) {
                *l = f32::NEG_INFINITY;
            }
        }
    }
}

impl fmt::Debug for TokenMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TokenMask({} of {} allowed)", self.count(), self.len)
    }
}

/// Why a constraint cannot go on.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("constrained decoding: {0}")]
pub struct ConstraintError(pub String);

/// The state of a rule over generated tokens. It starts where the answer starts (right
/// after the prompt) and sees only tokens the engine emits.
pub trait TokenConstraint: Send + Sync {
    /// The tokens allowed at the next position. An empty mask is an error the implementation
    /// reports instead (nothing could follow).
    fn mask(&mut self) -> Result<TokenMask, ConstraintError>;
    /// Moves past `token`, which the engine emitted (it was allowed by the last mask).
    fn advance(&mut self, token: u32) -> Result<(), ConstraintError>;
    /// An independent copy in the same state (to walk a speculative tree, or to start a
    /// generation from a shared initial state).
    fn fork(&self) -> Box<dyn TokenConstraint>;
}

/// A constraint's initial state, shared by the options of a generation; each generation works
/// on its own fork. Cheap to clone.
#[derive(Clone)]
pub struct Constraint(Arc<dyn TokenConstraint>);

impl Constraint {
    pub fn new(initial: impl TokenConstraint + 'static) -> Constraint {
        Constraint(Arc::new(initial))
    }

    /// A fresh state at the start of the answer.
    pub fn start(&self) -> Box<dyn TokenConstraint> {
        self.0.fork()
    }
}

impl fmt::Debug for Constraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Constraint")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_count_allow_and_apply() {
        let mut m = TokenMask::none(70);
        assert_eq!(m.count(), 0);
        for id in [0, 31, 32, 69, 70, 1000] {
            m.allow(id);
        }
        assert_eq!(m.count(), 4, "ids past the length are ignored");
        assert_eq!(m.allowed().collect::<Vec<_>>(), vec![0, 31, 32, 69]);
        assert!(m.is_allowed(69) && !m.is_allowed(70) && !m.is_allowed(1));
        let mut logits = vec![1.0f32; 72];
        m.apply(&mut logits);
        assert_eq!(logits[31], 1.0);
        assert_eq!(logits[30], f32::NEG_INFINITY);
        assert_eq!(logits[71], f32::NEG_INFINITY);
        assert_eq!(TokenMask::all(70).count(), 70);
        // Stray bits past the length are cleared.
        let w = TokenMask::from_words(vec![u32::MAX; 3], 40);
        assert_eq!(w.count(), 40);
    }
}
