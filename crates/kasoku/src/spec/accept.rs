//! Acceptance: walk down a verified tree with the target's own sampler. At each node the
//! target picks its token exactly as plain decoding would at that position (same logits, same
//! history, randomness keyed by the absolute position); if a child carries it, the walk
//! descends, otherwise the picked token is the pass's new root. The emitted tokens are thus
//! a sample of plain decoding, whatever the drafter proposed (the "sample, then match" rule).

use crate::constraint::{ConstraintError, TokenConstraint};
use crate::model::TokenTree;
use crate::sampler::{self, SamplingParams};

/// The outcome of a pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acceptance {
    /// The accepted nodes, root first: `path[j + 1]` carries `tokens[j]`.
    pub path: Vec<usize>,
    /// The target's tokens: one per path node, the last one matching no child (the next root).
    pub tokens: Vec<u32>,
}

impl Acceptance {
    /// Draft tokens the target accepted (path nodes beyond the root).
    pub fn accepted_drafts(&self) -> usize {
        self.path.len() - 1
    }
}

/// Walks `tree` (verified: `logits` is `tree.len() × vocab`) from the root. `history` is the
/// sequence the root closes (every token before the pass's first new position, the root
/// last), so the root's token is sampled at position `history.len()`.
pub fn accept_path(
    tree: &TokenTree,
    logits: &[f32],
    vocab: usize,
    params: &SamplingParams,
    history: &[u32],
) -> Acceptance {
    accept_path_constrained(tree, logits, vocab, params, history, None)
        .expect("an unconstrained walk cannot fail")
}

/// [`accept_path`] under a constraint in the state after `history`: a fork of it walks down
/// with the path, and each node is sampled from the tokens it allows there, as plain
/// decoding under the constraint samples them. `constraint` itself is not advanced.
pub fn accept_path_constrained(
    tree: &TokenTree,
    logits: &[f32],
    vocab: usize,
    params: &SamplingParams,
    history: &[u32],
    constraint: Option<&dyn TokenConstraint>,
) -> Result<Acceptance, ConstraintError> {
    let mut walker = constraint.map(TokenConstraint::fork);
    assert_eq!(
        logits.len(),
        tree.len() * vocab,
        "accept: logits of another tree"
    );
    let mut hist = history.to_vec();
    let mut node = 0;
    let mut path = vec![0];
    let mut tokens = Vec::new();
    loop {
        let row = &logits[node * vocab..(node + 1) * vocab];
        let mask = walker.as_mut().map(|w| w.mask()).transpose()?;
        let token = sampler::sample_masked(params, row, &hist, hist.len(), mask.as_ref());
        tokens.push(token);
        match tree.child_with(node, token) {
            Some(child) => {
                if let Some(w) = walker.as_mut() {
                    w.advance(token)?;
                }
                node = child;
                path.push(child);
                hist.push(token);
            }
            None => break,
        }
    }
    Ok(Acceptance { path, tokens })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::TreeBuilder;

    /// One-hot logits that make greedy pick `t` at each node.
    fn logits_picking(picks: &[u32], vocab: usize) -> Vec<f32> {
        let mut l = vec![0f32; picks.len() * vocab];
        for (i, &t) in picks.iter().enumerate() {
            l[i * vocab + t as usize] = 5.0;
        }
        l
    }

    #[test]
    fn greedy_walks_while_a_child_matches() {
        // 1 → {2 → {3, 4}, 5}
        let mut b = TreeBuilder::new(1);
        let a = b.add(0, 2);
        b.add(a, 3);
        b.add(a, 4);
        b.add(0, 5);
        let (tree, _) = b.build(); // order: 1 2 3 4 5
        let greedy = SamplingParams::default();
        // The target wants 2, then 4, then 7.
        let l = logits_picking(&[2, 4, 0, 7, 0], 8);
        let acc = accept_path(&tree, &l, 8, &greedy, &[9, 1]);
        assert_eq!(acc.path, vec![0, 1, 3]);
        assert_eq!(acc.tokens, vec![2, 4, 7]);
        assert_eq!(acc.accepted_drafts(), 2);
        // Nothing matches at the root.
        let l = logits_picking(&[6, 4, 0, 7, 0], 8);
        let acc = accept_path(&tree, &l, 8, &greedy, &[1]);
        assert_eq!((acc.path, acc.tokens), (vec![0], vec![6]));
    }

    /// Sampling at a node uses the history along the path and the absolute position, so it
    /// picks what plain decoding picks.
    #[test]
    fn sampled_tokens_equal_plain_sampling_along_the_path() {
        let vocab = 16;
        let params = SamplingParams {
            temperature: 0.9,
            top_k: 8,
            repetition_penalty: 1.3,
            seed: 42,
            ..SamplingParams::default()
        };
        let logits: Vec<f32> = (0..4 * vocab)
            .map(|i| ((i * 37 % 23) as f32) * 0.1)
            .collect();
        let history = vec![3u32, 1, 4];
        // Plain: sample token by token, feeding each one.
        let mut hist = history.clone();
        let mut plain = Vec::new();
        for node in 0..4 {
            let t = sampler::sample(
                &params,
                &logits[node * vocab..(node + 1) * vocab],
                &hist,
                hist.len(),
            );
            plain.push(t);
            hist.push(t);
        }
        // A chain that guesses the first two right and the third wrong.
        let wrong = (plain[2] + 1) % vocab as u32;
        let tree = TokenTree::chain(&[4, plain[0], plain[1], wrong]);
        let acc = accept_path(&tree, &logits, vocab, &params, &history);
        assert_eq!(acc.path, vec![0, 1, 2]);
        assert_eq!(acc.tokens, plain[..3].to_vec());
    }
}
