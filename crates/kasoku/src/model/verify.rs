//! Speculative verification: one forward pass over every node of a token tree, and the
//! commit of the path the caller accepts.
//!
//! A [`Batch::tree`] runs the tree's nodes as one batch. Attention layers place node `i` at
//! position `len + depth(i)` and let it see the committed context and its ancestors; Gated
//! DeltaNet layers compute each node from the committed state along its own path. Every
//! node's logits therefore have the bits plain decoding of its path would give. Nothing
//! committed is written: attention keys and values of the nodes wait past the end of each
//! cache, and the recurrent layers keep what the commit needs. A [`Batch::grow`] adds nodes
//! to the pending tree (attention-only models).
//!
//! [`Model::commit`] then keeps one root-to-node path: each layer state commits it its own
//! way (KV rows compacted into place; recurrent state replayed along the path; conv state
//! taken from the path's last inputs) and the state grows by the path's length. No layer
//! snapshots or restores its state. Any other forward pass discards an uncommitted tree.

use super::batch::{Batch, Output};
use super::state::ModelState;
use super::transformer::Model;
use super::tree::TokenTree;
use super::ModelError;
use crate::backend::Backend;

impl<B: Backend> Model<B> {
    /// Runs every node of `tree` in one pass (see the module doc) and returns their logits
    /// (and final-normed hidden states when `want_hidden`): a [`Model::run`] of
    /// [`Batch::tree`] into a fresh [`Output`]. The tree stays pending in `state` until
    /// [`Model::commit`]; a previous pending tree is discarded first.
    pub fn verify(
        &self,
        state: &mut ModelState<B>,
        tree: &TokenTree,
        want_hidden: bool,
    ) -> Result<Output, ModelError> {
        let mut out = Output::default();
        self.run(state, &Batch::tree(tree).hidden(want_hidden), &mut out)?;
        Ok(out)
    }

    /// Commits `path` of the pending tree (node indices from the root down, each a child of
    /// the one before; the root alone is a path): the state then holds exactly what plain
    /// decoding of those tokens would have left. Other nodes are dropped.
    pub fn commit(&self, state: &mut ModelState<B>, path: &[usize]) -> Result<(), ModelError> {
        if !state.pending.active {
            return Err(ModelError::StateMismatch(
                "commit without a verified tree".into(),
            ));
        }
        if !state.pending.is_root_path(path) {
            let len = state.len;
            state.discard_pending();
            debug_assert_eq!(state.len, len);
            return Err(ModelError::StateMismatch(format!(
                "commit: {path:?} is not a path from the root of the verified tree"
            )));
        }
        state.pending.active = false;
        let base = state.len;
        for (layer, st) in self.layers.iter().zip(state.layers.iter_mut()) {
            layer.mixer.commit(&self.backend, st, base, path);
        }
        state.len += path.len();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::config::{Arch, SourceKind};
    use crate::model::state::LayerState;
    use crate::model::testing::{random_weights, tiny_config};
    use crate::model::tree::{TreeBuilder, NO_PARENT};
    use crate::model::{KvType, Logits, ModelError};

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
        out.push(("qwen35 hybrid", Model::load(&hybrid).unwrap()));
        // Caches stored as f16 and q8_0 (head size 32).
        for (name, kv) in [
            ("qwen35 hybrid, f16 cache", KvType::F16),
            ("qwen35 hybrid, q8_0 cache", KvType::Q8_0),
        ] {
            let mut model = Model::load(&hybrid).unwrap();
            model.set_kv_type(kv).unwrap();
            out.push((name, model));
        }
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
                                let (ka, kb) = (a.keys_f32(h), b.keys_f32(h));
                                let (va, vb) = (a.values_f32(h), b.values_f32(h));
                                assert!(same_bits(&ka, &kb), "{name} l{l} keys");
                                assert!(same_bits(&va, &vb), "{name} l{l} v");
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
            let mut out = Output::default();
            let grown = match model.run(&mut st, &Batch::grow(&[], &[]), &mut out) {
                Err(_) => model.verify(&mut st, &TokenTree::chain(&tokens[..1]), false),
                Ok(_) => panic!("{name}: growing without a tree must fail"),
            }
            .unwrap();
            let mut rows = grown.logits;
            for (lo, hi) in [(1, 3), (3, 4), (4, 6)] {
                let batch = Batch::grow(&parents[lo..hi], &tokens[lo..hi]);
                match model.run(&mut st, &batch, &mut out) {
                    Ok(()) => rows.extend(&out.logits),
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
