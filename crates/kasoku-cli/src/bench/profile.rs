//! `kasoku bench --profile`: where a decode step's time goes, per step of the pass.
//!
//! Decode steps run through the library's own forward pass (`Model::run_traced`) with a
//! [`Trace`] that times every named step: matrix products per weight format (the bytes they
//! read give the achieved GB/s), attention, the Gated DeltaNet recurrence, conv, norms, RoPE,
//! SwiGLU, residual adds, the embedding row, and the argmax. The same steps also run untraced
//! (`Model::run`); `matches_forward` says whether both picked the same tokens, and the two
//! totals give the tracing overhead.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Result;
use kasoku::engine::sampler::argmax;
use kasoku::kernels::matmul::WeightFormat;
use kasoku::model::{Batch, Logits, Model, Op, Output, Trace};
use serde_json::{json, Value};

/// Time and bytes of one kind of work over the profiled steps.
#[derive(Default, Clone, Debug)]
pub struct Entry {
    pub calls: u64,
    pub time: Duration,
    /// Bytes read from memory by this work (0: not counted).
    pub bytes: u64,
}

#[derive(Debug)]
pub struct Profile {
    pub steps: usize,
    /// Total time of the profiled (traced) steps.
    pub total: Duration,
    /// The same steps untraced (+ argmax), for comparison.
    pub forward_total: Duration,
    pub matches_forward: bool,
    pub entries: BTreeMap<String, Entry>,
}

/// Times every step of a pass, by kind: a matrix product by its weight format (the head
/// apart), anything else by its name.
#[derive(Default)]
struct Timers {
    entries: Vec<((&'static str, Option<WeightFormat>), Entry)>,
}

impl Timers {
    fn record(&mut self, op: &Op, time: Duration) {
        let key = match op.format {
            Some(d) if op.name == "head" => ("matmul (head)", Some(d)),
            Some(d) => ("matmul", Some(d)),
            None => (op.name, None),
        };
        let at = match self.entries.iter().position(|(k, _)| *k == key) {
            Some(at) => at,
            None => {
                self.entries.push((key, Entry::default()));
                self.entries.len() - 1
            }
        };
        let e = &mut self.entries[at].1;
        e.time += time;
        e.calls += 1;
        e.bytes += op.bytes;
    }

    fn into_entries(self) -> BTreeMap<String, Entry> {
        self.entries
            .into_iter()
            .map(|((name, dtype), e)| {
                let kind = match dtype {
                    Some(d) if name == "matmul (head)" => format!("matmul {d} (head)"),
                    Some(d) => format!("matmul {d}"),
                    None => name.to_string(),
                };
                (kind, e)
            })
            .collect()
    }
}

impl Trace for Timers {
    fn op<R>(&mut self, op: Op, work: impl FnOnce() -> R) -> R {
        let t = Instant::now();
        let out = work();
        self.record(&op, t.elapsed());
        out
    }
}

/// Profiles `steps` greedy decode steps after `context`. The traced steps and the same steps
/// untraced run in alternating blocks of `BLOCK`, so that a machine whose speed drifts affects
/// both alike.
pub fn decode_profile(model: &Model, context: &[u32], ctx: usize, steps: usize) -> Result<Profile> {
    const BLOCK: usize = 8;
    let first = first_token(model, context, ctx)?;
    let mut ref_state = super::context_state(model, context, ctx)?;
    let mut state = super::context_state(model, context, ctx)?;
    let (mut ref_next, mut next) = (first, first);
    let mut reference = Vec::with_capacity(steps);
    let mut picked = Vec::with_capacity(steps);
    let mut timers = Timers::default();
    let mut out = Output::default();
    let (mut forward_total, mut total) = (Duration::ZERO, Duration::ZERO);
    let mut done = 0;
    while done < steps {
        let n = BLOCK.min(steps - done);
        let t = Instant::now();
        for _ in 0..n {
            let batch = Batch::chain(std::slice::from_ref(&ref_next)).logits(Logits::Last);
            model.run(&mut ref_state, &batch, &mut out)?;
            ref_next = argmax(&out.logits);
            reference.push(ref_next);
        }
        forward_total += t.elapsed();
        let t = Instant::now();
        for _ in 0..n {
            anyhow::ensure!(state.len() < state.max_len(), "profile: context full");
            let batch = Batch::chain(std::slice::from_ref(&next)).logits(Logits::Last);
            model.run_traced(&mut state, &batch, &mut out, &mut timers)?;
            next = timers.op(Op::new("argmax", None, 1), || argmax(&out.logits));
            picked.push(next);
        }
        total += t.elapsed();
        done += n;
    }
    Ok(Profile {
        steps,
        total,
        forward_total,
        matches_forward: picked == reference,
        entries: timers.into_entries(),
    })
}

fn first_token(model: &Model, context: &[u32], ctx: usize) -> Result<u32> {
    let mut state = model.new_state(ctx);
    Ok(argmax(&model.forward(&mut state, context, Logits::Last)?))
}

pub fn to_json(p: &Profile) -> Value {
    let entries: Vec<Value> = sorted(p)
        .into_iter()
        .map(|(k, e)| {
            json!({
                "kind": k,
                "calls": e.calls,
                "ms_per_step": ms(e.time) / p.steps.max(1) as f64,
                "share": e.time.as_secs_f64() / p.total.as_secs_f64().max(1e-12),
                "bytes_per_step": e.bytes / p.steps.max(1) as u64,
                "gbps": gbps(e),
            })
        })
        .collect();
    json!({
        "steps": p.steps,
        "ms_per_step": ms(p.total) / p.steps.max(1) as f64,
        "forward_ms_per_step": ms(p.forward_total) / p.steps.max(1) as f64,
        "matches_forward": p.matches_forward,
        "method": "decode steps through Model::run_traced, a timer around each named step",
        "entries": entries,
    })
}

pub fn print(p: &Profile) {
    let n = p.steps.max(1) as f64;
    eprintln!(
        "profile: {} decode steps, {:.3} ms/step traced, {:.3} ms/step untraced{}",
        p.steps,
        ms(p.total) / n,
        ms(p.forward_total) / n,
        if p.matches_forward {
            ""
        } else {
            "  (WARNING: traced and untraced tokens differ)"
        }
    );
    eprintln!(
        "  {:<40} {:>9} {:>7} {:>9}",
        "kind", "ms/step", "share", "GB/s"
    );
    for (k, e) in sorted(p) {
        eprintln!(
            "  {:<40} {:>9.3} {:>6.1}% {:>9}",
            k,
            ms(e.time) / n,
            100.0 * e.time.as_secs_f64() / p.total.as_secs_f64().max(1e-12),
            gbps(e)
                .map(|g| format!("{g:.1}"))
                .unwrap_or_else(|| "-".into())
        );
    }
}

fn sorted(p: &Profile) -> Vec<(&String, &Entry)> {
    let mut v: Vec<_> = p.entries.iter().collect();
    v.sort_by_key(|e| std::cmp::Reverse(e.1.time));
    v
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn gbps(e: &Entry) -> Option<f64> {
    (e.bytes > 0 && !e.time.is_zero()).then(|| e.bytes as f64 / e.time.as_secs_f64() / 1e9)
}
