//! The draft model's tree, grown level by level over any [`DraftPasses`]: the policy of the
//! CPU's `kasoku::spec::draft_model` (its `DraftModelConfig`, its leading chain of unfed
//! tokens, its commit of the longest accepted path), with each level a verification of the
//! whole tree so far that hands back only each row's best two tokens and their probabilities.
//! Where the draft model's logits agree with the CPU's, the trees are the CPU drafter's.

use kasoku::model::{TokenTree, TreeBuilder};
use kasoku::spec::draft_model::DraftModelConfig;
use kasoku::spec::{Accepted, DraftError, DraftRequest, Drafter, Features};

use super::passes::DraftPasses;
use crate::kernels::RowTop2;

/// Most tokens the draft model has not computed yet that a tree's first level computes along
/// with its root (its leading chain); a longer gap is fed by a pass of its own first. The
/// CPU drafter's value: one pass costs about the same for one row or several.
pub const LEADING_CHAIN: usize = 8;

/// A draft model (behind its passes) proposing trees to a target sharing its vocabulary.
pub struct TreeDrafter<P: DraftPasses> {
    passes: P,
    config: DraftModelConfig,
    /// Tokens in the draft model's state, in order.
    fed: Vec<u32>,
    /// The tree last verified on the draft model (pending in its state): `fed` continues
    /// with its root path.
    last_tree: Option<TokenTree>,
    /// The unfed tokens that tree opened with (its leading chain, the target's root last).
    last_missing: Vec<u32>,
    /// Each row's best two of the last verification (kept from level to level).
    rows: Vec<RowTop2>,
}

impl<P: DraftPasses> TreeDrafter<P> {
    pub fn new(passes: P, config: DraftModelConfig) -> TreeDrafter<P> {
        TreeDrafter {
            passes,
            config,
            fed: Vec::new(),
            last_tree: None,
            last_missing: Vec::new(),
            rows: Vec::new(),
        }
    }

    /// The passes (for measuring).
    pub fn passes(&self) -> &P {
        &self.passes
    }

    /// Tokens the draft model's state holds.
    pub fn fed(&self) -> &[u32] {
        &self.fed
    }

    /// Makes `fed` a prefix of `tokens` shorter than it (rewinding the state, or starting
    /// over where it cannot rewind), then feeds
    /// all of `tokens` but the last `keep` (at least one is always left: the root).
    fn sync(&mut self, tokens: &[u32], keep: usize) -> Result<(), DraftError> {
        let common = self
            .fed
            .iter()
            .zip(tokens)
            .take_while(|(a, b)| a == b)
            .count()
            .min(tokens.len().saturating_sub(1));
        if common < self.fed.len() {
            self.last_tree = None;
            let kept = self.passes.truncate(common);
            self.fed.truncate(kept);
        }
        let upto = tokens.len().saturating_sub(keep.max(1));
        if upto > self.fed.len() {
            self.last_tree = None;
            let new = &tokens[self.fed.len()..upto];
            self.passes.feed(new)?;
            self.fed.extend_from_slice(new);
        }
        Ok(())
    }
}

impl<P: DraftPasses> Drafter for TreeDrafter<P> {
    fn name(&self) -> &'static str {
        "draft"
    }

    fn start(&mut self, prompt: &[u32], _features: Features) -> Result<(), DraftError> {
        // Everything but the last prompt token now; that one opens the first draft tree.
        self.sync(prompt, 1)
    }

    fn catch_up(&mut self, tokens: &[u32]) -> Result<(), DraftError> {
        // All but a short gap, which the next tree's first level computes at no extra cost.
        self.sync(tokens, LEADING_CHAIN)
    }

    fn draft(&mut self, req: &DraftRequest) -> Result<TokenTree, DraftError> {
        let tokens = req.tokens;
        if tokens.is_empty() {
            return Ok(TokenTree::chain(&[]));
        }
        self.sync(tokens, LEADING_CHAIN)?;
        let missing = tokens[self.fed.len()..].to_vec();
        self.last_tree = None;
        // The whole tree (leading chain and drafts) is one pass of at most `max_tree` rows,
        // and its deepest node must fit the state.
        let room = self
            .passes
            .max_len()
            .saturating_sub(self.fed.len() + missing.len());
        let budget = req
            .budget
            .min(room)
            .min(self.passes.max_tree().saturating_sub(missing.len()));
        let mut builder = TreeBuilder::new(missing[0]);
        let root = builder.add_chain(0, &missing[1..]);
        self.last_missing = missing;
        // Open nodes: (builder id, probability of the path below the root).
        let mut open = vec![(root, 1.0f32)];
        let mut added = 0;
        for _level in 0..req.max_depth {
            if open.is_empty() || added >= budget {
                break;
            }
            // The first level verifies the leading chain alone; later ones the whole tree.
            let (tree, index) = builder.build();
            self.passes.verify(&tree, &mut self.rows)?;
            self.last_tree = Some(tree);
            let mut next = Vec::new();
            // Most likely paths first, so a tight budget keeps the best ones.
            open.sort_by(|a, b| b.1.total_cmp(&a.1));
            for &(id, p) in &open {
                let top = self.rows[index[id]];
                let (p1, p2) = top.probabilities();
                if added < budget {
                    next.push((builder.add(id, top.best.0), p * p1));
                    added += 1;
                }
                if p1 < self.config.branch_below
                    && p * p2 >= self.config.min_path_prob
                    && added < budget
                {
                    next.push((builder.add(id, top.second.0), p * p2));
                    added += 1;
                }
            }
            open = next
                .into_iter()
                .filter(|&(_, p)| p >= self.config.min_path_prob)
                .collect();
        }
        // The target's tree: the subtree under the root (the last token of the chain).
        let (full, index) = builder.build();
        let start = index[root];
        let mut out = TreeBuilder::new(full.token(start));
        let mut ids = vec![0usize; full.len()];
        for i in start + 1..full.end(start) {
            let p = full.parent(i).expect("below the root");
            ids[i] = out.add(ids[p], full.token(i));
        }
        Ok(out.build().0)
    }

    fn accept(&mut self, accepted: &Accepted) -> Result<(), DraftError> {
        // The target now holds `fed`, then the tree's leading chain up to its root, then the
        // accepted tokens after the root: the longest root path of the pending tree that
        // spells them is committed on the draft model too.
        let Some(tree) = self.last_tree.take() else {
            return Ok(());
        };
        let chain = self.last_missing.len() - 1;
        if accepted.tokens.is_empty()
            || accepted.committed_len != self.fed.len() + chain + accepted.tokens.len()
        {
            return Ok(()); // out of step; the next draft resynchronises
        }
        let mut want = self.last_missing[..chain].to_vec();
        want.extend_from_slice(accepted.tokens);
        if tree.token(0) != want[0] {
            return Ok(());
        }
        let mut path = vec![0];
        for &t in &want[1..] {
            match tree.child_with(*path.last().expect("the root"), t) {
                Some(c) => path.push(c),
                None => break,
            }
        }
        self.passes.commit(&path)?;
        self.fed.extend(path.iter().map(|&i| tree.token(i)));
        Ok(())
    }
}
