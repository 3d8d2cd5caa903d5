//! Prompt lookup (n-gram) drafting: find the last few tokens earlier in the sequence (prompt
//! and answer so far) and propose what followed them. The longest matching suffix is tried
//! first, most recent occurrence first; each further occurrence with a different
//! continuation becomes another branch. Costs no model pass: microseconds per draft.

use super::drafter::{Accepted, DraftError, DraftRequest, Drafter, Features};
use crate::model::{TokenTree, TreeBuilder};

/// Prompt-lookup drafter.
#[derive(Clone, Debug)]
pub struct NgramDrafter {
    /// Longest suffix looked up.
    pub max_ngram: usize,
    /// Shortest suffix looked up.
    pub min_ngram: usize,
    /// Branches (distinct occurrences) at most.
    pub max_branches: usize,
}

impl Default for NgramDrafter {
    fn default() -> Self {
        NgramDrafter {
            max_ngram: 4,
            min_ngram: 2,
            max_branches: 3,
        }
    }
}

impl NgramDrafter {
    /// The tree for `tokens` (its last token the root) within `budget` nodes below the root
    /// and `max_depth` levels.
    pub fn tree(&self, tokens: &[u32], budget: usize, max_depth: usize) -> TokenTree {
        let Some(&root) = tokens.last() else {
            return TokenTree::chain(&[]);
        };
        let mut tree = TreeBuilder::new(root);
        let len = tokens.len();
        let mut branches = 0;
        'sizes: for n in (self.min_ngram.max(1)..=self.max_ngram).rev() {
            if len <= n {
                continue;
            }
            let suffix = &tokens[len - n..];
            // Occurrences ending before the suffix itself, most recent first.
            for start in (0..len - n).rev() {
                if tree.len() > budget || branches >= self.max_branches {
                    break 'sizes;
                }
                if &tokens[start..start + n] != suffix {
                    continue;
                }
                let from = start + n;
                let to = (from + max_depth).min(len);
                let before = tree.len();
                let mut node = 0;
                for &t in &tokens[from..to] {
                    if tree.len() > budget {
                        break;
                    }
                    node = tree.add(node, t);
                }
                if tree.len() > before {
                    branches += 1;
                }
            }
        }
        // The loop may add one node past the budget when a branch is cut; rebuild within it.
        let (t, _) = tree.build();
        if t.len() <= budget + 1 {
            return t;
        }
        let mut trimmed = TreeBuilder::new(root);
        let mut ids = vec![0usize; t.len()];
        for i in 1..=budget {
            let p = t.parent(i).expect("non-root");
            ids[i] = trimmed.add(ids[p], t.token(i));
        }
        trimmed.build().0
    }
}

impl Drafter for NgramDrafter {
    fn name(&self) -> &'static str {
        "ngram"
    }

    fn start(&mut self, _prompt: &[u32], _features: Features) -> Result<(), DraftError> {
        Ok(())
    }

    fn draft(&mut self, req: &DraftRequest) -> Result<TokenTree, DraftError> {
        Ok(self.tree(req.tokens, req.budget, req.max_depth))
    }

    fn accept(&mut self, _accepted: &Accepted) -> Result<(), DraftError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proposes_what_followed_the_suffix() {
        let d = NgramDrafter::default();
        // "a b c d e ... a b c" → propose "d e".
        let toks = [1, 2, 3, 4, 5, 9, 9, 1, 2, 3];
        let t = d.tree(&toks, 8, 2);
        assert_eq!(t.tokens(), &[3, 4, 5]);
        assert_eq!(t.max_depth(), 2);
        // Budget 1 keeps one node.
        assert_eq!(d.tree(&toks, 1, 8).tokens(), &[3, 4]);
        // Nothing to find.
        assert_eq!(d.tree(&[7, 8, 9], 8, 8).tokens(), &[9]);
    }

    #[test]
    fn several_occurrences_become_branches_most_recent_first() {
        let d = NgramDrafter::default();
        // "x y" followed by 5 (old) and by 6 (recent).
        let toks = [1, 2, 5, 0, 1, 2, 6, 0, 1, 2];
        let t = d.tree(&toks, 8, 2);
        assert_eq!(t.token(0), 2);
        let children: Vec<u32> = t.children(0).map(|c| t.token(c)).collect();
        assert_eq!(children, vec![6, 5]);
        assert!(t.len() <= 9);
    }
}
