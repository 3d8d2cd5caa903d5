//! The whole model on the f64 reference backend, through the same generic layer loop the CPU
//! runs (`Model<Reference>` and `Model<Cpu>` are one `Model<B>`): a prefill longer than one
//! chunk (logits of every row, the final hidden states, a layer tap), three decode steps, a
//! token tree verified in one pass, the commit of one of its paths and a step after it, and
//! for Qwen3.5's checkpoint with an MTP block, that block's pass. Every result of the CPU is
//! compared with the reference's on the committed tiny fixtures (llama, qwen2, qwen3, the
//! Qwen3.5 Gated DeltaNet hybrid and its MTP variant).
//!
//! Tolerances (relative L2 error of each result against the reference's):
//! - f32 weights: [`TOL_F32`] = 1e-5 (measured: at most 2.6e-6, on the hybrid). The CPU
//!   computes in f32 with its own summation order, the reference in f64 per op; both round
//!   each op's result to f32.
//! - block formats (Q8_0, Q4_0) and kasoku's L: [`TOL_QUANT`] = 5e-2 (measured: at most
//!   2.7e-2, Q8_0). The reference reads the same dequantized weights but unquantized
//!   activations, while the CPU quantizes the activations of every product to 8 bits (as
//!   llama.cpp does): that rounding is what differs.
//!
//! A wrong kernel, a wrong layer loop on either backend or a wrong model-level copy gives
//! errors of order 1. The test also checks that the two backends do not give identical bits
//! (the reference is an independent computation, not the CPU's kernels again).

mod common;

use common::fixture;
use kasoku::backend::{Backend, Cpu, Reference};
use kasoku::model::{Batch, Logits, Model, Output, TreeBuilder};
use kasoku::quant::kasoku::{Recipe, Scheme};
use kasoku::quant::{DType, Target};

const TOL_F32: f64 = 1e-5;
const TOL_QUANT: f64 = 5e-2;

/// `‖a − b‖ / ‖b‖`.
fn rel(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len(), "result lengths differ");
    let num: f64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| (x as f64 - y as f64).powi(2))
        .sum();
    let den: f64 = b.iter().map(|&y| (y as f64).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

/// The script's results on one backend, each named.
fn script<B: Backend>(model: &Model<B>) -> Vec<(&'static str, Vec<f32>)> {
    let vocab = model.config.vocab as u32;
    let tok = |i: u32| (i * 37 + 5) % vocab;
    let prompt: Vec<u32> = (0..300).map(tok).collect();
    let mut results = Vec::new();
    let mut state = model.new_state(512);
    let mut out = Output::default();

    // Prefill: more rows than one chunk, every output kind.
    let prefill = Batch::chain(&prompt)
        .logits(Logits::All)
        .hidden(true)
        .taps(&[1]);
    model.run(&mut state, &prefill, &mut out).unwrap();
    results.push(("prefill logits", out.logits.clone()));
    results.push(("prefill hidden", out.hidden.clone()));
    results.push(("prefill tap", out.taps.clone()));

    // Decode steps.
    for (i, name) in ["decode 1", "decode 2", "decode 3"].into_iter().enumerate() {
        model
            .run(&mut state, &Batch::chain(&[tok(400 + i as u32)]), &mut out)
            .unwrap();
        results.push((name, out.logits.clone()));
    }

    // A tree of 6 nodes branching at the root and at depth 1, verified in one pass.
    let mut b = TreeBuilder::new(tok(500));
    let a = b.add(0, tok(501));
    let c = b.add(a, tok(502));
    b.add(c, tok(503));
    b.add(a, tok(504));
    b.add(0, tok(505));
    let (tree, _) = b.build();
    model
        .run(&mut state, &Batch::tree(&tree).hidden(true), &mut out)
        .unwrap();
    results.push(("tree logits", out.logits.clone()));
    results.push(("tree hidden", out.hidden.clone()));

    // Commit the path root → a → c → leaf, then one step after it.
    model.commit(&mut state, &tree.path(3)).unwrap();
    assert_eq!(state.len(), prompt.len() + 3 + 4);
    model
        .run(&mut state, &Batch::chain(&[tok(600)]), &mut out)
        .unwrap();
    results.push(("after commit", out.logits.clone()));

    // The MTP block reads the trunk's hidden states.
    if let Some(mtp) = model.mtp() {
        let hidden = model
            .forward_hidden(&mut model.new_state(64), &prompt[..12])
            .unwrap();
        let (h, logits) = mtp
            .forward(model, &mut mtp.new_state(64), &prompt[1..13], &hidden, 0)
            .unwrap();
        results.push(("mtp hidden", h));
        results.push(("mtp logits", logits));
    }
    results
}

/// Runs the script on both backends for the checkpoint at `rel_path` (loaded with `target`)
/// and checks every result within `tol`.
fn compare(rel_path: &str, target: Option<Target>, tol: f64) {
    let path = fixture(rel_path);
    let cpu = Model::load_on(Cpu, &path, target).unwrap();
    let reference = Model::load_on(Reference, &path, target).unwrap();
    let got = script(&cpu);
    let want = script(&reference);
    assert_eq!(got.len(), want.len());
    let mut worst = 0f64;
    let mut identical = true;
    for ((name, g), (_, w)) in got.iter().zip(&want) {
        assert!(!g.is_empty(), "{rel_path}: {name}: empty");
        let e = rel(g, w);
        assert!(
            e < tol,
            "{rel_path} {target:?}: {name}: rel error {e:.2e} (tolerance {tol:e})"
        );
        worst = worst.max(e);
        identical &= g.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits());
    }
    assert!(
        !identical,
        "{rel_path}: the reference gave the CPU's exact bits"
    );
    eprintln!("{rel_path} {target:?}: largest rel error {worst:.2e}");
}

#[test]
fn attention_models_on_the_reference_backend_match_the_cpu() {
    for rel_path in [
        "llama/tiny/model-f32.gguf",
        "llama/tiny",
        "qwen2/tiny/model-f32.gguf",
        "qwen3/tiny/model-f32.gguf",
    ] {
        compare(rel_path, None, TOL_F32);
    }
}

#[test]
fn gated_delta_net_hybrid_and_mtp_on_the_reference_backend_match_the_cpu() {
    compare("qwen3_5/tiny/model-f32.gguf", None, TOL_F32);
    compare("qwen3_5/tiny_mtp/model-f32.gguf", None, TOL_F32);
}

#[test]
fn quantized_models_on_the_reference_backend_match_the_cpu() {
    compare("llama/tiny/model-q8_0.gguf", None, TOL_QUANT);
    compare("llama/tiny/model-q4_0.gguf", None, TOL_QUANT);
    compare(
        "qwen3/tiny/model-f32.gguf",
        Some(Target::Gguf(DType::Q8_0)),
        TOL_QUANT,
    );
    compare(
        "qwen3/tiny/model-f32.gguf",
        Some(Target::Kasoku(Recipe::new(Scheme::L))),
        TOL_QUANT,
    );
}
