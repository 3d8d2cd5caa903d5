//! A decode step and a verification pass allocate nothing once warmed up: the activations
//! live in the state's scratch buffers, the KV caches reserve their capacity when the state is
//! made, a tree's commit data is kept in buffers reused from tree to tree, and the results
//! go into an `Output` the caller keeps. A counting global allocator checks it on the
//! fixtures (attention-only in f32 and Q4_0, the Gated DeltaNet hybrid with its MTP head, KV
//! caches in f32, f16 and q8_0; kasoku's M and mixed formats): `Model::run` of one token, of a token tree (logits and
//! hidden states of every node), `Model::commit` of a path, and the MTP head's step.
//!
//! This binary holds one test, so nothing else runs while it counts (every thread counts).

mod common;
mod counting_alloc;

use counting_alloc::counted;
use kasoku::model::{Batch, KvType, Logits, Model, ModelState, Output, TreeBuilder};
use kasoku::quant::kasoku::{Recipe, Scheme};
use kasoku::quant::Target;

/// A draft tree of 7 nodes rooted at `root`, branching at two depths.
fn tree(root: u32, vocab: u32) -> kasoku::model::TokenTree {
    let t = |i: u32| (root + i * 7) % vocab;
    let mut b = TreeBuilder::new(root);
    let a = b.add(0, t(1));
    let c = b.add(a, t(2));
    b.add(c, t(3));
    b.add(a, t(4));
    let d = b.add(0, t(5));
    b.add(d, t(6));
    b.build().0
}

/// One cycle of speculative decoding's model work: a decode step, a verification pass and
/// the commit of a three-node path. Returns the allocations of each.
fn cycle(model: &Model, state: &mut ModelState, out: &mut Output, token: u32) -> [usize; 3] {
    let vocab = model.config.vocab as u32;
    let chain = [token];
    let decode = Batch::chain(&chain).logits(Logits::Last);
    let (r, decode_allocs) = counted(|| model.run(state, &decode, out));
    r.unwrap();
    assert_eq!(out.logits.len(), vocab as usize);
    let t = tree((token + 1) % vocab, vocab);
    let verify = Batch::tree(&t).hidden(true);
    let (r, verify_allocs) = counted(|| model.run(state, &verify, out));
    r.unwrap();
    assert_eq!(out.logits.len(), t.len() * vocab as usize);
    let path = t.path(2);
    let (r, commit_allocs) = counted(|| model.commit(state, &path));
    r.unwrap();
    [decode_allocs, verify_allocs, commit_allocs]
}

#[test]
fn decode_and_verify_allocate_nothing_once_warmed_up() {
    // The counter sees allocations.
    let (_, one) = counted(|| drop(std::hint::black_box(vec![1u8; 10])));
    assert_eq!(one, 1);

    let mut failures = Vec::new();
    let cases = [
        ("llama/tiny/model-f32.gguf", KvType::F32),
        ("llama/tiny/model-q4_0.gguf", KvType::F16),
        ("qwen3_5/tiny/model-f32.gguf", KvType::F16),
        ("qwen3_5/tiny/model-f32.gguf", KvType::Q8_0),
        ("qwen3_5/tiny_mtp/model-f32.gguf", KvType::F32),
    ];
    // And kasoku's own formats, quantized as the model loads.
    let kasoku = |s| Some(Target::Kasoku(Recipe::new(s)));
    let cases = cases.into_iter().map(|(rel, kv)| (rel, kv, None)).chain([
        ("qwen2/tiny/model-f32.gguf", KvType::F16, kasoku(Scheme::M)),
        (
            "qwen3/tiny/model-f32.gguf",
            KvType::F32,
            kasoku(Scheme::Mixed),
        ),
    ]);
    for (rel, kv, target) in cases {
        let mut model = Model::load_with(common::fixture(rel), target).unwrap();
        model.set_kv_type(kv).unwrap();
        let what = format!("{rel} ({kv} cache, {target:?})");
        let mut state = model.new_state(512);
        let mut out = Output::default();
        let prompt: Vec<u32> = (0..40).map(|i| (i * 5 + 1) % 90).collect();
        model
            .run(&mut state, &Batch::chain(&prompt), &mut out)
            .unwrap();
        // Warm-up: the first tree sizes the buffers of the pending tree (so the counter sees
        // the model's allocations).
        let [_, first_verify, _] = cycle(&model, &mut state, &mut out, 3);
        assert!(
            first_verify > 0,
            "{what}: the first tree allocates its buffers"
        );
        for (i, token) in [11u32, 29, 47].into_iter().enumerate() {
            let [decode, verify, commit] = cycle(&model, &mut state, &mut out, token);
            for (step, count) in [("decode", decode), ("verify", verify), ("commit", commit)] {
                if count != 0 {
                    failures.push(format!("{what}: cycle {i}: {step}: {count} allocations"));
                }
            }
        }
        if let Some(mtp) = model.mtp() {
            let h = model.config.hidden;
            let mut cache = mtp.new_state(512);
            let hidden = vec![0.5f32; h];
            let mut mtp_out = Output::default();
            mtp.run(&model, &mut cache, &[5], &hidden, &mut mtp_out)
                .unwrap();
            for token in [7u32, 9] {
                let (r, count) =
                    counted(|| mtp.run(&model, &mut cache, &[token], &hidden, &mut mtp_out));
                r.unwrap();
                if count != 0 {
                    failures.push(format!("{what}: MTP step: {count} allocations"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
