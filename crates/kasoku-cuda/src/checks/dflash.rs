//! The checks of DFlash drafting on the GPU (`kasoku-cuda-check dflash TARGET.gguf DIR N`):
//! the GPU network's marginals (each block row's top-k ids and log-probabilities) against the
//! CPU network's on the same context (features computed once on the CPU and given to both),
//! with the whole head and a reduced one; then speculative decoding with the GPU drafter
//! (features tapped from the GPU target) against plain GPU decoding, token for token, through
//! `generate_speculative` and the engine's `DeviceSession`, with the tokens each pass yields.
//! The drafter's passes replayed from captured graphs must give the bits of plain launches,
//! and features read in place from the GPU target's recorded rows the bits of the same rows
//! uploaded from the host. Timings: a draft (one block pass) with and without graphs, a
//! cycle's drafter work (projection of an accepted path's rows + block pass), and per
//! speculative cycle the drafter's share with its host stream operations and
//! synchronisations.

use std::any::Any;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kasoku::model::dflash::Block;
use kasoku::model::{DFlash, Model, TokenTree};
use kasoku::spec::marginal_tree::top_k_log_probs;
use kasoku::spec::{
    Accepted, DFlashBlocks, DFlashDrafterConfig, DraftError, DraftRequest, Drafter, Features,
};

use super::{Report, R};
use crate::dflash::{dflash_drafter, load_weights, CudaDFlash, PassCounts};
use crate::CudaModel;

/// A drafter whose drafts and accepts are timed (host wall time: a draft waits for the
/// device, an accept only queues work the next draft waits for).
struct Timed<'a, D: Drafter> {
    inner: &'a mut D,
    draft: Duration,
    accept: Duration,
    drafts: usize,
}

impl<'a, D: Drafter> Timed<'a, D> {
    fn new(inner: &'a mut D) -> Self {
        Timed {
            inner,
            draft: Duration::ZERO,
            accept: Duration::ZERO,
            drafts: 0,
        }
    }
}

impl<D: Drafter> Drafter for Timed<'_, D> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn tap_layers(&self) -> Vec<usize> {
        self.inner.tap_layers()
    }
    fn reads_device_taps(&self, source: &(dyn Any + Send + Sync)) -> bool {
        self.inner.reads_device_taps(source)
    }
    fn flat_draft_cost(&self) -> bool {
        self.inner.flat_draft_cost()
    }
    fn start(&mut self, prompt: &[u32], features: Features) -> Result<(), DraftError> {
        self.inner.start(prompt, features)
    }
    fn catch_up(&mut self, tokens: &[u32]) -> Result<(), DraftError> {
        self.inner.catch_up(tokens)
    }
    fn draft(&mut self, req: &DraftRequest) -> Result<TokenTree, DraftError> {
        let t = Instant::now();
        let tree = self.inner.draft(req);
        self.draft += t.elapsed();
        self.drafts += 1;
        tree
    }
    fn accept(&mut self, accepted: &Accepted) -> Result<(), DraftError> {
        let t = Instant::now();
        let r = self.inner.accept(accepted);
        self.accept += t.elapsed();
        r
    }
}

/// `after − before`, per `cycles`.
fn per_cycle(before: PassCounts, after: PassCounts, cycles: usize) -> (f64, f64) {
    let c = cycles.max(1) as f64;
    (
        (after.ops - before.ops) as f64 / c,
        (after.syncs - before.syncs) as f64 / c,
    )
}

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

    // (a2) The same drafter's passes from captured graphs and from plain launches, and from
    // features read in place on the GPU target and uploaded from the host: the same bits.
    let mut gt = m.new_state(tokens.len() + 8)?;
    gt.set_tap_layers(&m, &c.taps)?;
    gt.prefill(&m, &tokens)?;
    let view = gt
        .device_taps()
        .ok_or_else(|| invalid("no recorded layer outputs".into()))?;
    let source = view as &(dyn Any + Send + Sync);
    // Rows out of order (a tree's path need not be consecutive), then a short path.
    let last = tokens.len() - 1;
    let mut first: Vec<usize> = (0..last - 3).collect();
    first.swap(2, 5);
    let firsts: Vec<usize> = (0..first.len()).collect();
    let path = [last - 3, last - 1, last - 2];
    let paths: Vec<usize> = (first.len()..last).collect();
    let mut host_rows = Vec::new();
    let config = DFlashDrafterConfig::default();
    let make = || {
        CudaDFlash::new(
            m.clone(),
            weights.clone(),
            tokens.len() + 8,
            config.vocab_rows,
        )
        .map_err(|e| invalid(e.to_string()))
    };
    let (mut on_host, mut in_place) = (make()?, make()?);
    let draft_err = |e: DraftError| invalid(e.to_string());
    if !in_place.reads_device_taps(source) {
        rep.check(
            false,
            "the GPU drafter reads the GPU target's recorded rows in place".into(),
        );
    }
    for (rows, pos) in [(&first[..], &firsts), (&path[..], &paths)] {
        gt.tap_rows(&m, rows, &mut host_rows)?;
        on_host.append_context(&host_rows, pos).map_err(draft_err)?;
        in_place
            .append_device_context(source, rows, pos)
            .map_err(draft_err)?;
    }
    let rows = c.block_size - 1;
    let (root, pos) = (tokens[last], last);
    on_host.state_mut().use_graphs = false;
    let plain = on_host
        .marginals(root, pos, rows, top_k)
        .map_err(draft_err)?;
    let graphed = in_place
        .marginals(root, pos, rows, top_k)
        .map_err(draft_err)?;
    let again = in_place
        .marginals(root, pos, rows, top_k)
        .map_err(draft_err)?;
    rep.check(
        plain == graphed && graphed == again,
        format!(
            "DFlash block pass replayed from a graph, features gathered in place ({} + {} rows, out of order) == plain launches on uploaded features, bit for bit ({rows} rows, top-{top_k}, head of {} ids)",
            first.len(),
            path.len(),
            in_place.state().head_rows()
        ),
    );

    // (a3) Time a draft (block pass) and a cycle's drafter work (a 3-row projection in place,
    // then the block pass), graphs on and off.
    let reps = 50;
    for graphs in [true, false] {
        in_place.state_mut().use_graphs = graphs;
        in_place
            .marginals(root, pos, rows, top_k)
            .map_err(draft_err)?;
        let t = Instant::now();
        for _ in 0..reps {
            in_place
                .marginals(root, pos, rows, top_k)
                .map_err(draft_err)?;
        }
        let draft_us = t.elapsed().as_secs_f64() * 1e6 / reps as f64;
        let before = in_place.state().counts();
        let t = Instant::now();
        for _ in 0..reps {
            in_place.truncate_context(first.len());
            in_place
                .append_device_context(source, &path, &paths)
                .map_err(draft_err)?;
            in_place
                .marginals(root, pos, rows, top_k)
                .map_err(draft_err)?;
        }
        let cycle_us = t.elapsed().as_secs_f64() * 1e6 / reps as f64;
        let (ops, syncs) = per_cycle(before, in_place.state().counts(), reps);
        rep.lines.push(format!(
            "     DFlash drafter {}: {draft_us:.0} us a draft ({rows} rows, top-{top_k}, head of {} ids); {cycle_us:.0} us a cycle with a {}-row projection in place, {ops:.0} host stream operations and {syncs:.0} synchronisation(s) a cycle",
            if graphs { "graphs" } else { "plain launches" },
            in_place.state().head_rows(),
            path.len(),
        ));
    }
    drop(gt);

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
        let before = drafter.blocks().state().counts();
        let mut timed = Timed::new(&mut drafter);
        let t = Instant::now();
        let run = crate::generate_speculative(&m, &mut st, &prompt, n, &mut timed, budget, depth)?;
        let secs = t.elapsed().as_secs_f64();
        let (draft, accept, drafts) = (timed.draft, timed.accept, timed.drafts);
        let (ops, syncs) = per_cycle(before, drafter.blocks().state().counts(), run.passes);
        let cycles = run.passes.max(1) as f64;
        let tail = format!(
            "\n     {:.2} ms a cycle, of which the drafter {:.0} us (drafts {:.0} us each over {drafts}, accepts {:.0} us a cycle); the drafter's host stream operations {ops:.1} and synchronisations {syncs:.2} a cycle (before: 2-4 + 8 + 39 and 3)",
            secs * 1e3 / cycles,
            (draft + accept).as_secs_f64() * 1e6 / cycles,
            draft.as_secs_f64() * 1e6 / drafts.max(1) as f64,
            accept.as_secs_f64() * 1e6 / cycles,
        );
        rep.speculative_run(
            &run,
            &plain,
            format!(
                "speculative == plain with the GPU DFlash drafter (budget {budget}, depth {depth})"
            ),
            secs,
            &tail,
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
