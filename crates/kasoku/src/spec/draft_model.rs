//! Drafting with a smaller model that shares the target's tokenizer (e.g. Qwen2.5-Coder-0.5B
//! for the 1.5B). The draft model grows its tree level by level, one pass per level: each
//! pass verifies the draft tree so far on the draft model itself (`Model::verify`, the
//! target's own machinery), then adds below each open node its most likely token, and the
//! runner-up too where the draft model is unsure. Its cache follows the target through the
//! same commit protocol: after the target's pass, the draft model commits the longest path
//! of its own last tree that the target accepted; tokens it has not computed yet are fed at
//! the start of the next draft. A rejection never costs a re-prefill.
//!
//! The draft model scores only the first `vocab_rows` token ids (BPE vocabularies put the
//! frequent tokens first), which makes each pass cheaper; drafts never contain other tokens.

use std::sync::Arc;

use super::drafter::{Accepted, DraftError, DraftRequest, Drafter, Features};
use crate::kernels::matmul::MatMulWeight;
use crate::model::{Batch, Logits, Model, ModelState, Output, TokenTree, TreeBuilder};

/// Most tokens the draft model has not computed yet that a tree's first level computes along
/// with its root (its "leading chain"); a longer gap is fed by a pass of its own first.
const LEADING_CHAIN: usize = 8;

/// Draft-model drafter settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DraftModelConfig {
    /// Token ids the draft model scores: `0..vocab_rows` (0 = the whole vocabulary).
    pub vocab_rows: usize,
    /// Add the runner-up below a node when the best token's probability is under this.
    pub branch_below: f32,
    /// Stop growing paths whose draft probability falls under this.
    pub min_path_prob: f32,
}

impl Default for DraftModelConfig {
    fn default() -> Self {
        DraftModelConfig {
            vocab_rows: 32768,
            branch_below: 0.5,
            min_path_prob: 0.15,
        }
    }
}

/// A draft model with its own state.
pub struct DraftModelDrafter {
    model: Arc<Model>,
    state: ModelState,
    /// Tokens in `state`, in order.
    fed: Vec<u32>,
    head: Option<MatMulWeight>,
    config: DraftModelConfig,
    /// The tree last verified on the draft model (pending in `state`), as (parents, tokens)
    /// in the model's node order: `fed` continues with its root path.
    last_tree: Option<(Vec<usize>, Vec<u32>)>,
    /// The unfed tokens that tree opened with (its leading chain, the target's root last).
    last_missing: Vec<u32>,
}

impl DraftModelDrafter {
    /// A drafter over `model` with room for `ctx_size` tokens. The target's vocabulary size
    /// is checked against the draft model's (same tokenizer family).
    pub fn new(
        model: Arc<Model>,
        ctx_size: usize,
        target_vocab: usize,
        config: DraftModelConfig,
    ) -> Result<Self, DraftError> {
        let vocab = model.config.vocab;
        // Padded vocabularies differ in their unused tail; the used ids must line up.
        if vocab.abs_diff(target_vocab) > 1024 {
            return Err(DraftError::Incompatible(format!(
                "the draft model's vocabulary ({vocab}) does not match the target's ({target_vocab})"
            )));
        }
        let head = (config.vocab_rows > 0 && config.vocab_rows < vocab)
            .then(|| model.head.first_rows(config.vocab_rows.div_ceil(8) * 8));
        let state = model.new_state(ctx_size);
        Ok(DraftModelDrafter {
            model,
            state,
            fed: Vec::new(),
            head,
            config,
            last_tree: None,
            last_missing: Vec::new(),
        })
    }

    /// Makes `fed` a prefix of `tokens` (rewinding or restarting the state), then feeds all
    /// of `tokens` but the last `keep` through a plain forward pass.
    fn sync(&mut self, tokens: &[u32], keep: usize) -> Result<(), DraftError> {
        let common = self
            .fed
            .iter()
            .zip(tokens)
            .take_while(|(a, b)| a == b)
            .count();
        if common < self.fed.len() {
            self.last_tree = None;
            if self.state.truncate(common) {
                self.fed.truncate(common);
            } else {
                self.state = self.model.new_state(self.state.max_len());
                self.fed.clear();
            }
        }
        let upto = tokens.len().saturating_sub(keep);
        if upto > self.fed.len() {
            self.last_tree = None;
            let new = &tokens[self.fed.len()..upto];
            let batch = Batch::chain(new).logits(Logits::None);
            self.model
                .run(&mut self.state, &batch, &mut Output::default())?;
            self.fed.extend_from_slice(new);
        }
        Ok(())
    }

    /// Computes the builder's nodes not verified yet on the draft model: grows the pending
    /// tree by them (attention-only models), else re-verifies the whole tree. Leaves each
    /// node's logits row in `rows_of` / `out.logits`, and the pending tree's shape (in the
    /// model's node order) in `last_tree`.
    fn verify_new(
        &mut self,
        builder: &TreeBuilder,
        computed: &mut usize,
        grow: &mut bool,
        rows_of: &mut Vec<Option<usize>>,
        out: &mut Output,
    ) -> Result<(), DraftError> {
        let n = builder.len();
        let head = self.head.as_ref();
        if *computed > 0 && *grow {
            let parents = &builder.parents()[*computed..n];
            let tokens = &builder.tokens()[*computed..n];
            let batch = Batch::grow(parents, tokens).head(head);
            match self.model.run(&mut self.state, &batch, out) {
                Ok(()) => {
                    rows_of.clear();
                    rows_of.resize(n, None);
                    for (r, id) in (*computed..n).enumerate() {
                        rows_of[id] = Some(r);
                    }
                    let tree = self.last_tree.as_mut().expect("a tree is pending");
                    tree.0.extend_from_slice(parents);
                    tree.1.extend_from_slice(tokens);
                    *computed = n;
                    return Ok(());
                }
                Err(crate::model::ModelError::Unsupported(_)) => *grow = false,
                Err(e) => return Err(e.into()),
            }
        }
        if *computed == 0 {
            // The first level: the leading chain is the whole tree, in builder order.
            let chain = TokenTree::chain(builder.tokens());
            let batch = Batch::tree(&chain).head(head);
            self.model.run(&mut self.state, &batch, out)?;
            *rows_of = (0..n).map(Some).collect();
            self.last_tree = Some((chain.parents().to_vec(), chain.tokens().to_vec()));
        } else {
            let (tree, index) = builder.build();
            let batch = Batch::tree(&tree).head(head);
            self.model.run(&mut self.state, &batch, out)?;
            *rows_of = index.iter().map(|&i| Some(i)).collect();
            self.last_tree = Some((tree.parents().to_vec(), tree.tokens().to_vec()));
        }
        *computed = n;
        Ok(())
    }

    /// Softmax over the scored rows; returns the best two (token, probability).
    fn top2(row: &[f32]) -> [(u32, f32); 2] {
        let mut best = [(0u32, f32::NEG_INFINITY); 2];
        for (i, &l) in row.iter().enumerate() {
            if l > best[0].1 {
                best[1] = best[0];
                best[0] = (i as u32, l);
            } else if l > best[1].1 {
                best[1] = (i as u32, l);
            }
        }
        let z: f32 = row.iter().map(|&l| (l - best[0].1).exp()).sum();
        best.map(|(t, l)| (t, (l - best[0].1).exp() / z))
    }
}

impl Drafter for DraftModelDrafter {
    fn name(&self) -> &'static str {
        "draft"
    }

    fn start(&mut self, prompt: &[u32], _features: Features) -> Result<(), DraftError> {
        // Everything but the last prompt token now; that one opens the first draft tree.
        self.sync(prompt, 1)
    }

    fn catch_up(&mut self, tokens: &[u32]) -> Result<(), DraftError> {
        // Everything but the last LEADING_CHAIN tokens, in one pass. A short gap is left for
        // the next tree's leading chain, whose first level computes it at no extra cost
        // (the pass reads the same weights for one row or several): after the target accepts
        // a path down to a leaf of the last tree, which the draft model never computed, the
        // gap is two tokens, and feeding them here cost a pass of their own.
        self.sync(tokens, LEADING_CHAIN)
    }

    fn draft(&mut self, req: &DraftRequest) -> Result<TokenTree, DraftError> {
        let tokens = req.tokens;
        if tokens.is_empty() {
            return Ok(TokenTree::chain(&[]));
        }
        // Keep at most a few unfed tokens for the tree's leading chain.
        self.sync(tokens, LEADING_CHAIN)?;
        let missing = &tokens[self.fed.len()..];
        self.last_missing = missing.to_vec();
        self.last_tree = None;
        let room = self
            .state
            .max_len()
            .saturating_sub(self.fed.len() + missing.len());
        let budget = req.budget.min(room);
        let mut builder = TreeBuilder::new(missing[0]);
        let root = builder.add_chain(0, &missing[1..]);
        // Rows of the last verification, by builder id (attention-only draft models grow the
        // verified tree by each level's new nodes; others re-verify the whole tree).
        let mut rows_of: Vec<Option<usize>> = Vec::new();
        let mut out = Output::default();
        let mut grow = true;
        let mut computed = 0; // builder ids below this are in the pending tree
                              // Open nodes: (builder id, probability of the path below the root).
        let mut open = vec![(root, 1.0f32)];
        let mut added = 0;
        for _level in 0..req.max_depth {
            if open.is_empty() || added >= budget {
                break;
            }
            self.verify_new(&builder, &mut computed, &mut grow, &mut rows_of, &mut out)?;
            let logits = &out.logits;
            let width = self
                .head
                .as_ref()
                .map_or(self.model.config.vocab, |h| h.rows);
            let mut next = Vec::new();
            // Most likely paths first, so a tight budget keeps the best ones.
            open.sort_by(|a, b| b.1.total_cmp(&a.1));
            for &(id, p) in &open {
                let at = rows_of[id].expect("open nodes were verified");
                let [(t1, p1), (t2, p2)] = Self::top2(&logits[at * width..(at + 1) * width]);
                if added < budget {
                    next.push((builder.add(id, t1), p * p1));
                    added += 1;
                }
                if p1 < self.config.branch_below
                    && p * p2 >= self.config.min_path_prob
                    && added < budget
                {
                    next.push((builder.add(id, t2), p * p2));
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
        // The sequence the target now holds ends with `accepted.tokens`; commit the longest
        // root path of the last draft tree that it contains.
        let Some(tree) = self.last_tree.take() else {
            return Ok(());
        };
        // The target now holds `fed`, then the tree's leading chain up to its root, then the
        // accepted tokens after the root: that is what the tree's root path must spell.
        let chain = self.last_missing.len() - 1;
        if accepted.tokens.is_empty()
            || accepted.committed_len != self.fed.len() + chain + accepted.tokens.len()
        {
            return Ok(()); // out of step; the next draft resynchronises
        }
        let mut want = self.last_missing[..chain].to_vec();
        want.extend_from_slice(accepted.tokens);
        let (parents, toks) = tree;
        let mut path = Vec::new();
        if toks.first() == Some(&want[0]) {
            path.push(0);
            let mut node = 0;
            for &t in &want[1..] {
                match (node + 1..toks.len()).find(|&c| parents[c] == node && toks[c] == t) {
                    Some(c) => {
                        path.push(c);
                        node = c;
                    }
                    None => break,
                }
            }
        }
        if path.is_empty() {
            return Ok(());
        }
        self.model.commit(&mut self.state, &path)?;
        self.fed.extend(path.iter().map(|&i| toks[i]));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::golden::fixture_dir;

    /// The drafter proposes the draft model's own greedy continuation (a model drafting for
    /// itself), and its cache stays equal to plain decoding's through commits.
    #[test]
    fn self_drafting_predicts_greedy_decoding() {
        // A hybrid model re-verifies its tree each level; an attention-only one grows it.
        for rel in ["qwen3_5/tiny/model-f32.gguf", "llama/tiny/model-f32.gguf"] {
            self_drafting(&fixture_dir(rel));
        }
    }

    fn self_drafting(path: &std::path::Path) {
        let model = Arc::new(Model::load(path).unwrap());
        let vocab = model.config.vocab;
        let config = DraftModelConfig {
            vocab_rows: 0,
            branch_below: 0.0,
            min_path_prob: 0.0,
        };
        let mut d = DraftModelDrafter::new(model.clone(), 128, vocab, config).unwrap();
        let mut seq: Vec<u32> = vec![3, 7, 11, 2, 5];
        d.start(&seq, Features::default()).unwrap();
        // Greedy plain decoding of 24 tokens.
        let mut st = model.new_state(128);
        let mut logits = model.forward(&mut st, &seq, Logits::Last).unwrap();
        let mut greedy = Vec::new();
        for _ in 0..24 {
            let t = crate::sampler::argmax(&logits);
            greedy.push(t);
            logits = model.forward(&mut st, &[t], Logits::Last).unwrap();
        }
        // Root = first greedy token; the draft must continue greedily.
        seq.push(greedy[0]);
        let tree = d
            .draft(&DraftRequest {
                tokens: &seq,
                budget: 4,
                max_depth: 4,
            })
            .unwrap();
        assert_eq!(tree.tokens(), &greedy[..5]);
        // The target accepts 2 drafts: commit root + 2, then draft again from the new root.
        let committed = greedy[..3].to_vec();
        let len = seq.len() - 1 + committed.len();
        d.accept(&Accepted {
            tokens: &committed,
            committed_len: len,
            features: Features::default(),
        })
        .unwrap();
        let mut seq2 = seq[..seq.len() - 1].to_vec();
        seq2.extend_from_slice(&greedy[..4]);
        let tree = d
            .draft(&DraftRequest {
                tokens: &seq2,
                budget: 3,
                max_depth: 3,
            })
            .unwrap();
        assert_eq!(tree.tokens(), &greedy[3..7]);

        // Four tokens decoded without drafting: a gap this short is left to the next tree's
        // leading chain (catching up feeds nothing), and the draft still continues greedily.
        let mut seq3 = seq2[..seq2.len() - 1].to_vec();
        seq3.extend_from_slice(&greedy[3..8]);
        let fed = d.fed.clone();
        d.catch_up(&seq3).unwrap();
        assert_eq!(d.fed, fed);
        assert!(seq3.len() - d.fed.len() <= LEADING_CHAIN);
        let tree = d
            .draft(&DraftRequest {
                tokens: &seq3,
                budget: 3,
                max_depth: 3,
            })
            .unwrap();
        assert_eq!(tree.tokens(), &greedy[7..11]);

        // Twelve more without drafting: catching up feeds all but the last LEADING_CHAIN.
        let mut seq4 = seq3[..seq3.len() - 1].to_vec();
        seq4.extend_from_slice(&greedy[7..20]);
        d.catch_up(&seq4).unwrap();
        assert_eq!(d.fed, seq4[..seq4.len() - LEADING_CHAIN]);
        let tree = d
            .draft(&DraftRequest {
                tokens: &seq4,
                budget: 3,
                max_depth: 3,
            })
            .unwrap();
        assert_eq!(tree.tokens(), &greedy[19..23]);
    }
}
