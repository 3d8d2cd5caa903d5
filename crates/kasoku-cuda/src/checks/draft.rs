//! The checks of draft-model speculation on the GPU: `row_top2` (draft_top.cu) against its
//! host reference, and speculative decoding with a draft model on the GPU against plain
//! decoding, token for token, through `generate_speculative` and the engine's
//! `DeviceSession`, with the tokens each pass yields.

use std::path::Path;
use std::sync::Arc;

use kasoku::spec::draft_model::DraftModelConfig;

use super::{random_logits, Report, R};
use crate::draft::CudaDraftDrafter;
use crate::kernels::{Kernels, RowTop2, TOP2_WORDS};
use crate::runtime::Timer;
use crate::synth::Rng;
use crate::CudaModel;

/// `row_top2` against [`RowTop2::of`] on random rows with and without ties and specials, for
/// several row counts, widths and scored prefixes: the same ids and logit bits, the mass
/// within 1e-4 of an f64 sum. Also times the draft's largest call.
pub fn row_top2_checks(k: &Kernels) -> R<Report> {
    let gpu = &k.gpu;
    let mut rep = Report::default();
    let mut rng = Rng(0x70b2);
    for (ld, rows) in [(384usize, 7usize), (32_000, 1), (151_936, 64)] {
        for kind in 0..3 {
            let logits: Vec<f32> = (0..rows)
                .flat_map(|_| random_logits(&mut rng, ld, kind))
                .collect();
            let dev = gpu.upload_f32(&logits)?;
            let out = gpu.alloc(rows * TOP2_WORDS * 4)?;
            let mut bad = Vec::new();
            let mut worst = 0f64;
            let widths = [ld, 32_768.min(ld), 1000.min(ld), 2];
            for cols in widths {
                out.fill(0xff)?;
                k.row_top2(dev.ptr(), ld, cols, rows, out.ptr())?;
                let mut bytes = vec![0u8; rows * TOP2_WORDS * 4];
                out.read(0, &mut bytes)?;
                let words: Vec<u32> = bytes
                    .chunks_exact(4)
                    .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect();
                for r in 0..rows {
                    let got = RowTop2::from_words(&words[r * TOP2_WORDS..(r + 1) * TOP2_WORDS]);
                    let want = RowTop2::of(&logits[r * ld..r * ld + cols]);
                    let same_ids = got.best.0 == want.best.0
                        && got.second.0 == want.second.0
                        && got.best.1.to_bits() == want.best.1.to_bits()
                        && got.second.1.to_bits() == want.second.1.to_bits();
                    // The mass against an f64 sum: the host's f32 running sum of 151,936
                    // terms is itself off by about 1e-4 on rows with many ties.
                    let want_mass: f64 = logits[r * ld..r * ld + cols]
                        .iter()
                        .map(|&l| ((l - want.best.1) as f64).exp())
                        .sum();
                    let e = ((got.mass as f64 - want_mass) / want_mass).abs();
                    let mass_ok = e <= 1e-4 || (got.mass.is_nan() && want.mass.is_nan());
                    if want.mass.is_finite() {
                        worst = worst.max(e);
                    }
                    if !same_ids || !mass_ok {
                        bad.push((cols, r));
                    }
                }
            }
            rep.check(
                bad.is_empty(),
                format!(
                    "row_top2 {rows} rows of {ld}, {} rows, scoring {:?}: the host's best two, mass rel err {worst:.1e}{}",
                    ["spread", "coarse (ties)", "flat (ties, specials)"][kind],
                    widths,
                    if bad.is_empty() {
                        String::new()
                    } else {
                        format!("; differs at (cols, row) {:?}", &bad[..bad.len().min(4)])
                    }
                ),
            );
        }
    }
    // A draft level of the 0.5B: 64 rows, the first 32k of 151,936 ids scored.
    let (ld, rows, cols) = (151_936, 64, 32_768);
    let dev = gpu.upload_f32(&random_logits(&mut rng, ld * rows, 0))?;
    let out = gpu.alloc(rows * TOP2_WORDS * 4)?;
    let timer = Timer::new(gpu)?;
    k.row_top2(dev.ptr(), ld, cols, rows, out.ptr())?;
    timer.start()?;
    for _ in 0..20 {
        k.row_top2(dev.ptr(), ld, cols, rows, out.ptr())?;
    }
    let us = timer.stop_ms()? as f64 * 1e3 / 20.0;
    rep.lines.push(format!(
        "row_top2 of {rows} rows, {cols} of {ld} logits each: {us:.1} µs"
    ));
    Ok(rep)
}

/// Speculative decoding with `draft` (a model sharing `target`'s vocabulary) on the GPU equals
/// plain decoding of `target` token for token: through `generate_speculative` at several
/// budgets, with the reduced head (the default settings) and the whole vocabulary, and
/// through the engine's `DeviceSession` (what `kasoku run --device cuda --draft` uses). Each
/// line says how many tokens a pass yielded.
pub fn draft_speculative(
    gpu: &Arc<crate::Gpu>,
    target: &Path,
    draft: &Path,
    prompt: &[u32],
    n: usize,
) -> R<Report> {
    use kasoku::engine::{device_draft_speculator, DeviceSession, Flow, GenerateOptions, SpecKind};
    use kasoku::spec::PolicyConfig;

    let engine = |e: kasoku::engine::EngineError| crate::Error::Invalid(e.to_string());
    let drafting = |e: kasoku::spec::DraftError| crate::Error::Invalid(e.to_string());
    let mut rep = Report::default();
    let m = Arc::new(CudaModel::load(gpu, target)?);
    let d = Arc::new(CudaModel::load(gpu, draft)?);
    let ctx = prompt.len() + n + 80;
    let mut st = m.new_state(ctx)?;
    let plain = crate::generate_plain(&m, &mut st, prompt, n)?;
    let name = |p: &Path| {
        p.file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned()
    };
    let what = format!("{} drafting for {}", name(draft), name(target));
    let whole = DraftModelConfig {
        vocab_rows: 0,
        ..DraftModelConfig::default()
    };
    for (config, label, budget, depth) in [
        (DraftModelConfig::default(), "default", 8usize, 8usize),
        (DraftModelConfig::default(), "default", 16, 8),
        (whole, "whole vocabulary", 32, 12),
        (whole, "whole vocabulary", 63, 16),
    ] {
        let mut st = m.new_state(ctx)?;
        let mut drafter =
            CudaDraftDrafter::on_gpu(d.clone(), ctx, m.config.vocab, config).map_err(drafting)?;
        let t = std::time::Instant::now();
        let run = crate::generate_speculative(&m, &mut st, prompt, n, &mut drafter, budget, depth)?;
        let secs = t.elapsed().as_secs_f64();
        rep.speculative_run(
            &run,
            &plain,
            format!("speculative == plain, {what} ({label}, budget {budget}, depth {depth})"),
            secs,
            " (graphs captured as they come)",
        );
    }
    // The engine's session with the drafter (the budget adapting, as with `run`'s defaults), twice:
    // the second answer reuses the session's state and the drafter's.
    let device = crate::CudaDevice::new(m.clone());
    let mut session = DeviceSession::on(&device, ctx).map_err(engine)?;
    let drafter = CudaDraftDrafter::on_gpu(d.clone(), ctx, m.config.vocab, Default::default())
        .map_err(drafting)?;
    session.set_speculator(
        device_draft_speculator(SpecKind::Draft, Box::new(drafter), PolicyConfig::default())
            .map_err(engine)?,
    );
    let options = GenerateOptions {
        max_tokens: n,
        ..Default::default()
    };
    for round in ["first", "second"] {
        let g = session
            .generate(prompt, &options, &|| false, &mut |_| Flow::Continue)
            .map_err(engine)?;
        let spec = g.stats.spec.clone().unwrap_or_default();
        rep.check(
            g.tokens == plain,
            format!(
                "DeviceSession with {what}, {round} answer == plain: {} tokens in {} passes, {} drafts accepted, decode {:.0} tokens/s",
                g.tokens.len(),
                g.stats.decode_passes,
                spec.accepted_tokens(),
                g.stats.decode_tokens_per_second()
            ),
        );
    }
    Ok(rep)
}
