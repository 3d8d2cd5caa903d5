//! Drafting with Qwen3.5's multi-token-prediction head (`model::MtpHead`): a chain, each step
//! pairing the last token with a hidden state (the target's for the root, then the head's
//! own) to predict the next token. The head's KV cache holds one row per committed position;
//! rows of a rejected draft are dropped and the accepted tokens are ingested with the target's
//! hidden states from the verification pass.

use std::sync::Arc;

use super::drafter::{Accepted, DraftError, DraftRequest, Drafter, Features};
use crate::model::{Model, ModelState, Output, TokenTree};
use crate::sampler::argmax;

/// The MTP drafter.
pub struct MtpDrafter {
    model: Arc<Model>,
    /// The head's KV cache.
    cache: ModelState,
    /// What the head's last pass returned.
    out: Output,
    /// The target's hidden state of the last committed token (pairs with the next root).
    last_hidden: Option<Vec<f32>>,
    /// Cache rows before the current draft (the draft's own rows come after).
    base: usize,
    /// Rows the head's cache holds at most: the target's context (a draft never takes the
    /// target past it).
    ctx_size: usize,
    /// Stop the chain when the head's top probability falls under this.
    pub min_prob: f32,
}

impl MtpDrafter {
    /// A drafter for `model`, which must have an MTP head, drafting for a target with a
    /// context of `ctx_size` tokens.
    pub fn new(model: Arc<Model>, ctx_size: usize) -> Result<MtpDrafter, DraftError> {
        let Some(mtp) = &model.mtp else {
            return Err(DraftError::Incompatible(
                "this checkpoint has no multi-token-prediction head".into(),
            ));
        };
        // The head's rows follow the target's, plus a draft's, which stays within the
        // target's context.
        let cache = mtp.new_state(ctx_size);
        Ok(MtpDrafter {
            model,
            cache,
            out: Output::default(),
            last_hidden: None,
            base: 0,
            ctx_size,
            min_prob: 0.0,
        })
    }

    fn mtp(&self) -> &crate::model::MtpHead {
        self.model.mtp.as_ref().expect("checked in new")
    }

    /// Ingests (token, hidden) pairs as committed rows.
    fn ingest(&mut self, tokens: &[u32], hidden: &[f32]) -> Result<(), DraftError> {
        if tokens.is_empty() {
            return Ok(());
        }
        let mtp = self.model.mtp.as_ref().expect("checked in new");
        mtp.run(&self.model, &mut self.cache, tokens, hidden, &mut self.out)?;
        Ok(())
    }
}

impl Drafter for MtpDrafter {
    fn name(&self) -> &'static str {
        "mtp"
    }

    fn wants_hidden(&self) -> bool {
        true
    }

    fn start(&mut self, prompt: &[u32], features: Features) -> Result<(), DraftError> {
        // Rows pair token x_{j+1} with hidden h_j; only the newly computed part of the prompt
        // has hidden states, so the head restarts from there.
        let h = self.model.config.hidden;
        self.cache = self.mtp().new_state(self.ctx_size);
        self.base = 0;
        self.last_hidden = None;
        let Some(hidden) = features.hidden.filter(|x| x.len() >= h) else {
            return Ok(());
        };
        let m = (hidden.len() / h).min(prompt.len());
        let new = &prompt[prompt.len() - m..];
        self.ingest(&new[1..], &hidden[..(m - 1) * h])?;
        self.last_hidden = Some(hidden[(m - 1) * h..m * h].to_vec());
        self.base = self.cache.len();
        Ok(())
    }

    fn draft(&mut self, req: &DraftRequest) -> Result<TokenTree, DraftError> {
        let Some(&root) = req.tokens.last() else {
            return Ok(TokenTree::chain(&[]));
        };
        let mut chain = vec![root];
        let Some(mut hidden) = self.last_hidden.clone() else {
            return Ok(TokenTree::chain(&chain));
        };
        self.cache.truncate(self.base);
        let mtp = self.model.mtp.as_ref().expect("checked in new");
        let steps = req.budget.min(req.max_depth);
        for _ in 0..steps {
            let last = *chain.last().expect("non-empty");
            mtp.run(
                &self.model,
                &mut self.cache,
                &[last],
                &hidden,
                &mut self.out,
            )?;
            let logits = &self.out.logits;
            let best = argmax(logits);
            if self.min_prob > 0.0 {
                let top = logits[best as usize];
                let z: f32 = logits.iter().map(|&l| (l - top).exp()).sum();
                if 1.0 / z < self.min_prob {
                    break;
                }
            }
            chain.push(best);
            hidden.clear();
            hidden.extend_from_slice(&self.out.hidden);
        }
        Ok(TokenTree::chain(&chain))
    }

    fn accept(&mut self, accepted: &Accepted) -> Result<(), DraftError> {
        let h = self.model.config.hidden;
        let Some(rows) = accepted.features.hidden else {
            return Ok(());
        };
        let n = accepted.tokens.len();
        if n == 0 || rows.len() != n * h {
            return Ok(());
        }
        // Drop the draft's rows and ingest the committed tokens with the target's hidden
        // states: token i pairs with the hidden state of the token before it.
        self.cache.truncate(self.base);
        match self.last_hidden.take() {
            Some(last) => {
                let mut pairs = last;
                pairs.extend_from_slice(&rows[..(n - 1) * h]);
                self.ingest(accepted.tokens, &pairs)?;
            }
            None => self.ingest(&accepted.tokens[1..], &rows[..(n - 1) * h])?,
        }
        self.last_hidden = Some(rows[(n - 1) * h..].to_vec());
        self.base = self.cache.len();
        Ok(())
    }
}
