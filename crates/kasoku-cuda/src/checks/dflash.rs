//! The checks of DFlash drafting on the GPU (`kasoku-cuda-check dflash TARGET.gguf DIR N`):
//! the GPU network's marginals (each block row's top-k ids and log-probabilities) against the
//! CPU network's on the same context (features computed once on the CPU and given to both),
//! with the whole head and a reduced one; then speculative decoding with the GPU drafter
//! (features tapped from the GPU target) against plain GPU decoding, token for token, through
//! `generate_speculative` and the engine's `DeviceSession`, with the tokens each pass yields.

use std::path::Path;
use std::sync::Arc;

use kasoku::model::dflash::Block;
use kasoku::model::{DFlash, Model};
use kasoku::spec::marginal_tree::top_k_log_probs;
use kasoku::spec::{DFlashBlocks, DFlashDrafterConfig};

use super::{Report, R};
use crate::dflash::{dflash_drafter, load_weights, CudaDFlash};
use crate::CudaModel;

/// Log-probabilities of the GPU's candidates may differ from the CPU's by this much (the
/// GPU keeps the context's keys and values in f16).
const LOGPROB_TOL: f32 = 5e-2;

/// Two candidates closer than this in log-probability are a near-tie (their order may differ).
const NEAR_TIE: f32 = 1e-2;

/// Compares one block's candidates: the top-1 ids equal unless the CPU's best two are a
/// near-tie, and every id both lists hold within [`LOGPROB_TOL`]. Returns (top-1 matches or
/// near-ties, rows, largest log-probability difference).
pub fn compare_marginals(gpu: &[Vec<(u32, f32)>], cpu: &[Vec<(u32, f32)>]) -> (bool, usize, f32) {
    let mut worst = 0f32;
    let mut ok = gpu.len() == cpu.len();
    for (g, c) in gpu.iter().zip(cpu) {
        let (Some(g0), Some(c0)) = (g.first(), c.first()) else {
            ok = false;
            continue;
        };
        let tie = c.get(1).is_some_and(|c1| c0.1 - c1.1 < NEAR_TIE);
        if g0.0 != c0.0 && !tie {
            ok = false;
        }
        for (id, lp) in g {
            if let Some((_, want)) = c.iter().find(|(i, _)| i == id) {
                worst = worst.max((lp - want).abs());
            }
        }
    }
    (ok && worst <= LOGPROB_TOL, gpu.len(), worst)
}

/// See the module doc.
pub fn dflash_checks(gpu: &Arc<crate::Gpu>, target: &Path, dir: &Path, n: usize) -> R<Report> {
    use kasoku::engine::{device_draft_speculator, DeviceSession, Flow, GenerateOptions, SpecKind};
    use kasoku::spec::PolicyConfig;

    let invalid = |e: String| crate::Error::Invalid(e);
    let mut rep = Report::default();
    let m = Arc::new(CudaModel::load(gpu, target)?);
    let weights = load_weights(&m, dir).map_err(|e| invalid(e.to_string()))?;
    let cpu = Model::load(target).map_err(|e| invalid(e.to_string()))?;
    let net = DFlash::load(dir, &cpu, None).map_err(|e| invalid(e.to_string()))?;
    let c = &net.config;
    let vocab = m.config.vocab;
    let base: Vec<u32> = (0..24u32).map(|i| (i * 7919 + 13) % vocab as u32).collect();
    let tokens: Vec<u32> = base.iter().chain(&base[..12]).copied().collect();

    // (a) Marginals on the same context: the CPU target's features, both networks.
    let mut st = cpu.new_state(tokens.len() + 8);
    let (_, feats) = cpu
        .forward_taps(&mut st, &tokens, &c.taps)
        .map_err(|e| invalid(e.to_string()))?;
    let width = net.feature_width();
    let top_k = 8;
    for vocab_rows in [0usize, 40] {
        let head = if vocab_rows == 0 {
            cpu.head().first_rows(cpu.head().rows)
        } else {
            cpu.head().first_rows(vocab_rows)
        };
        let mut ctx = net.new_context();
        let mut dev = CudaDFlash::new(m.clone(), weights.clone(), tokens.len() + 8, vocab_rows)
            .map_err(|e| invalid(e.to_string()))?;
        let mut logits = Vec::new();
        let mut from = 0;
        for upto in [5usize, 17, tokens.len() - 1] {
            let pos: Vec<usize> = (from..upto).collect();
            let f = &feats[from * width..upto * width];
            net.append_context(&mut ctx, f, &pos)
                .map_err(|e| invalid(e.to_string()))?;
            dev.append_context(f, &pos)
                .map_err(|e| invalid(e.to_string()))?;
            from = upto;
            let root = tokens[upto];
            let rows = c.block_size - 1;
            let block = Block {
                root,
                pos: upto,
                rows,
                head: &head,
            };
            net.draft(&cpu, &mut ctx, block, &mut logits)
                .map_err(|e| invalid(e.to_string()))?;
            let want = top_k_log_probs(&logits, head.rows, top_k);
            let got = dev
                .marginals(root, upto, rows, top_k)
                .map_err(|e| invalid(e.to_string()))?;
            let (ok, rows, worst) = compare_marginals(&got, &want);
            rep.check(
                ok,
                format!(
                    "DFlash marginals GPU vs CPU, context {upto}, {rows} rows, head of {} ids: top-1 equal (near-ties aside), log-prob max abs diff {worst:.1e} (tolerance {LOGPROB_TOL:.0e})",
                    head.rows
                ),
            );
            if !ok {
                let show = |v: &[Vec<(u32, f32)>]| {
                    v.iter()
                        .map(|r| r.iter().take(2).copied().collect::<Vec<_>>())
                        .collect::<Vec<_>>()
                };
                rep.lines.push(format!(
                    "     gpu {:?}\n     cpu {:?}",
                    show(&got),
                    show(&want)
                ));
            }
        }
    }

    // (b) Speculative decoding with the GPU drafter == plain decoding.
    let prompt: Vec<u32> = base.iter().chain(&base).copied().collect();
    let ctx = prompt.len() + n + 80;
    let mut st = m.new_state(ctx)?;
    let plain = crate::generate_plain(&m, &mut st, &prompt, n)?;
    let config = DFlashDrafterConfig {
        vocab_rows: 0,
        ..DFlashDrafterConfig::default()
    };
    for (budget, depth) in [(8usize, 8usize), (16, 8), (32, 7)] {
        let mut st = m.new_state(ctx)?;
        let mut drafter = dflash_drafter(m.clone(), weights.clone(), ctx, config)
            .map_err(|e| invalid(e.to_string()))?;
        let t = std::time::Instant::now();
        let run =
            crate::generate_speculative(&m, &mut st, &prompt, n, &mut drafter, budget, depth)?;
        let secs = t.elapsed().as_secs_f64();
        rep.speculative_run(
            &run,
            &plain,
            format!(
                "speculative == plain with the GPU DFlash drafter (budget {budget}, depth {depth})"
            ),
            secs,
            "",
        );
    }
    let engine = |e: kasoku::engine::EngineError| invalid(e.to_string());
    let device = crate::CudaDevice::new(m.clone());
    let mut session = DeviceSession::on(&device, ctx).map_err(engine)?;
    let drafter = dflash_drafter(m.clone(), weights.clone(), ctx, config)
        .map_err(|e| invalid(e.to_string()))?;
    session.set_speculator(
        device_draft_speculator(SpecKind::DFlash, Box::new(drafter), PolicyConfig::default())
            .map_err(engine)?,
    );
    let options = GenerateOptions {
        max_tokens: n,
        ..Default::default()
    };
    for round in ["first", "second"] {
        let g = session
            .generate(&prompt, &options, &|| false, &mut |_| Flow::Continue)
            .map_err(engine)?;
        let spec = g.stats.spec.clone().unwrap_or_default();
        rep.check(
            g.tokens == plain,
            format!(
                "DeviceSession with the GPU DFlash drafter, {round} answer == plain: {} tokens in {} passes ({:.2} tokens per pass), {} drafts accepted",
                g.tokens.len(),
                g.stats.decode_passes,
                g.tokens.len().saturating_sub(1) as f64 / g.stats.decode_passes.max(1) as f64,
                spec.accepted_tokens(),
            ),
        );
    }
    Ok(rep)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marginals_compare_by_top1_and_log_probs() {
        let cpu = vec![vec![(3, -0.1), (5, -2.0)], vec![(7, -0.69), (8, -0.695)]];
        // Equal, then a near-tie swapped: fine.
        let gpu = vec![vec![(3, -0.11), (5, -2.01)], vec![(8, -0.69), (7, -0.69)]];
        let (ok, rows, worst) = compare_marginals(&gpu, &cpu);
        assert!(ok && rows == 2 && worst < 0.02, "{worst}");
        // A different best outside a tie, or log-probs too far apart: not.
        let gpu = vec![vec![(5, -0.1)], vec![(7, -0.69)]];
        assert!(!compare_marginals(&gpu, &cpu).0);
        let gpu = vec![vec![(3, -0.5)], vec![(7, -0.69)]];
        assert!(!compare_marginals(&gpu, &cpu).0);
        assert!(!compare_marginals(&gpu[..1], &cpu).0);
    }
}
