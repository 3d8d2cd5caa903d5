//! Speculative verification: one forward pass over every node of a token tree, and the
//! commit of the path the caller accepts.
//!
//! [`Model::verify`] runs the tree's nodes as one batch. Attention layers place node `i` at
//! position `len + depth(i)` and let it see the committed context and its ancestors; Gated
//! DeltaNet layers compute each node from the committed state along its own path. Every
//! node's logits therefore have the bits plain decoding of its path would give. Nothing
//! committed is written: attention keys and values of the nodes wait past the end of each
//! cache, and the recurrent layers keep what the commit needs.
//!
//! [`Model::commit`] then keeps one root-to-node path: each layer state commits it its own
//! way (KV rows compacted into place; recurrent state replayed along the path; conv state
//! taken from the path's last inputs) and the state grows by the path's length. No layer
//! snapshots or restores its state. Any other forward pass discards an uncommitted tree.

use super::mixer::{GdnPending, Mixer};
use super::state::{LayerState, ModelState};
use super::transformer::{residual_and_mlp, Model};
use super::tree::TokenTree;
use super::ModelError;
use crate::kernels::matmul::MatMulWeight;

/// What a verification pass leaves in the state until its commit.
#[derive(Clone, Debug)]
pub struct PendingTree {
    /// Node `i`'s parent (`usize::MAX` for the root) and depth; a child always comes after
    /// its parent (depth-first order, or the order a growing tree added its nodes).
    parents: Vec<usize>,
    depths: Vec<usize>,
    /// Per layer: the recurrent layers' commit data (`None` for attention layers).
    layers: Vec<Option<GdnPending>>,
}

impl PendingTree {
    /// Whether `path` runs from the root down, each node a child of the one before.
    fn is_root_path(&self, path: &[usize]) -> bool {
        path.first() == Some(&0)
            && path.iter().all(|&i| i < self.parents.len())
            && path.windows(2).all(|w| self.parents[w[1]] == w[0])
    }
}

/// The result of [`Model::verify`].
#[derive(Clone, Debug, Default)]
pub struct Verified {
    /// `nodes × vocab` (or the head's rows): row `i` scores the token after node `i`.
    pub logits: Vec<f32>,
    /// `nodes × hidden` final-normed hidden states (what MTP and other drafters read), when
    /// asked for; empty otherwise.
    pub hidden: Vec<f32>,
    /// The outputs of the requested decoder layers (before the final norm),
    /// `nodes × taps × hidden`, node by node; empty when none were asked for.
    pub taps: Vec<f32>,
}

/// What a verification returns besides logits.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outputs {
    /// The final-normed hidden states.
    pub hidden: bool,
    /// Decoder layers (0-based) whose outputs to return.
    pub taps: Vec<usize>,
}

impl Model {
    /// Runs every node of `tree` in one pass (see the module doc) and returns their logits
    /// (and final-normed hidden states when `want_hidden`). The tree stays pending in `state`
    /// until [`Model::commit`]; a previous pending tree is discarded first.
    pub fn verify(
        &self,
        state: &mut ModelState,
        tree: &TokenTree,
        want_hidden: bool,
    ) -> Result<Verified, ModelError> {
        let want = Outputs {
            hidden: want_hidden,
            taps: Vec::new(),
        };
        self.verify_with_head(state, tree, None, &want)
    }

    /// [`Model::verify`] with logits from `head` instead of the model's own LM head (e.g. its
    /// first rows only: a drafter's reduced vocabulary).
    pub fn verify_with_head(
        &self,
        state: &mut ModelState,
        tree: &TokenTree,
        head: Option<&MatMulWeight>,
        want: &Outputs,
    ) -> Result<Verified, ModelError> {
        state.discard_pending();
        self.check(state, tree.tokens())?;
        self.check_taps(&want.taps)?;
        let n = tree.len();
        if n == 0 {
            return Ok(Verified::default());
        }
        let h = self.config.hidden;
        let (parents, depths) = (tree.parents(), tree.depths());
        let mut x = vec![0f32; n * h];
        self.embedding.lookup(tree.tokens(), &mut x);
        let mut normed = vec![0f32; n * h];
        let mut delta = vec![0f32; n * h];
        let mut pending = Vec::with_capacity(self.layers.len());
        let mut taps = vec![0f32; n * want.taps.len() * h];
        for (l, (layer, st)) in self.layers.iter().zip(state.layers.iter_mut()).enumerate() {
            layer.attn_norm.forward(&x, &mut normed);
            let p = match (&layer.mixer, st) {
                (Mixer::Attention(a), LayerState::Kv(cache)) => {
                    a.forward_tree(cache, &normed, parents, depths, &mut delta);
                    None
                }
                (Mixer::GatedDeltaNet(g), LayerState::Gdn(s)) => {
                    Some(g.forward_tree(s, &normed, parents, &mut delta))
                }
                _ => unreachable!("`check` matched every layer with its state"),
            };
            pending.push(p);
            residual_and_mlp(
                &mut x,
                &mut delta,
                &layer.ffn_norm,
                &layer.mlp,
                &mut normed,
                n,
            );
            Model::capture_taps(&want.taps, l, &x, h, 0, &mut taps);
        }
        state.pending = Some(Box::new(PendingTree {
            parents: parents.to_vec(),
            depths: depths.to_vec(),
            layers: pending,
        }));
        self.output_norm.forward(&x, &mut normed);
        let logits = self.head_logits_with(&normed, head);
        Ok(Verified {
            logits,
            hidden: if want.hidden { normed } else { Vec::new() },
            taps,
        })
    }

    /// Grows the pending tree by `tokens`, node `k` a child of `parents[k]` (an index into the
    /// pending tree, or into these new nodes as `pending size + j`, always before it), and
    /// computes only the new nodes: their logits (`tokens.len()` rows, from `head` or the LM
    /// head) have the bits [`Model::verify`] of the whole tree would give them. A drafter
    /// grows its tree a level at a time this way. Attention-only models (a recurrent layer
    /// would need its scratch states back): other models get an `Unsupported` error.
    pub fn verify_more(
        &self,
        state: &mut ModelState,
        parents: &[usize],
        tokens: &[u32],
        head: Option<&MatMulWeight>,
    ) -> Result<Verified, ModelError> {
        let Some(mut pending) = state.pending.take() else {
            return Err(ModelError::StateMismatch(
                "verify_more without a verified tree".into(),
            ));
        };
        let first = pending.parents.len();
        let bad = |state: &mut ModelState, pending: Box<PendingTree>, e: ModelError| {
            state.pending = Some(pending);
            Err(e)
        };
        if pending.layers.iter().any(Option::is_some) {
            return bad(
                state,
                pending,
                ModelError::Unsupported("growing a verified tree through recurrent layers".into()),
            );
        }
        if parents.len() != tokens.len() || parents.iter().enumerate().any(|(k, &p)| p >= first + k)
        {
            return bad(
                state,
                pending,
                ModelError::StateMismatch("verify_more: a parent after its child".into()),
            );
        }
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= self.config.vocab) {
            return bad(
                state,
                pending,
                ModelError::TokenOutOfRange {
                    token: t,
                    vocab: self.config.vocab,
                },
            );
        }
        if state.len + first + tokens.len() > state.max_len {
            let (len, max_len) = (state.len, state.max_len);
            return bad(
                state,
                pending,
                ModelError::ContextFull {
                    len,
                    new: first + tokens.len(),
                    max_len,
                },
            );
        }
        let n = tokens.len();
        if n == 0 {
            state.pending = Some(pending);
            return Ok(Verified::default());
        }
        for (k, &p) in parents.iter().enumerate() {
            let d = pending.depths[p] + 1;
            pending.parents.push(p);
            pending.depths.push(d);
            debug_assert_eq!(pending.parents.len(), first + k + 1);
        }
        let h = self.config.hidden;
        let mut x = vec![0f32; n * h];
        self.embedding.lookup(tokens, &mut x);
        let mut normed = vec![0f32; n * h];
        let mut delta = vec![0f32; n * h];
        let base = state.len;
        for (layer, st) in self.layers.iter().zip(state.layers.iter_mut()) {
            layer.attn_norm.forward(&x, &mut normed);
            match (&layer.mixer, st) {
                (Mixer::Attention(a), LayerState::Kv(cache)) => a.forward_tree_more(
                    cache,
                    base,
                    &normed,
                    &pending.parents,
                    &pending.depths,
                    first,
                    &mut delta,
                ),
                _ => unreachable!("checked: attention layers only"),
            }
            residual_and_mlp(
                &mut x,
                &mut delta,
                &layer.ffn_norm,
                &layer.mlp,
                &mut normed,
                n,
            );
        }
        state.pending = Some(pending);
        self.output_norm.forward(&x, &mut normed);
        let logits = self.head_logits_with(&normed, head);
        Ok(Verified {
            logits,
            ..Verified::default()
        })
    }

    /// Commits `path` of the pending tree (node indices from the root down, each a child of
    /// the one before; the root alone is a path): the state then holds exactly what plain
    /// decoding of those tokens would have left. Other nodes are dropped.
    pub fn commit(&self, state: &mut ModelState, path: &[usize]) -> Result<(), ModelError> {
        let Some(pending) = state.pending.take() else {
            return Err(ModelError::StateMismatch(
                "commit without a verified tree".into(),
            ));
        };
        if !pending.is_root_path(path) {
            let len = state.len;
            state.pending = Some(pending);
            state.discard_pending();
            debug_assert_eq!(state.len, len);
            return Err(ModelError::StateMismatch(format!(
                "commit: {path:?} is not a path from the root of the verified tree"
            )));
        }
        let base = state.len;
        for ((layer, st), p) in self
            .layers
            .iter()
            .zip(state.layers.iter_mut())
            .zip(&pending.layers)
        {
            match (&layer.mixer, st, p) {
                (Mixer::Attention(_), LayerState::Kv(cache), None) => cache.commit(base, path),
                (Mixer::GatedDeltaNet(g), LayerState::Gdn(s), Some(p)) => g.commit(s, p, path),
                _ => unreachable!("the pending tree was made for these layers"),
            }
        }
        state.len += path.len();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::config::{Arch, SourceKind};
    use crate::model::testing::{random_weights, tiny_config};
    use crate::model::tree::{TreeBuilder, NO_PARENT};
    use crate::model::{Logits, ModelError};

    fn models() -> Vec<(&'static str, Model)> {
        let mut out = Vec::new();
        for (name, arch) in [
            ("llama", Arch::Llama),
            ("qwen2", Arch::Qwen2),
            ("qwen3", Arch::Qwen3),
        ] {
            let cfg = tiny_config(arch, SourceKind::Gguf);
            let src = random_weights(&cfg, 5);
            out.push((name, Model::from_source(cfg, &src).unwrap()));
        }
        let hybrid = crate::model::golden::fixture_dir("qwen3_5/tiny").join("model-f32.gguf");
        out.push(("qwen35 hybrid", Model::load(hybrid).unwrap()));
        out
    }

    /// A tree with branching at several depths.
    fn sample_tree(vocab: u32) -> TokenTree {
        let t = |i: u32| (i * 7 + 3) % vocab;
        let mut b = TreeBuilder::new(t(1));
        let a = b.add(0, t(2));
        let c = b.add(a, t(3));
        b.add(c, t(4));
        b.add(c, t(5));
        let d = b.add(a, t(6));
        b.add(d, t(7));
        let e = b.add(0, t(8));
        b.add(e, t(9));
        b.add(0, t(10));
        b.build().0
    }

    fn same_bits(a: &[f32], b: &[f32]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
    }

    /// Each node's logits equal plain decoding of its path token by token, bit for bit.
    #[test]
    fn tree_logits_equal_decoding_each_path() {
        for (name, model) in models() {
            let vocab = model.config.vocab;
            let prompt: Vec<u32> = (0..6).map(|i| (i * 5 + 1) % vocab as u32).collect();
            let tree = sample_tree(vocab as u32);
            let mut state = model.new_state(64);
            model.forward(&mut state, &prompt, Logits::Last).unwrap();
            let verified = model.verify(&mut state, &tree, true).unwrap();
            assert_eq!(verified.logits.len(), tree.len() * vocab);
            for node in 0..tree.len() {
                let mut plain = model.new_state(64);
                model.forward(&mut plain, &prompt, Logits::Last).unwrap();
                let mut last = Vec::new();
                for i in tree.path(node) {
                    last = model
                        .forward(&mut plain, &[tree.token(i)], Logits::Last)
                        .unwrap();
                }
                assert!(
                    same_bits(&last, &verified.logits[node * vocab..(node + 1) * vocab]),
                    "{name}: node {node}"
                );
            }
        }
    }

    /// After a commit the state equals plain decoding's (KV rows, recurrent and conv
    /// states), and decoding continues identically.
    #[test]
    fn commit_leaves_the_state_plain_decoding_leaves() {
        for (name, model) in models() {
            let vocab = model.config.vocab;
            let prompt: Vec<u32> = (0..5).map(|i| (i * 3 + 2) % vocab as u32).collect();
            let tree = sample_tree(vocab as u32);
            for leaf in [0, 3, 4, 6, tree.len() - 1] {
                let path = tree.path(leaf);
                let mut spec = model.new_state(64);
                model.forward(&mut spec, &prompt, Logits::Last).unwrap();
                // A rejected verification first, to check nothing leaks from it.
                model
                    .verify(&mut spec, &sample_tree(vocab as u32 - 1), false)
                    .unwrap();
                model.verify(&mut spec, &tree, false).unwrap();
                model.commit(&mut spec, &path).unwrap();

                let mut plain = model.new_state(64);
                model.forward(&mut plain, &prompt, Logits::Last).unwrap();
                for &i in &path {
                    model
                        .forward(&mut plain, &[tree.token(i)], Logits::Last)
                        .unwrap();
                }
                assert_eq!(spec.len, plain.len, "{name}");
                for (l, (a, b)) in spec.layers.iter().zip(&plain.layers).enumerate() {
                    match (a, b) {
                        (LayerState::Kv(a), LayerState::Kv(b)) => {
                            for h in 0..a.n_kv_heads() {
                                assert!(same_bits(a.keys(h), b.keys(h)), "{name} l{l} keys");
                                assert!(same_bits(a.values(h), b.values(h)), "{name} l{l} v");
                            }
                        }
                        (LayerState::Gdn(a), LayerState::Gdn(b)) => {
                            assert!(same_bits(&a.ssm, &b.ssm), "{name} l{l} ssm, leaf {leaf}");
                            assert!(same_bits(&a.conv, &b.conv), "{name} l{l} conv");
                        }
                        _ => panic!("layer kinds differ"),
                    }
                }
                let next = [(leaf as u32 * 11 + 1) % vocab as u32];
                let a = model.forward(&mut spec, &next, Logits::Last).unwrap();
                let b = model.forward(&mut plain, &next, Logits::Last).unwrap();
                assert!(same_bits(&a, &b), "{name}: decoding after the commit");
            }
        }
    }

    /// A tree grown level by level gives its nodes the bits of verifying it whole, and its
    /// paths commit like any other.
    #[test]
    fn growing_a_tree_equals_verifying_it_whole() {
        for (name, model) in models() {
            let vocab = model.config.vocab;
            let prompt = [3u32, 1, 4, 1, 5];
            // Insertion order: 0 root; 1, 2 under 0; 3 under 1; 4 under 3; 5 under 2.
            let parents = [NO_PARENT, 0, 0, 1, 3, 2];
            let tokens: Vec<u32> = (0..6).map(|i| (i * 13 + 2) % vocab as u32).collect();
            let mut whole_state = model.new_state(64);
            model
                .forward(&mut whole_state, &prompt, Logits::Last)
                .unwrap();
            // The same tree in depth-first order: 0 1 3 4 2 5.
            let dfs = [0usize, 1, 3, 4, 2, 5];
            let mut b = TreeBuilder::new(tokens[0]);
            let mut ids = [0usize; 6];
            for i in 1..6 {
                ids[i] = b.add(ids[parents[i]], tokens[i]);
            }
            let (tree, index) = b.build();
            assert_eq!(index, vec![0, 1, 4, 2, 3, 5]);
            let whole = model.verify(&mut whole_state, &tree, false).unwrap();

            let mut st = model.new_state(64);
            model.forward(&mut st, &prompt, Logits::Last).unwrap();
            let grown = match model.verify_more(&mut st, &[], &[], None) {
                Err(_) => model.verify(&mut st, &TokenTree::chain(&tokens[..1]), false),
                Ok(_) => panic!("{name}: verify_more without a tree must fail"),
            }
            .unwrap();
            let mut rows = grown.logits;
            for (lo, hi) in [(1, 3), (3, 4), (4, 6)] {
                match model.verify_more(&mut st, &parents[lo..hi], &tokens[lo..hi], None) {
                    Ok(v) => rows.extend(v.logits),
                    Err(ModelError::Unsupported(_)) => {
                        assert!(name.contains("hybrid"), "{name}");
                        rows.clear();
                        break;
                    }
                    Err(e) => panic!("{name}: {e}"),
                }
            }
            if rows.is_empty() {
                continue;
            }
            for i in 0..6 {
                let d = index[i];
                assert!(
                    same_bits(
                        &rows[i * vocab..(i + 1) * vocab],
                        &whole.logits[d * vocab..(d + 1) * vocab]
                    ),
                    "{name}: node {i}"
                );
            }
            let _ = dfs;
            // Commit the path 0 → 1 → 3 → 4 (insertion ids) and compare with the whole tree's.
            model.commit(&mut st, &[0, 1, 3, 4]).unwrap();
            model.commit(&mut whole_state, &[0, 1, 2, 3]).unwrap();
            let next = [7u32];
            let a = model.forward(&mut st, &next, Logits::Last).unwrap();
            let b = model
                .forward(&mut whole_state, &next, Logits::Last)
                .unwrap();
            assert!(same_bits(&a, &b), "{name}: after the commit");
        }
    }

    #[test]
    fn bad_commits_are_errors_and_keep_the_state() {
        let (_, model) = models().pop().unwrap();
        let mut state = model.new_state(64);
        model.forward(&mut state, &[1, 2, 3], Logits::Last).unwrap();
        assert!(model.commit(&mut state, &[0]).is_err());
        let tree = sample_tree(model.config.vocab as u32);
        model.verify(&mut state, &tree, false).unwrap();
        assert!(model.commit(&mut state, &[0, 3]).is_err());
        assert!(
            model.commit(&mut state, &[0, 1]).is_err(),
            "the tree was discarded"
        );
        assert_eq!(state.len, 3);
        // The state still decodes.
        model.forward(&mut state, &[4], Logits::Last).unwrap();
        assert_eq!(state.len, 4);
    }
}
