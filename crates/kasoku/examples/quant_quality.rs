//! Quality of quantized models against a reference model on held-out text: for every chunk of
//! `CTX` tokens of each text file, the next-token distributions of every position, compared
//! as the mean KL divergence KL(reference ‖ model), the agreement of their argmax (top-1), and
//! each model's perplexity on the text. All models are loaded at once and see the same
//! chunks; the reference runs once per chunk. One JSON object per (model, text group) on
//! stdout. Driven by bench/quant_quality.py.
//!
//! `cargo run --release -p kasoku --example quant_quality -- --ref REF --model LABEL=PATH ...
//!  --text GROUP=FILE ... [--ctx 512] [--chunks 4]`
//!
//! The texts are tokenized with the reference's tokenizer (no special tokens); each group's
//! files are concatenated (in order, separated by a blank line) and cut into chunks of `CTX`
//! tokens, of which the first `CHUNKS` are used. Position `i` of a chunk predicts token
//! `i + 1`, so a chunk contributes `CTX − 1` positions.

use std::collections::BTreeMap;
use std::time::Instant;

use kasoku::engine::LoadedModel;
use kasoku::model::{KvType, Logits, Model};

struct Acc {
    kl: f64,
    top1: usize,
    nll: f64,
    ref_nll: f64,
    n: usize,
}

/// Log-softmax in f64.
fn log_softmax(row: &[f32], out: &mut [f64]) {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v)) as f64;
    let sum: f64 = row.iter().map(|&v| (v as f64 - max).exp()).sum();
    let lse = max + sum.ln();
    for (o, &v) in out.iter_mut().zip(row) {
        *o = v as f64 - lse;
    }
}

fn argmax(row: &[f32]) -> usize {
    row.iter()
        .enumerate()
        .fold(
            (0, f32::NEG_INFINITY),
            |m, (i, &v)| if v > m.1 { (i, v) } else { m },
        )
        .0
}

fn usage() -> ! {
    eprintln!(
        "usage: quant_quality --ref REF --model LABEL=PATH ... --text GROUP=FILE ... [--ctx N] \
         [--chunks N]"
    );
    std::process::exit(2)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let (mut reference, mut models, mut texts) = (None, Vec::new(), Vec::new());
    let (mut ctx, mut chunks) = (512usize, 4usize);
    while let Some(a) = args.next() {
        let mut val = || args.next().unwrap_or_else(|| usage());
        match a.as_str() {
            "--ref" => reference = Some(val()),
            "--model" => {
                let v = val();
                let (l, p) = v.split_once('=').unwrap_or_else(|| usage());
                models.push((l.to_string(), p.to_string()));
            }
            "--text" => {
                let v = val();
                let (g, p) = v.split_once('=').unwrap_or_else(|| usage());
                texts.push((g.to_string(), p.to_string()));
            }
            "--ctx" => ctx = val().parse().unwrap_or_else(|_| usage()),
            "--chunks" => chunks = val().parse().unwrap_or_else(|_| usage()),
            _ => usage(),
        }
    }
    let reference = reference.unwrap_or_else(|| usage());
    let t0 = Instant::now();
    let refm = LoadedModel::load_with(&reference, KvType::F32).expect("reference model");
    let loaded: Vec<(String, Model)> = models
        .iter()
        .map(|(l, p)| {
            (
                l.clone(),
                Model::load(p).unwrap_or_else(|e| panic!("{p}: {e}")),
            )
        })
        .collect();
    eprintln!(
        "loaded {} models in {:.1} s",
        loaded.len() + 1,
        t0.elapsed().as_secs_f64()
    );
    let mut groups: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for (g, path) in &texts {
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let toks = refm.tokenizer.encode(&text, false).expect("tokenize");
        let all = groups.entry(g.clone()).or_default();
        if !all.is_empty() {
            all.extend(refm.tokenizer.encode("\n\n", false).expect("tokenize"));
        }
        all.extend(toks);
    }
    let vocab = refm.model.config.vocab;
    let mut ref_lp = vec![0f64; ctx * vocab];
    let mut lp = vec![0f64; vocab];
    for (g, toks) in &groups {
        let mut acc: Vec<Acc> = loaded
            .iter()
            .map(|_| Acc {
                kl: 0.0,
                top1: 0,
                nll: 0.0,
                ref_nll: 0.0,
                n: 0,
            })
            .collect();
        let used = toks.chunks_exact(ctx).take(chunks).collect::<Vec<_>>();
        if used.is_empty() {
            eprintln!("{g}: fewer than {ctx} tokens ({})", toks.len());
            continue;
        }
        for (c, chunk) in used.iter().enumerate() {
            let t = Instant::now();
            let mut st = refm.model.new_state(ctx);
            let ref_logits = refm.model.forward(&mut st, chunk, Logits::All).unwrap();
            let mut ref_top = Vec::with_capacity(ctx);
            for i in 0..ctx {
                let row = &ref_logits[i * vocab..(i + 1) * vocab];
                log_softmax(row, &mut ref_lp[i * vocab..(i + 1) * vocab]);
                ref_top.push(argmax(row));
            }
            drop(ref_logits);
            for ((_, m), a) in loaded.iter().zip(acc.iter_mut()) {
                let mut st = m.new_state(ctx);
                let logits = m.forward(&mut st, chunk, Logits::All).unwrap();
                for i in 0..ctx - 1 {
                    let row = &logits[i * vocab..(i + 1) * vocab];
                    log_softmax(row, &mut lp);
                    let r = &ref_lp[i * vocab..(i + 1) * vocab];
                    a.kl += r
                        .iter()
                        .zip(&lp)
                        .map(|(&p, &q)| p.exp() * (p - q))
                        .sum::<f64>();
                    a.top1 += usize::from(argmax(row) == ref_top[i]);
                    let next = chunk[i + 1] as usize;
                    a.nll -= lp[next];
                    a.ref_nll -= r[next];
                    a.n += 1;
                }
            }
            eprintln!(
                "{g} chunk {}/{}: {:.1} s",
                c + 1,
                used.len(),
                t.elapsed().as_secs_f64()
            );
        }
        for ((label, _), a) in loaded.iter().zip(&acc) {
            let n = a.n.max(1) as f64;
            println!(
                "{}",
                serde_json::json!({
                    "model": label,
                    "group": g,
                    "positions": a.n,
                    "kl": a.kl / n,
                    "top1": a.top1 as f64 / n,
                    "ppl": (a.nll / n).exp(),
                    "ref_ppl": (a.ref_nll / n).exp(),
                })
            );
        }
    }
}
