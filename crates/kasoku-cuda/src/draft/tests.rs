//! The tree policy without a GPU: [`TreeDrafter`] over the CPU model's passes must propose
//! exactly the trees of the CPU's own draft-model drafter (`kasoku::spec::DraftModelDrafter`)
//! through a whole speculative run, catch-ups and rejections included. The GPU's passes are
//! checked on a GPU (`checks::draft_speculative`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use kasoku::model::{Batch, Logits, Model, ModelState, Output, TokenTree};
use kasoku::sampler::argmax;
use kasoku::spec::draft_model::DraftModelConfig;
use kasoku::spec::{Accepted, DraftError, DraftModelDrafter, DraftRequest, Drafter, Features};

use super::*;
use crate::kernels::RowTop2;
use crate::model::MAX_TREE;

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(rel)
}

/// A draft model's passes on the CPU: the rows' best two computed on the host from whole
/// rows of logits.
struct CpuPasses {
    model: Arc<Model>,
    state: ModelState,
    out: Output,
}

impl DraftPasses for CpuPasses {
    fn max_len(&self) -> usize {
        self.state.max_len()
    }
    fn max_tree(&self) -> usize {
        MAX_TREE
    }
    fn truncate(&mut self, len: usize) -> usize {
        if !self.state.truncate(len) {
            self.state = self.model.new_state(self.state.max_len());
        }
        self.state.len()
    }
    fn feed(&mut self, tokens: &[u32]) -> Result<(), DraftError> {
        let batch = Batch::chain(tokens).logits(Logits::None);
        Ok(self.model.run(&mut self.state, &batch, &mut self.out)?)
    }
    fn verify(&mut self, tree: &TokenTree, rows: &mut Vec<RowTop2>) -> Result<(), DraftError> {
        let batch = Batch::tree(tree).logits(Logits::All);
        self.model.run(&mut self.state, &batch, &mut self.out)?;
        let vocab = self.model.config.vocab;
        rows.clear();
        rows.extend(self.out.logits.chunks_exact(vocab).map(RowTop2::of));
        Ok(())
    }
    fn commit(&mut self, path: &[usize]) -> Result<(), DraftError> {
        Ok(self.model.commit(&mut self.state, path)?)
    }
}

/// The target's greedy walk down `tree`: the accepted path and the new tokens.
fn verify_greedy(target: &Model, st: &mut ModelState, tree: &TokenTree) -> (Vec<usize>, Vec<u32>) {
    let mut out = Output::default();
    let batch = Batch::tree(tree).logits(Logits::All);
    target.run(st, &batch, &mut out).unwrap();
    let vocab = target.config.vocab;
    let (mut node, mut path, mut new) = (0, vec![0], Vec::new());
    loop {
        let t = argmax(&out.logits[node * vocab..(node + 1) * vocab]);
        new.push(t);
        match tree.child_with(node, t) {
            Some(c) => {
                node = c;
                path.push(c);
            }
            None => break,
        }
    }
    target.commit(st, &path).unwrap();
    (path, new)
}

/// A speculative run of `cycles` passes of `target` with both drafters over `draft`,
/// comparing every tree; every fifth pass decodes without drafting (catch-ups).
fn same_trees(target_rel: &str, draft_rel: &str, config: DraftModelConfig, budget: usize) {
    let target = Arc::new(Model::load(fixture(target_rel)).unwrap());
    let draft = Arc::new(Model::load(fixture(draft_rel)).unwrap());
    let ctx = 256;
    let vocab = target.config.vocab;
    let mut cpu = DraftModelDrafter::new(draft.clone(), ctx, vocab, config).unwrap();
    let passes = CpuPasses {
        state: draft.new_state(ctx),
        model: draft.clone(),
        out: Output::default(),
    };
    let mut ours = TreeDrafter::new(passes, config);
    let prompt: Vec<u32> = (0..24u32).map(|i| (i * 37 + 5) % vocab as u32).collect();
    cpu.start(&prompt, Features::default()).unwrap();
    ours.start(&prompt, Features::default()).unwrap();
    let mut st = target.new_state(ctx);
    let logits = target.forward(&mut st, &prompt, Logits::Last).unwrap();
    let mut history = prompt.clone();
    history.push(argmax(&logits));
    let (mut drafted, mut accepted) = (0, 0);
    for cycle in 0..30 {
        let root = *history.last().unwrap();
        if cycle % 5 == 4 {
            // A pass without drafting: the target alone.
            let (_, new) = verify_greedy(&target, &mut st, &TokenTree::chain(&[root]));
            history.extend_from_slice(&new);
            continue;
        }
        cpu.catch_up(&history).unwrap();
        ours.catch_up(&history).unwrap();
        let req = DraftRequest {
            tokens: &history,
            budget,
            max_depth: 6,
        };
        let want = cpu.draft(&req).unwrap();
        let got = ours.draft(&req).unwrap();
        assert_eq!(
            (got.tokens(), got.parents()),
            (want.tokens(), want.parents()),
            "{draft_rel} drafting for {target_rel}: tree of pass {cycle}"
        );
        assert_eq!(got.token(0), root);
        let (path, new) = verify_greedy(&target, &mut st, &got);
        drafted += got.len() - 1;
        accepted += path.len() - 1;
        let committed: Vec<u32> = path.iter().map(|&i| got.token(i)).collect();
        let acc = Accepted {
            tokens: &committed,
            committed_len: history.len() - 1 + committed.len(),
            features: Features::default(),
        };
        cpu.accept(&acc).unwrap();
        ours.accept(&acc).unwrap();
        history.extend_from_slice(&new);
        // The draft model's cache holds a prefix of the sequence (what it computed).
        assert_eq!(ours.fed(), &history[..ours.fed().len()]);
    }
    eprintln!("{draft_rel} for {target_rel}: {accepted} of {drafted} drafts accepted");
    assert!(drafted > 0);
}

#[test]
fn the_tree_policy_drafts_the_cpu_drafters_trees() {
    // A model drafting for itself (every draft accepted down to a budget's end) with the
    // whole vocabulary scored and branching at its most eager, and the Q4_0 file drafting
    // for the f32 one under the default settings (rejections, runner-ups).
    let eager = DraftModelConfig {
        vocab_rows: 0,
        branch_below: 1.0,
        min_path_prob: 0.0,
    };
    same_trees(
        "llama/tiny/model-f32.gguf",
        "llama/tiny/model-f32.gguf",
        eager,
        8,
    );
    let default = DraftModelConfig::default();
    same_trees(
        "llama/tiny/model-f32.gguf",
        "llama/tiny/model-q4_0.gguf",
        default,
        12,
    );
    // (Within the leading chain's share of a pass: the GPU verifies at most MAX_TREE rows.)
    same_trees(
        "qwen2/tiny/model-f32.gguf",
        "qwen2/tiny/model-f32.gguf",
        eager,
        48,
    );
    // A hybrid draft model (Gated DeltaNet layers: its state cannot rewind).
    let hybrid = "qwen3_5/tiny/model-f32.gguf";
    same_trees(hybrid, hybrid, eager, 8);
}

/// A drafter reused for another prompt (a shared prefix, then other tokens, as a server
/// session's next request) rewinds to the common prefix and drafts the CPU drafter's trees;
/// a gap of many undrafted tokens is fed by catching up.
#[test]
fn a_new_prompt_rewinds_the_draft_state_and_a_long_gap_is_caught_up() {
    // An attention model rewinds; a hybrid one starts over and feeds the prompt again.
    for rel in ["llama/tiny/model-f32.gguf", "qwen3_5/tiny/model-f32.gguf"] {
        new_prompts(rel);
    }
}

fn new_prompts(rel: &str) {
    let draft = Arc::new(Model::load(fixture(rel)).unwrap());
    let config = DraftModelConfig::default();
    let vocab = draft.config.vocab;
    let mut cpu = DraftModelDrafter::new(draft.clone(), 128, vocab, config).unwrap();
    let passes = CpuPasses {
        state: draft.new_state(128),
        model: draft.clone(),
        out: Output::default(),
    };
    let mut ours = TreeDrafter::new(passes, config);
    let first: Vec<u32> = (0..30u32).map(|i| (i * 37 + 5) % vocab as u32).collect();
    let mut second = first[..12].to_vec();
    second.extend((0..20u32).map(|i| (i * 11 + 3) % vocab as u32));
    for prompt in [&first, &second, &first] {
        cpu.start(prompt, Features::default()).unwrap();
        ours.start(prompt, Features::default()).unwrap();
        assert_eq!(ours.fed(), &prompt[..prompt.len() - 1]);
        let mut history = prompt.clone();
        history.push(7);
        // Twenty tokens more, decoded without drafting: all but the leading chain are fed.
        history.extend((0..20u32).map(|i| (i * 5 + 1) % vocab as u32));
        for d in [&mut cpu as &mut dyn Drafter, &mut ours] {
            d.catch_up(&history).unwrap();
        }
        assert_eq!(ours.fed(), &history[..history.len() - LEADING_CHAIN]);
        let req = DraftRequest {
            tokens: &history,
            budget: 10,
            max_depth: 5,
        };
        let (want, got) = (cpu.draft(&req).unwrap(), ours.draft(&req).unwrap());
        assert_eq!(
            (got.tokens(), got.parents()),
            (want.tokens(), want.parents())
        );
    }
}

#[test]
fn vocabularies_must_match_and_drafts_stay_inside_both() {
    assert!(check_vocabularies(151_936, 151_665).is_ok());
    let e = check_vocabularies(32_000, 151_936).unwrap_err();
    assert!(e.to_string().contains("does not match"), "{e}");
    let c = DraftModelConfig::default();
    assert_eq!(scored_ids(&c, 151_936, 151_936), 32_768);
    assert_eq!(scored_ids(&c, 384, 384), 384);
    let odd = DraftModelConfig {
        vocab_rows: 1001,
        ..c
    };
    assert_eq!(scored_ids(&odd, 151_936, 151_936), 1008);
    let all = DraftModelConfig { vocab_rows: 0, ..c };
    assert_eq!(scored_ids(&all, 151_936, 151_665), 151_665);
}

#[test]
fn the_gpu_drafter_can_move_to_a_session_thread() {
    fn send<T: Send>() {}
    send::<CudaDraftDrafter>();
}
