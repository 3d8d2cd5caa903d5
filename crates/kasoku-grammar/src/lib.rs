//! Constrained decoding for kasoku: what a request asks its answer to be (any JSON object, a
//! JSON Schema, tool calls against their parameter schemas, a Lark grammar) compiled by
//! llguidance into a [`kasoku::constraint::TokenConstraint`], whose mask the sampler applies
//! at every sampled position, speculative verification included.
//!
//! [`Grammars`] is made once per model (the token trie over its vocabulary costs tens of
//! milliseconds); [`Grammars::compile`] turns a [`GrammarSpec`] into a
//! [`kasoku::constraint::Constraint`], or says why it cannot be enforced.

mod matcher;
mod spec;
mod vocab;

use std::sync::Arc;

use llguidance::api::{ParserLimits, TopLevelGrammar};
use llguidance::toktrie::{InferenceCapabilities, TokEnv};
use llguidance::{earley::SlicedBiasComputer, Matcher, ParserFactory};

use kasoku::constraint::Constraint;
use kasoku::tokenizer::Tokenizer;

pub use matcher::GrammarConstraint;
pub use spec::{GrammarSpec, ToolCallFormat, ToolSpec};

/// Why a grammar cannot be enforced.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GrammarError {
    /// The request's schema or grammar (a client error).
    #[error("{0}")]
    Unsupported(String),
    /// The vocabulary could not be prepared.
    #[error("preparing constrained decoding: {0}")]
    Setup(String),
}

/// Compiles grammars against one model's vocabulary.
pub struct Grammars {
    factory: ParserFactory,
    vocab: usize,
    stop_tokens: Vec<u32>,
}

impl Grammars {
    /// `vocab`: the model's logit width; `stop_tokens`: the ids that end an answer (all of
    /// them are allowed wherever the grammar may end; the first is llguidance's EOS).
    pub fn new(
        tokenizer: &Tokenizer,
        vocab: usize,
        stop_tokens: &[u32],
    ) -> Result<Grammars, GrammarError> {
        let eos = *stop_tokens
            .first()
            .or(tokenizer.eos().as_ref())
            .ok_or_else(|| GrammarError::Setup("the model has no end-of-answer token".into()))?;
        let env: TokEnv = Arc::new(vocab::Vocab::new(tokenizer, vocab, eos));
        let caps = InferenceCapabilities {
            ff_tokens: false,
            conditional_ff_tokens: false,
            backtrack: false,
            fork: false,
        };
        let mut factory = ParserFactory::new(&env, caps, &SlicedBiasComputer::general_slices())
            .map_err(|e| GrammarError::Setup(e.to_string()))?;
        factory.quiet();
        // Bounds on the work one request's grammar may cost (llguidance's defaults, named).
        *factory.limits_mut() = ParserLimits::default();
        Ok(Grammars {
            factory,
            vocab,
            stop_tokens: stop_tokens.to_vec(),
        })
    }

    /// The constraint for `spec`, or why it cannot be enforced.
    pub fn compile(&self, spec: &GrammarSpec) -> Result<Constraint, GrammarError> {
        Ok(Constraint::new(self.matcher(spec)?))
    }

    /// The constraint itself (for callers that drive it by hand).
    pub fn matcher(&self, spec: &GrammarSpec) -> Result<GrammarConstraint, GrammarError> {
        let grammar: TopLevelGrammar = spec.to_grammar()?;
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| GrammarError::Unsupported(e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(GrammarError::Unsupported(e));
        }
        Ok(GrammarConstraint::new(
            matcher,
            self.vocab,
            self.stop_tokens.clone(),
        ))
    }
}

#[cfg(test)]
mod tests;
