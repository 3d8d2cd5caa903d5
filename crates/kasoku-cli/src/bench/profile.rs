//! `kasoku bench --profile`: where a decode step's time goes, per kernel kind.
//!
//! The library has no timing hook yet, so this runs the decode step through the model's public
//! parts (embedding, norms, mixers, MLP matrices, head) in the order `Model::forward` uses,
//! with a timer around each: matrix products per weight format (MLP and head; their bytes give
//! the achieved GB/s), whole attention and Gated DeltaNet mixers (their projections included),
//! norms, SwiGLU, the embedding row, the residual adds and the argmax. The same steps also run
//! through `Model::forward`; `matches_forward` says whether both picked the same tokens (if
//! not, the library's forward changed and this mirror needs updating).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Result;
use kasoku::engine::sampler::argmax;
use kasoku::kernels::activation::swiglu_inplace;
use kasoku::kernels::matmul::{matmul, matmul_many, MatMulWeight};
use kasoku::model::{LayerState, Logits, Mixer, Model, ModelState};
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
    /// Total time of the profiled (instrumented) steps.
    pub total: Duration,
    /// The same steps through `Model::forward` (+ argmax), for comparison.
    pub forward_total: Duration,
    pub matches_forward: bool,
    pub entries: BTreeMap<String, Entry>,
}

struct Timers {
    entries: BTreeMap<String, Entry>,
}

impl Timers {
    fn time<T>(&mut self, kind: &str, bytes: u64, f: impl FnOnce() -> T) -> T {
        let t = Instant::now();
        let out = f();
        let e = self.entries.entry(kind.to_string()).or_default();
        e.time += t.elapsed();
        e.calls += 1;
        e.bytes += bytes;
        out
    }

    fn matmul(&mut self, w: &MatMulWeight, x: &[f32], y: &mut [f32]) {
        let kind = format!("matmul {}", w.dtype);
        self.time(&kind, w.size_bytes() as u64, || matmul(w, x, 1, y));
    }
}

/// Profiles `steps` greedy decode steps after `context`. The instrumented steps and the same
/// steps through `Model::forward` run in alternating blocks of `BLOCK`, so that a machine whose
/// speed drifts affects both alike.
///
/// `gdn_weight_bytes[i]`: the checkpoint bytes of layer `i`'s Gated DeltaNet tensors (their
/// packed matrices are private to the library), for the achieved GB/s; empty if unknown.
pub fn decode_profile(
    model: &Model,
    context: &[u32],
    ctx: usize,
    steps: usize,
    gdn_weight_bytes: &[u64],
) -> Result<Profile> {
    const BLOCK: usize = 8;
    let first = first_token(model, context, ctx)?;
    let mut ref_state = super::context_state(model, context, ctx)?;
    let mut state = super::context_state(model, context, ctx)?;
    let (mut ref_next, mut next) = (first, first);
    let mut reference = Vec::with_capacity(steps);
    let mut picked = Vec::with_capacity(steps);
    let mut timers = Timers {
        entries: BTreeMap::new(),
    };
    let (mut forward_total, mut total) = (Duration::ZERO, Duration::ZERO);
    let mut done = 0;
    while done < steps {
        let n = BLOCK.min(steps - done);
        let t = Instant::now();
        for _ in 0..n {
            let logits = model.forward(&mut ref_state, &[ref_next], Logits::Last)?;
            ref_next = argmax(&logits);
            reference.push(ref_next);
        }
        forward_total += t.elapsed();
        let t = Instant::now();
        for _ in 0..n {
            let logits = step(model, &mut state, next, &mut timers, gdn_weight_bytes)?;
            next = timers.time("argmax", 0, || argmax(&logits));
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
        entries: timers.entries,
    })
}

fn first_token(model: &Model, context: &[u32], ctx: usize) -> Result<u32> {
    let mut state = model.new_state(ctx);
    Ok(argmax(&model.forward(&mut state, context, Logits::Last)?))
}

/// One decode step through the model's parts, mirroring `Model::forward` for one token.
fn step(
    model: &Model,
    state: &mut ModelState,
    token: u32,
    tm: &mut Timers,
    gdn_weight_bytes: &[u64],
) -> Result<Vec<f32>> {
    let cfg = &model.config;
    let h = cfg.hidden;
    anyhow::ensure!(state.len < state.max_len, "profile: context full");
    let mut x = vec![0f32; h];
    let row = (model.embedding.tensor().data.as_slice().len() / cfg.vocab.max(1)) as u64;
    tm.time("embedding row", row, || {
        model.embedding.lookup(&[token], &mut x)
    });
    let mut normed = vec![0f32; h];
    let mut delta = vec![0f32; h];
    for (i, (layer, st)) in model.layers.iter().zip(state.layers.iter_mut()).enumerate() {
        tm.time("rmsnorm", 0, || layer.attn_norm.forward(&x, &mut normed));
        let (kind, bytes) = match (&layer.mixer, &*st) {
            (Mixer::Attention(a), LayerState::Kv(c)) => {
                let w: usize = a
                    .qkv
                    .matrices()
                    .into_iter()
                    .chain([&a.wo])
                    .map(|w| w.size_bytes())
                    .sum();
                let kv = (c.len() + 1) * c.kv_dim() * 2 * 4;
                ("attention layer (qkv/o + rope + kv)", (w + kv) as u64)
            }
            (_, LayerState::Gdn(g)) => {
                let w = gdn_weight_bytes.get(i).copied().unwrap_or(0);
                let st = ((g.ssm.len() + g.conv.len()) * 4) as u64;
                ("gated deltanet layer (all)", if w > 0 { w + st } else { 0 })
            }
            _ => ("mixer (state mismatch)", 0),
        };
        tm.time(kind, bytes, || {
            layer.mixer.forward(st, &normed, 1, &mut delta)
        })?;
        tm.time("residual add", 0, || {
            x.iter_mut().zip(&delta).for_each(|(a, d)| *a += d)
        });
        tm.time("rmsnorm", 0, || layer.ffn_norm.forward(&x, &mut normed));
        let m = &layer.mlp;
        let mut g = vec![0f32; m.gate.rows];
        let mut u = vec![0f32; m.up.rows];
        // One job for gate and up, as `Mlp::forward` runs them.
        let kind = if m.gate.dtype == m.up.dtype {
            format!("matmul {}", m.gate.dtype)
        } else {
            format!("matmul {} + {}", m.gate.dtype, m.up.dtype)
        };
        let bytes = (m.gate.size_bytes() + m.up.size_bytes()) as u64;
        tm.time(&kind, bytes, || {
            matmul_many(&[&m.gate, &m.up], &normed, 1, &mut [&mut g, &mut u])
        });
        tm.time("swiglu", 0, || swiglu_inplace(&mut g, &u));
        tm.matmul(&m.down, &g, &mut delta);
        tm.time("residual add", 0, || {
            x.iter_mut().zip(&delta).for_each(|(a, d)| *a += d)
        });
    }
    state.len += 1;
    tm.time("rmsnorm", 0, || model.output_norm.forward(&x, &mut normed));
    let mut logits = vec![0f32; cfg.vocab];
    let kind = format!("matmul {} (head)", model.head.dtype);
    tm.time(&kind, model.head.size_bytes() as u64, || {
        matmul(&model.head, &normed, 1, &mut logits)
    });
    Ok(logits)
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
        "method": "decode step run through the model's public parts with a timer around each (no library hook)",
        "entries": entries,
    })
}

pub fn print(p: &Profile) {
    let n = p.steps.max(1) as f64;
    eprintln!(
        "profile: {} decode steps, {:.3} ms/step instrumented, {:.3} ms/step through Model::forward{}",
        p.steps,
        ms(p.total) / n,
        ms(p.forward_total) / n,
        if p.matches_forward { "" } else { "  (WARNING: tokens differ from Model::forward)" }
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
