//! Drafting with a DFlash block drafter (`model::DFlash`): one small pass over `[last token,
//! MASK × (B−1)]` gives the marginals of the next `B − 1` tokens, and the tree is the
//! budget's best paths under their product (`marginal_tree`). The drafter's context is
//! the target's own layer outputs: every committed token's features arrive with the commit
//! (`Drafter::tap_layers`) and are projected once into the drafter's context cache, so a
//! draft costs one block pass whatever the tree's depth.
//!
//! Prompt lookup's branches (`NgramDrafter`) can join the tree: they go in first, limited to
//! a few nodes, and the marginals' best paths fill the rest of the budget, sharing the nodes
//! the lookup already placed (research/dflash_experiment.md §3.3: the two find different
//! tokens, and one tree of both beats either alone).
//!
//! The drafter's context follows the target's sequence: it remembers which tokens its rows
//! belong to, keeps the rows of a prompt's reused prefix at the start of the next answer, and
//! drops the rest. Rows it never got features for (a prefix the target took from a cache)
//! are simply missing: drafts get worse, never wrong, since the target verifies them.

use std::any::Any;
use std::sync::Arc;

use super::drafter::{Accepted, DeviceTaps, DraftError, DraftRequest, Drafter, Features};
use super::marginal_tree::{add_best_paths, top_k_log_probs};
use super::ngram::NgramDrafter;
use crate::kernels::matmul::MatMulWeight;
use crate::model::dflash::Block;
use crate::model::{DFlash, DFlashContext, Model, TokenTree, TreeBuilder};

/// DFlash drafter settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DFlashDrafterConfig {
    /// Token ids the drafter scores: `0..vocab_rows` of the target's head (0 = all). BPE
    /// vocabularies put frequent tokens first, and a smaller head makes each draft cheaper.
    pub vocab_rows: usize,
    /// Candidates per depth the tree may choose among.
    pub top_k: usize,
    /// Nodes prompt lookup may place in the tree first (0: marginals only).
    pub lookup_nodes: usize,
}

impl Default for DFlashDrafterConfig {
    fn default() -> Self {
        DFlashDrafterConfig {
            vocab_rows: 32768,
            top_k: 8,
            lookup_nodes: 4,
        }
    }
}

/// The network side of a DFlash drafter: the context rows it keeps for one sequence and the
/// block pass over them. The CPU's is [`CpuDFlash`]; a device can implement it over its own
/// memory (kasoku-cuda's drafter), and [`BlockDrafter`] then follows the target's sequence and
/// builds the trees the same way over either.
pub trait DFlashBlocks: Send {
    /// The target's decoder layers whose outputs a committed token's features are.
    fn tap_layers(&self) -> Vec<usize>;
    /// Values of one token's features (taps × hidden).
    fn feature_width(&self) -> usize;
    /// Tokens per block (the root and `block_size − 1` masks).
    fn block_size(&self) -> usize;
    /// The position of each context row, in the order the rows were added.
    fn context_positions(&self) -> &[usize];
    /// Keeps the first `rows` context rows.
    fn truncate_context(&mut self, rows: usize);
    /// Projects the features of tokens at `positions` (`positions.len()` rows of
    /// [`DFlashBlocks::feature_width`] values) into context rows.
    fn append_context(&mut self, features: &[f32], positions: &[usize]) -> Result<(), DraftError>;
    /// Whether the network reads a target's recorded layer outputs in place from `source`
    /// (a device state's handle, [`DeviceTaps`]): a network on the target's device. False by
    /// default (the CPU's).
    fn reads_device_taps(&self, source: &(dyn Any + Send + Sync)) -> bool {
        let _ = source;
        false
    }
    /// Projects the features of tokens at `positions`, rows `rows` of the target's last pass
    /// as `source` recorded them, into context rows (asked only where
    /// [`DFlashBlocks::reads_device_taps`] says yes).
    fn append_device_context(
        &mut self,
        source: &(dyn Any + Send + Sync),
        rows: &[usize],
        positions: &[usize],
    ) -> Result<(), DraftError> {
        let _ = (source, rows, positions);
        Err(DraftError::Incompatible(
            "this DFlash network reads host features only".into(),
        ))
    }
    /// One block pass rooted at `root` (position `pos`): each of the `rows` depths' `top_k`
    /// most likely tokens with their log-probabilities, most likely first.
    fn marginals(
        &mut self,
        root: u32,
        pos: usize,
        rows: usize,
        top_k: usize,
    ) -> Result<Vec<Vec<(u32, f32)>>, DraftError>;
}

/// The DFlash network on the CPU with its context for one sequence.
pub struct CpuDFlash {
    target: Arc<Model>,
    net: Arc<DFlash>,
    ctx: DFlashContext,
    /// The first rows of the target's head, when drafting scores fewer tokens.
    head: Option<MatMulWeight>,
    logits: Vec<f32>,
}

impl CpuDFlash {
    /// The network `net` for `target`, scoring token ids `0..vocab_rows` (rounded up to a
    /// multiple of 8; 0 or the vocabulary: all).
    pub fn new(
        target: Arc<Model>,
        net: Arc<DFlash>,
        vocab_rows: usize,
    ) -> Result<CpuDFlash, DraftError> {
        net.config
            .check_target(&target)
            .map_err(DraftError::Incompatible)?;
        let vocab = target.config.vocab;
        let head = (vocab_rows > 0 && vocab_rows < vocab)
            .then(|| target.head.first_rows(vocab_rows.div_ceil(8) * 8));
        Ok(CpuDFlash {
            ctx: net.new_context(),
            target,
            net,
            head,
            logits: Vec::new(),
        })
    }

    /// The raw logits of the last block pass (`rows × head rows`).
    pub fn last_logits(&self) -> &[f32] {
        &self.logits
    }

    /// The network.
    pub fn net(&self) -> &Arc<DFlash> {
        &self.net
    }
}

impl DFlashBlocks for CpuDFlash {
    fn tap_layers(&self) -> Vec<usize> {
        self.net.config.taps.clone()
    }

    fn feature_width(&self) -> usize {
        self.net.feature_width()
    }

    fn block_size(&self) -> usize {
        self.net.config.block_size
    }

    fn context_positions(&self) -> &[usize] {
        self.ctx.positions()
    }

    fn truncate_context(&mut self, rows: usize) {
        self.ctx.truncate(rows);
    }

    fn append_context(&mut self, features: &[f32], positions: &[usize]) -> Result<(), DraftError> {
        self.net
            .append_context(&mut self.ctx, features, positions)?;
        Ok(())
    }

    fn marginals(
        &mut self,
        root: u32,
        pos: usize,
        rows: usize,
        top_k: usize,
    ) -> Result<Vec<Vec<(u32, f32)>>, DraftError> {
        let head = self.head.as_ref().unwrap_or(&self.target.head);
        let block = Block {
            root,
            pos,
            rows,
            head,
        };
        self.net
            .draft(&self.target, &mut self.ctx, block, &mut self.logits)?;
        Ok(top_k_log_probs(&self.logits, head.rows, top_k))
    }
}

/// A DFlash drafter on the CPU.
pub type DFlashDrafter = BlockDrafter<CpuDFlash>;

impl BlockDrafter<CpuDFlash> {
    /// A drafter over `net` for `target` (the network was loaded for it).
    pub fn new(
        target: Arc<Model>,
        net: Arc<DFlash>,
        config: DFlashDrafterConfig,
    ) -> Result<DFlashDrafter, DraftError> {
        let blocks = CpuDFlash::new(target, net, config.vocab_rows)?;
        Ok(BlockDrafter::over(blocks, config))
    }

    /// The raw logits of the last [`BlockDrafter::marginals`] call (`rows × head rows`).
    pub fn last_logits(&self) -> &[f32] {
        self.blocks.last_logits()
    }
}

/// A DFlash drafter over any [`DFlashBlocks`]: its context follows the target's sequence, and
/// each tree is prompt lookup's branch merged with the marginals' best paths.
pub struct BlockDrafter<N: DFlashBlocks> {
    blocks: N,
    config: DFlashDrafterConfig,
    /// The sequence the context rows belong to (positions `0..known.len()`).
    known: Vec<u32>,
    lookup: NgramDrafter,
}

impl<N: DFlashBlocks> BlockDrafter<N> {
    /// A drafter over `blocks` with `config` (its `vocab_rows` is the network's business).
    pub fn over(blocks: N, config: DFlashDrafterConfig) -> BlockDrafter<N> {
        BlockDrafter {
            blocks,
            config,
            known: Vec::new(),
            lookup: NgramDrafter::default(),
        }
    }

    /// The network and its context.
    pub fn blocks(&self) -> &N {
        &self.blocks
    }

    /// The marginals of the `rows` tokens after `root` at position `pos`: each depth's top-k
    /// with log-probabilities.
    pub fn marginals(
        &mut self,
        root: u32,
        pos: usize,
        rows: usize,
    ) -> Result<Vec<Vec<(u32, f32)>>, DraftError> {
        self.blocks.marginals(root, pos, rows, self.config.top_k)
    }

    /// Drops the context rows of positions `from..` (they belong to another sequence).
    fn forget_from(&mut self, from: usize) {
        let keep = self
            .blocks
            .context_positions()
            .iter()
            .take_while(|&&p| p < from)
            .count();
        self.blocks.truncate_context(keep);
        self.known.truncate(from);
    }

    /// Adds the features of the tokens at positions `first..first + n` (`taps` rows of
    /// `stride` values, the drafter's own taps first in each).
    fn ingest(&mut self, first: usize, taps: &[f32], n: usize) -> Result<(), DraftError> {
        let width = self.blocks.feature_width();
        if n == 0 || !taps.len().is_multiple_of(n) || taps.len() / n < width {
            return Ok(()); // features not as asked: the drafter drafts from what it has
        }
        let stride = taps.len() / n;
        let rows: Vec<f32> = if stride == width {
            taps.to_vec()
        } else {
            taps.chunks_exact(stride)
                .flat_map(|r| r[..width].iter().copied())
                .collect()
        };
        let positions: Vec<usize> = (first..first + n).collect();
        self.blocks.append_context(&rows, &positions)
    }

    /// The device taps of `features`, when the network reads them in place.
    fn device_taps<'a>(&self, features: &Features<'a>) -> Option<DeviceTaps<'a>> {
        features
            .device_taps
            .filter(|d| self.blocks.reads_device_taps(d.source))
    }

    /// Adds the features of the tokens at positions `first..first + rows.len()`: rows `rows`
    /// of the target's last pass, read on the device.
    fn ingest_device(&mut self, first: usize, taps: DeviceTaps) -> Result<(), DraftError> {
        if taps.rows.is_empty() {
            return Ok(());
        }
        let positions: Vec<usize> = (first..first + taps.rows.len()).collect();
        self.blocks
            .append_device_context(taps.source, taps.rows, &positions)
    }
}

/// The tree a DFlash drafter proposes for `req`: up to `config.lookup_nodes` nodes of prompt
/// lookup's branches first, then the budget's best paths under the marginals `marginals(root,
/// pos, rows)` gives for the `rows` depths below the root (asked only when a block of
/// `block_size` has rows to score and `fresh` says the context does not already hold the
/// root's position). Shared by every [`DFlashBlocks`].
pub fn dflash_tree(
    req: &DraftRequest,
    config: &DFlashDrafterConfig,
    block_size: usize,
    lookup: &mut NgramDrafter,
    fresh: impl FnOnce(usize) -> bool,
    marginals: impl FnOnce(u32, usize, usize) -> Result<Vec<Vec<(u32, f32)>>, DraftError>,
) -> Result<TokenTree, DraftError> {
    let Some(&root) = req.tokens.last() else {
        return Ok(TokenTree::chain(&[]));
    };
    let pos = req.tokens.len() - 1;
    let mut tree = TreeBuilder::new(root);
    let lookup_nodes = config.lookup_nodes.min(req.budget);
    if lookup_nodes > 0 {
        let found = lookup.tree(req.tokens, lookup_nodes, req.max_depth);
        let mut ids = vec![0usize; found.len()];
        for i in 1..found.len() {
            let p = found.parent(i).expect("below the root");
            ids[i] = tree.add(ids[p], found.token(i));
        }
    }
    let left = (req.budget + 1).saturating_sub(tree.len());
    let rows = (block_size - 1).min(req.max_depth).min(left);
    if rows > 0 && fresh(pos) {
        let cands = marginals(root, pos, rows)?;
        add_best_paths(&mut tree, 0, &cands, left, req.max_depth);
    }
    Ok(tree.build().0)
}

impl<N: DFlashBlocks> Drafter for BlockDrafter<N> {
    fn name(&self) -> &'static str {
        "dflash"
    }

    fn tap_layers(&self) -> Vec<usize> {
        self.blocks.tap_layers()
    }

    fn flat_draft_cost(&self) -> bool {
        true
    }

    fn reads_device_taps(&self, source: &(dyn Any + Send + Sync)) -> bool {
        self.blocks.reads_device_taps(source)
    }

    fn start(&mut self, prompt: &[u32], features: Features) -> Result<(), DraftError> {
        // The features cover the last `m` prompt tokens: host rows, or rows the target left
        // on its device.
        let dev = self.device_taps(&features);
        let width = self.blocks.feature_width();
        let taps = features.taps.unwrap_or(&[]);
        let m = dev
            .map_or(taps.len() / width.max(1), |d| d.rows.len())
            .min(prompt.len());
        let fresh = prompt.len() - m;
        let common = self
            .known
            .iter()
            .zip(prompt)
            .take_while(|(a, b)| a == b)
            .count();
        self.forget_from(common.min(fresh));
        match dev {
            Some(d) => self.ingest_device(
                fresh,
                DeviceTaps {
                    rows: &d.rows[..m],
                    ..d
                },
            )?,
            None => self.ingest(fresh, &taps[..m * width], m)?,
        }
        self.known = prompt.to_vec();
        Ok(())
    }

    fn draft(&mut self, req: &DraftRequest) -> Result<TokenTree, DraftError> {
        let BlockDrafter {
            blocks,
            config,
            lookup,
            ..
        } = self;
        let block_size = blocks.block_size();
        let top_k = config.top_k;
        let last = blocks.context_positions().last().copied();
        dflash_tree(
            req,
            config,
            block_size,
            lookup,
            |pos| last.is_none_or(|p| p < pos),
            |root, pos, rows| blocks.marginals(root, pos, rows, top_k),
        )
    }

    fn accept(&mut self, accepted: &Accepted) -> Result<(), DraftError> {
        let n = accepted.tokens.len();
        let Some(first) = accepted.committed_len.checked_sub(n) else {
            return Ok(());
        };
        if first < self.known.len() {
            self.forget_from(first);
        }
        if first == self.known.len() {
            self.known.extend_from_slice(accepted.tokens);
        } else {
            // A gap the drafter was not told about: keep the rows, forget the tokens.
            self.known.clear();
        }
        if let Some(dev) = self.device_taps(&accepted.features) {
            if dev.rows.len() == n {
                self.ingest_device(first, dev)?;
            }
        } else if let Some(taps) = accepted.features.taps {
            self.ingest(first, taps, n)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::golden::fixture_dir;

    fn setup(config: DFlashDrafterConfig) -> (Arc<Model>, DFlashDrafter) {
        let target = Arc::new(Model::load(fixture_dir("qwen2/tiny/model-f32.gguf")).unwrap());
        let net = Arc::new(DFlash::load(&fixture_dir("qwen2/tiny_dflash"), &target, None).unwrap());
        let d = DFlashDrafter::new(target.clone(), net, config).unwrap();
        (target, d)
    }

    fn taps(target: &Model, d: &DFlashDrafter, tokens: &[u32]) -> Vec<f32> {
        let mut st = target.new_state(64);
        target
            .forward_taps(&mut st, tokens, &d.tap_layers())
            .unwrap()
            .1
    }

    /// Through the drafter interface: the tree's best path is the marginals' argmax at every
    /// depth (the PyTorch reference's, cycle at context 9, root 11), the context follows the
    /// commits, and a new answer keeps the rows of the prompt's reused prefix.
    #[test]
    fn drafts_from_the_targets_features_and_follows_the_sequence() {
        let config = DFlashDrafterConfig {
            vocab_rows: 0,
            top_k: 4,
            lookup_nodes: 0,
        };
        let (target, mut d) = setup(config);
        let prompt = [3, 17, 250, 9, 42, 42, 101, 7, 5];
        d.start(
            &prompt,
            Features {
                hidden: None,
                taps: Some(&taps(&target, &d, &prompt)),
                device_taps: None,
            },
        )
        .unwrap();
        let mut seq = prompt.to_vec();
        seq.push(11);
        let req = DraftRequest {
            tokens: &seq,
            budget: 7,
            max_depth: 7,
        };
        let tree = d.draft(&req).unwrap();
        assert_eq!(tree.len(), 8);
        // The reference's argmax at context 9, root 11 (tools/make_dflash_fixture.py).
        let best = [231u32, 23, 23, 23, 23, 23, 209];
        let w = target.config.vocab;
        for (i, &t) in best.iter().enumerate() {
            assert_eq!(
                crate::sampler::argmax(&d.last_logits()[i * w..(i + 1) * w]),
                t
            );
        }
        assert_eq!(tree.token(1), 231);
        // A tighter budget and depth.
        let small = d
            .draft(&DraftRequest {
                budget: 3,
                max_depth: 2,
                ..req
            })
            .unwrap();
        assert!(small.len() == 4 && small.max_depth() <= 2);

        // The target commits the root and one draft.
        let committed = [11, 231];
        let mut full = prompt.to_vec();
        full.extend_from_slice(&committed);
        let all = taps(&target, &d, &full);
        let width = d.blocks.feature_width();
        d.accept(&Accepted {
            tokens: &committed,
            committed_len: full.len(),
            features: Features {
                hidden: None,
                taps: Some(&all[prompt.len() * width..]),
                device_taps: None,
            },
        })
        .unwrap();
        assert_eq!(d.blocks.context_positions(), (0..11).collect::<Vec<_>>());

        // A new answer whose prompt extends the first 10 tokens: its first 9 rows are kept,
        // the target computed only the last 3.
        let prompt2 = [3, 17, 250, 9, 42, 42, 101, 7, 5, 11, 5, 7];
        let all2 = taps(&target, &d, &prompt2);
        d.start(
            &prompt2,
            Features {
                hidden: None,
                taps: Some(&all2[9 * width..]),
                device_taps: None,
            },
        )
        .unwrap();
        assert_eq!(d.blocks.context_positions(), (0..12).collect::<Vec<_>>());
        // The same drafts as a drafter given every row fresh.
        let mut seq2 = prompt2.to_vec();
        seq2.push(2);
        let req2 = DraftRequest {
            tokens: &seq2,
            budget: 7,
            max_depth: 7,
        };
        let kept = d.draft(&req2).unwrap();
        let (_, mut fresh) = setup(config);
        fresh
            .start(
                &prompt2,
                Features {
                    hidden: None,
                    taps: Some(&all2),
                    device_taps: None,
                },
            )
            .unwrap();
        assert_eq!(fresh.draft(&req2).unwrap(), kept);
        assert_eq!(fresh.last_logits(), d.last_logits());
    }

    /// The shared tree building with made-up marginals: the rows asked for follow the block,
    /// depth and budget; a context that already holds the root's position asks nothing.
    #[test]
    fn dflash_tree_asks_for_the_rows_the_budget_allows() {
        let config = DFlashDrafterConfig {
            vocab_rows: 0,
            top_k: 2,
            lookup_nodes: 0,
        };
        let tokens = [1u32, 2, 3, 4];
        let req = DraftRequest {
            tokens: &tokens,
            budget: 5,
            max_depth: 3,
        };
        let mut lookup = NgramDrafter::default();
        let mut asked = None;
        let tree = dflash_tree(
            &req,
            &config,
            8,
            &mut lookup,
            |_| true,
            |root, pos, rows| {
                asked = Some((root, pos, rows));
                Ok((0..rows)
                    .map(|d| vec![(10 + d as u32, -0.1), (20 + d as u32, -3.0)])
                    .collect())
            },
        )
        .unwrap();
        assert_eq!(asked, Some((4, 3, 3)));
        assert_eq!(tree.token(0), 4);
        let mut node = 0;
        for t in [10, 11, 12] {
            node = tree.child_with(node, t).expect("the best path");
        }
        assert!(tree.len() <= 6 && tree.max_depth() <= 3);
        // A block of 3 scores 2 rows at most; a stale context is not asked.
        let mut rows = 0;
        dflash_tree(
            &req,
            &config,
            3,
            &mut lookup,
            |_| true,
            |_, _, r| {
                rows = r;
                Ok(vec![vec![(9, -0.5)]; r])
            },
        )
        .unwrap();
        assert_eq!(rows, 2);
        let tree = dflash_tree(
            &req,
            &config,
            8,
            &mut lookup,
            |_| false,
            |_, _, _| panic!("not asked"),
        )
        .unwrap();
        assert_eq!(tree.len(), 1);
    }

    /// Prompt lookup's branch goes in first; the marginals fill the rest of the budget.
    #[test]
    fn lookup_branches_join_the_tree_within_the_budget() {
        let (target, mut d) = setup(DFlashDrafterConfig::default());
        let prompt = [3, 17, 250, 9, 42, 3, 17];
        d.start(
            &prompt,
            Features {
                hidden: None,
                taps: Some(&taps(&target, &d, &prompt)),
                device_taps: None,
            },
        )
        .unwrap();
        let mut seq = prompt.to_vec();
        seq.push(250);
        let tree = d
            .draft(&DraftRequest {
                tokens: &seq,
                budget: 6,
                max_depth: 6,
            })
            .unwrap();
        assert_eq!(tree.len(), 7);
        // "3 17 250" was followed by "9 42 3 17": that branch is in the tree.
        let mut node = 0;
        for t in [9, 42, 3, 17] {
            node = tree.child_with(node, t).expect("the lookup branch");
        }
        // Without features the drafter still answers (lookup only, or a lone root).
        let (_, mut blind) = setup(DFlashDrafterConfig::default());
        blind.start(&prompt, Features::default()).unwrap();
        let t = blind
            .draft(&DraftRequest {
                tokens: &seq,
                budget: 6,
                max_depth: 6,
            })
            .unwrap();
        assert!(t.len() <= 7 && t.token(0) == 250);
    }
}
