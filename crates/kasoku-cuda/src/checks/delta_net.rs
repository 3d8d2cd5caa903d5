//! Qwen3.5's GPU kernels against the CPU's (`kasoku::kernels::{conv1d, gated_delta}`, the
//! norms and gates) on random shapes: the conv with each head's preparation, the recurrence
//! over a chain (outputs and state) and over a tree (outputs, and each node's bits against
//! decoding its path on the GPU), the commit of accepted paths (the states decoding the path
//! leaves, bit for bit), the gated output norm and the attention output gate.

use kasoku::kernels::conv1d::{causal_conv1d_silu, tree_conv1d_silu, ConvTaps};
use kasoku::kernels::gated_delta::{
    gates, l2norm_heads, recurrent, tree::tree_recurrent, GdnDims, GdnInputs, HeadMap,
};
use kasoku::model::{TokenTree, TreeBuilder};

use super::{f64s, out_buf, randv, rel_err, QuantBufs, Report, R};
use crate::kernels::{Acts, GdnCommit, GdnConv, GdnRecurrence, GdnShape, Kernels};
use crate::model::{fill_meta, MetaLayout};
use crate::runtime::{as_bytes, DeviceBuffer};
use crate::synth::Rng;

/// A layer's random conv taps, gate constants and norm, and a pass's random projections
/// (`n` rows): what the GPU and the CPU both start from.
struct Inputs {
    taps: Vec<f32>,
    ssm_a: Vec<f32>,
    dt_bias: Vec<f32>,
    norm: Vec<f32>,
    mixed: Vec<f32>,
    /// Per row b then a (`2·nv`).
    ba: Vec<f32>,
    z: Vec<f32>,
}

fn inputs(rng: &mut Rng, s: GdnShape, n: usize) -> Inputs {
    let (cd, vd, nv) = (s.conv_dim(), s.value_dim(), s.nv as usize);
    Inputs {
        taps: randv(rng, cd * s.kernel as usize, 0.6),
        ssm_a: randv(rng, nv, 1.0).iter().map(|a| -a.exp()).collect(),
        dt_bias: randv(rng, nv, 1.0),
        norm: randv(rng, s.dv as usize, 0.5)
            .iter()
            .map(|w| 1.0 + w)
            .collect(),
        mixed: randv(rng, n * cd, 2.0),
        ba: randv(rng, n * 2 * nv, 2.0),
        z: randv(rng, n * vd, 2.0),
    }
}

/// The rows `rows` of each per-row input.
fn pick(s: GdnShape, x: &Inputs, rows: &[usize]) -> Inputs {
    let take = |v: &[f32], w: usize| -> Vec<f32> {
        rows.iter()
            .flat_map(|&r| v[r * w..(r + 1) * w].iter().copied())
            .collect()
    };
    Inputs {
        mixed: take(&x.mixed, s.conv_dim()),
        ba: take(&x.ba, 2 * s.nv as usize),
        z: take(&x.z, s.value_dim()),
        taps: x.taps.clone(),
        ssm_a: x.ssm_a.clone(),
        dt_bias: x.dt_bias.clone(),
        norm: x.norm.clone(),
    }
}

/// One layer's states on the device.
struct DeviceStates {
    ssm: DeviceBuffer,
    conv: DeviceBuffer,
}

impl DeviceStates {
    fn upload(k: &Kernels, ssm: &[f32], conv: &[f32]) -> R<DeviceStates> {
        Ok(DeviceStates {
            ssm: k.gpu.upload_f32(ssm)?,
            conv: k.gpu.upload_f32(conv)?,
        })
    }

    fn read(&self, s: GdnShape) -> R<(Vec<f32>, Vec<f32>)> {
        Ok((
            self.ssm.read_f32(s.state_len())?,
            self.conv.read_f32(s.conv_state_len())?,
        ))
    }
}

/// What a pass leaves on the device (its commit data) and its outputs.
struct PassOut {
    mixed: DeviceBuffer,
    qkv: DeviceBuffer,
    gates: DeviceBuffer,
    deltas: DeviceBuffer,
    /// The recurrence's outputs, before the gated norm.
    raw: Vec<f32>,
    /// After the gated norm.
    out: Vec<f32>,
}

/// A pass of the GPU model's Gated DeltaNet kernels over `x` (a chain at `past`, or `tree`).
fn pass(
    k: &Kernels,
    s: GdnShape,
    x: &Inputs,
    st: &DeviceStates,
    past: usize,
    tree: Option<&TokenTree>,
) -> R<PassOut> {
    let gpu = &k.gpu;
    let (cd, vd, nv) = (s.conv_dim(), s.value_dim(), s.nv as usize);
    let n = x.mixed.len() / cd;
    let layout = MetaLayout::new(64);
    let mut words = vec![0u32; layout.words];
    let toks: Vec<u32> = (0..n as u32).collect();
    fill_meta(&layout, past, &toks, tree, &mut words);
    let meta = gpu.upload(as_bytes(&words))?;
    let (taps, ssm_a, dt_bias, norm) = (
        gpu.upload_f32(&x.taps)?,
        gpu.upload_f32(&x.ssm_a)?,
        gpu.upload_f32(&x.dt_bias)?,
        gpu.upload_f32(&x.norm)?,
    );
    let (mixed, ba, z) = (
        gpu.upload_f32(&x.mixed)?,
        gpu.upload_f32(&x.ba)?,
        gpu.upload_f32(&x.z)?,
    );
    let (qkv, gates, deltas, o) = (
        out_buf(gpu, n * cd)?,
        out_buf(gpu, n * 2 * nv)?,
        out_buf(gpu, n * vd)?,
        out_buf(gpu, n * vd)?,
    );
    k.gdn_conv(&GdnConv {
        shape: s,
        n,
        mixed: mixed.ptr(),
        taps: taps.ptr(),
        conv_state: st.conv.ptr(),
        ba: ba.ptr(),
        ssm_a: ssm_a.ptr(),
        dt_bias: dt_bias.ptr(),
        q_scale: 1.0 / (s.dk as f32).sqrt(),
        batch: meta.ptr(),
        pos: meta.at(layout.pos * 4),
        path: meta.at(layout.path * 4),
        qkv: qkv.ptr(),
        gates: gates.ptr(),
    })?;
    k.gdn_recurrence(&GdnRecurrence {
        shape: s,
        qkv: qkv.ptr(),
        gates: gates.ptr(),
        state: st.ssm.ptr(),
        batch: meta.ptr(),
        pos: meta.at(layout.pos * 4),
        path: meta.at(layout.path * 4),
        out: o.ptr(),
        deltas: deltas.ptr(),
        mixed: mixed.ptr(),
        conv_state: st.conv.ptr(),
    })?;
    let raw = o.read_f32(n * vd)?;
    k.gdn_out(s, o.ptr(), z.ptr(), norm.ptr(), 1e-6, n, Acts::default())?;
    let out = o.read_f32(n * vd)?;
    Ok(PassOut {
        mixed,
        qkv,
        gates,
        deltas,
        raw,
        out,
    })
}

/// The CPU's state layout (`nv × dk × dv`) from the GPU's (`nv × dv × dk`).
fn cpu_layout(s: GdnShape, gpu: &[f32]) -> Vec<f32> {
    let (nv, dk, dv) = (s.nv as usize, s.dk as usize, s.dv as usize);
    let mut out = vec![0f32; gpu.len()];
    for h in 0..nv {
        for j in 0..dv {
            for i in 0..dk {
                out[(h * dk + i) * dv + j] = gpu[(h * dv + j) * dk + i];
            }
        }
    }
    out
}

/// The CPU's prepared q, k, v, g, β for `x` after conv state `conv` (a chain; `tree`: each
/// node over its path), and the conv state a chain leaves.
struct CpuPrepared {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
    beta: Vec<f32>,
}

fn cpu_prepare(s: GdnShape, x: &Inputs, conv: &mut [f32], tree: Option<&TokenTree>) -> CpuPrepared {
    let (cd, kd, vd, nv) = (s.conv_dim(), s.key_dim(), s.value_dim(), s.nv as usize);
    let n = x.mixed.len() / cd;
    let taps = ConvTaps::from_channel_major(&x.taps, cd, s.kernel as usize);
    let mut y = vec![0f32; n * cd];
    match tree {
        None => causal_conv1d_silu(&taps, conv, &x.mixed, n, &mut y),
        Some(t) => tree_conv1d_silu(&taps, conv, &x.mixed, t.parents(), &mut y),
    }
    let split = |at: usize, w: usize| -> Vec<f32> {
        (0..n)
            .flat_map(|r| y[r * cd + at..r * cd + at + w].iter().copied())
            .collect()
    };
    let (mut q, mut k, v) = (split(0, kd), split(kd, kd), split(2 * kd, vd));
    l2norm_heads(&mut q, s.dk as usize, 1.0 / (s.dk as f32).sqrt());
    l2norm_heads(&mut k, s.dk as usize, 1.0);
    let b: Vec<f32> = (0..n)
        .flat_map(|r| x.ba[r * 2 * nv..r * 2 * nv + nv].iter().copied())
        .collect();
    let a: Vec<f32> = (0..n)
        .flat_map(|r| x.ba[r * 2 * nv + nv..(r + 1) * 2 * nv].iter().copied())
        .collect();
    let (mut g, mut beta) = (vec![0f32; n * nv], vec![0f32; n * nv]);
    gates(&a, &b, &x.ssm_a, &x.dt_bias, &mut g, &mut beta);
    CpuPrepared { q, k, v, g, beta }
}

fn dims(s: GdnShape) -> GdnDims {
    GdnDims {
        nk: s.nk as usize,
        nv: s.nv as usize,
        dk: s.dk as usize,
        dv: s.dv as usize,
        map: if s.grouped == 1 {
            HeadMap::Grouped
        } else {
            HeadMap::Tiled
        },
    }
}

/// The CPU's gated output norm of raw recurrence outputs.
fn cpu_out(s: GdnShape, raw: &[f32], x: &Inputs) -> Vec<f32> {
    let mut o = raw.to_vec();
    kasoku::kernels::norm::rmsnorm_inplace(&mut o, &x.norm, 1e-6);
    for (v, &z) in o.iter_mut().zip(&x.z) {
        *v *= kasoku::kernels::activation::silu(z);
    }
    let _ = s;
    o
}

/// A tree of 10 nodes with branches at depths 0, 1 and 2 (tokens are row indices).
fn tree10() -> TokenTree {
    let mut b = TreeBuilder::new(0);
    let a = b.add(0, 1);
    let c = b.add(0, 2);
    let d = b.add(a, 3);
    b.add(a, 4);
    let e = b.add(c, 5);
    let f = b.add(d, 6);
    b.add(e, 7);
    let g = b.add(f, 8);
    b.add(g, 9);
    b.build().0
}

/// Every Gated DeltaNet kernel check, and the attention output gate.
pub fn delta_net_checks(k: &Kernels) -> R<Report> {
    let mut rep = Report::default();
    let mut rng = Rng(0x9d17);
    let shapes = [
        (
            "tiny fixture's",
            GdnShape {
                nk: 2,
                nv: 4,
                dk: 16,
                dv: 16,
                kernel: 4,
                grouped: 0,
            },
        ),
        (
            "Qwen3.5-2B's",
            GdnShape {
                nk: 16,
                nv: 16,
                dk: 128,
                dv: 128,
                kernel: 4,
                grouped: 0,
            },
        ),
        (
            "Qwen3.5-9B's (nv = 2·nk)",
            GdnShape {
                nk: 16,
                nv: 32,
                dk: 128,
                dv: 128,
                kernel: 4,
                grouped: 0,
            },
        ),
        (
            "grouped heads, dv 64",
            GdnShape {
                nk: 2,
                nv: 6,
                dk: 64,
                dv: 64,
                kernel: 4,
                grouped: 1,
            },
        ),
    ];
    for (what, s) in shapes {
        rep.merge(shape_checks(k, &mut rng, what, s)?);
    }
    rep.merge(gate_check(k, &mut rng)?);
    Ok(rep)
}

fn shape_checks(k: &Kernels, rng: &mut Rng, what: &str, s: GdnShape) -> R<Report> {
    let mut rep = Report::default();
    let (vd, nv) = (s.value_dim(), s.nv as usize);
    let d = dims(s);
    // A chain of 37 rows from a random state (a state from earlier tokens).
    let n = 37;
    let x = inputs(rng, s, n);
    let ssm0 = randv(rng, s.state_len(), 0.3);
    let conv0 = randv(rng, s.conv_state_len(), 2.0);
    let st = DeviceStates::upload(k, &ssm0, &conv0)?;
    let got = pass(k, s, &x, &st, 100, None)?;
    let (ssm_gpu, conv_gpu) = st.read(s)?;
    let mut conv_cpu = conv0.clone();
    let p = cpu_prepare(s, &x, &mut conv_cpu, None);
    let qkv_gpu = got.qkv.read_f32(n * s.conv_dim())?;
    let (cd, kd) = (s.conv_dim(), s.key_dim());
    let part = |at: usize, w: usize| -> Vec<f32> {
        (0..n)
            .flat_map(|r| qkv_gpu[r * cd + at..r * cd + at + w].iter().copied())
            .collect()
    };
    let e_prep = rel_err(&part(0, kd), &f64s(&p.q))
        .max(rel_err(&part(kd, kd), &f64s(&p.k)))
        .max(rel_err(&part(2 * kd, vd), &f64s(&p.v)));
    let gates_gpu = got.gates.read_f32(n * 2 * nv)?;
    let g_gpu: Vec<f32> = (0..n)
        .flat_map(|r| gates_gpu[r * 2 * nv..r * 2 * nv + nv].iter().copied())
        .collect();
    let b_gpu: Vec<f32> = (0..n)
        .flat_map(|r| gates_gpu[r * 2 * nv + nv..(r + 1) * 2 * nv].iter().copied())
        .collect();
    let e_gates = rel_err(&g_gpu, &f64s(&p.g)).max(rel_err(&b_gpu, &f64s(&p.beta)));
    let conv_same = conv_gpu == conv_cpu;
    rep.check(
        e_prep < 1e-5 && e_gates < 1e-5 && conv_same,
        format!(
            "gdn_conv {what} ({n} chain rows): q|k|v rel err vs CPU conv1d + l2 norms {e_prep:.1e}, gates {e_gates:.1e} (bound 1e-5); the conv state advanced as the CPU's: {conv_same}"
        ),
    );
    let inputs_cpu = GdnInputs {
        q: &p.q,
        k: &p.k,
        v: &p.v,
        g: &p.g,
        beta: &p.beta,
    };
    let mut ssm_cpu = cpu_layout(s, &ssm0);
    let mut o_cpu = vec![0f32; n * vd];
    recurrent(&d, &inputs_cpu, n, &mut ssm_cpu, &mut o_cpu);
    let e_o = rel_err(&got.raw, &f64s(&o_cpu));
    let e_s = rel_err(&cpu_layout(s, &ssm_gpu), &f64s(&ssm_cpu));
    rep.check(
        e_o < 1e-5 && e_s < 1e-5,
        format!(
            "gdn_recurrence {what} ({n} chain rows): outputs rel err vs CPU recurrent {e_o:.1e}, state {e_s:.1e} (bound 1e-5)"
        ),
    );
    let want = cpu_out(s, &o_cpu, &x);
    let e = rel_err(&got.out, &f64s(&want));
    rep.check(
        e < 1e-5,
        format!("gdn_out {what}: rel err vs CPU rmsnorm · silu(z) {e:.1e} (bound 1e-5)"),
    );
    // The int8 blocks of the output (what ssm_out reads).
    let qb = QuantBufs::new(&k.gpu, n * vd)?;
    let od = k.gpu.upload_f32(&got.raw)?;
    let (zd, nd) = (k.gpu.upload_f32(&x.z)?, k.gpu.upload_f32(&x.norm)?);
    k.gdn_out(s, od.ptr(), zd.ptr(), nd.ptr(), 1e-6, n, qb.acts(&od, vd))?;
    let q_ok = qb.equal_ref(&od.read_f32(n * vd)?)?;
    rep.check(
        q_ok,
        format!("gdn_out {what}: its int8 blocks equal the reference's"),
    );

    // Split chains: the same bits as one pass.
    let st2 = DeviceStates::upload(k, &ssm0, &conv0)?;
    let mut outs = Vec::new();
    let mut at = 0;
    for len in [1usize, 16, 20] {
        let rows: Vec<usize> = (at..at + len).collect();
        outs.extend(pass(k, s, &pick(s, &x, &rows), &st2, 100 + at, None)?.out);
        at += len;
    }
    let same = outs == got.out && st2.read(s)? == (ssm_gpu.clone(), conv_gpu.clone());
    rep.check(
        same,
        format!("gated delta net {what}: passes of 1, 16 and 20 rows give one pass's bits (outputs and states)"),
    );

    // A tree: outputs against the CPU's tree form; each node against decoding its path on
    // the GPU, bit for bit; the states untouched; commits of accepted paths.
    let tree = tree10();
    let tn = tree.len();
    let xt = inputs(rng, s, tn);
    let xt = Inputs {
        taps: x.taps.clone(),
        ssm_a: x.ssm_a.clone(),
        dt_bias: x.dt_bias.clone(),
        norm: x.norm.clone(),
        ..xt
    };
    let base = (ssm_gpu.clone(), conv_gpu.clone());
    let st3 = DeviceStates::upload(k, &base.0, &base.1)?;
    let tp = pass(k, s, &xt, &st3, 137, Some(&tree))?;
    let untouched = st3.read(s)? == base;
    let mut conv_t = base.1.clone();
    let pt = cpu_prepare(s, &xt, &mut conv_t, Some(&tree));
    let (mut o_t, mut deltas_t) = (vec![0f32; tn * vd], vec![0f32; tn * vd]);
    tree_recurrent(
        &d,
        &GdnInputs {
            q: &pt.q,
            k: &pt.k,
            v: &pt.v,
            g: &pt.g,
            beta: &pt.beta,
        },
        tree.parents(),
        &cpu_layout(s, &base.0),
        &mut o_t,
        &mut deltas_t,
    );
    let e = rel_err(&tp.raw, &f64s(&o_t));
    rep.check(
        e < 1e-5 && untouched,
        format!("gdn_recurrence {what} over a {tn}-node tree: rel err vs CPU tree_recurrent {e:.1e} (bound 1e-5); the states untouched: {untouched}"),
    );
    let mut bad = Vec::new();
    for i in 0..tn {
        let path = tree.path(i);
        let dec = DeviceStates::upload(k, &base.0, &base.1)?;
        let mut last = Vec::new();
        for (depth, &node) in path.iter().enumerate() {
            last = pass(k, s, &pick(s, &xt, &[node]), &dec, 137 + depth, None)?.out;
        }
        if last[..] != tp.out[i * vd..(i + 1) * vd] {
            bad.push(i);
        }
    }
    rep.check(
        bad.is_empty(),
        format!("gated delta net {what}: every tree node has the bits of decoding its path one row at a time{}", if bad.is_empty() { String::new() } else { format!(" (not nodes {bad:?})") }),
    );
    // The deepest path, a path shorter than the conv's history, the root alone.
    let deepest = (0..tn).max_by_key(|&i| tree.depth(i)).unwrap_or(0);
    let shallow = (0..tn).find(|&i| tree.depth(i) == 1).unwrap_or(0);
    for path in [tree.path(deepest), tree.path(shallow), vec![0]] {
        let c = DeviceStates::upload(k, &base.0, &base.1)?;
        let pd = k.gpu.upload(as_bytes(
            &path.iter().map(|&i| i as u32).collect::<Vec<u32>>(),
        ))?;
        k.gdn_commit(&GdnCommit {
            shape: s,
            layers: 1,
            state: c.ssm.ptr(),
            state_stride: 0,
            conv_state: c.conv.ptr(),
            conv_stride: 0,
            mixed: tp.mixed.ptr(),
            mixed_stride: 0,
            qkv: tp.qkv.ptr(),
            qkv_stride: 0,
            gates: tp.gates.ptr(),
            gates_stride: 0,
            deltas: tp.deltas.ptr(),
            deltas_stride: 0,
            path: pd.ptr(),
            len: path.len(),
        })?;
        let dec = DeviceStates::upload(k, &base.0, &base.1)?;
        pass(k, s, &pick(s, &xt, &path), &dec, 137, None)?;
        let same = c.read(s)? == dec.read(s)?;
        rep.check(
            same,
            format!(
                "gdn_commit {what}: a path of {} nodes leaves decoding's states bit for bit",
                path.len()
            ),
        );
    }
    Ok(rep)
}

/// Qwen3.5's attention output gate against the CPU's.
fn gate_check(k: &Kernels, rng: &mut Rng) -> R<Report> {
    let mut rep = Report::default();
    let len = 7 * 2048;
    let (x, g) = (randv(rng, len, 3.0), randv(rng, len, 12.0));
    let (xd, gd) = (k.gpu.upload_f32(&x)?, k.gpu.upload_f32(&g)?);
    let qb = QuantBufs::new(&k.gpu, len)?;
    k.sigmoid_gate(xd.ptr(), gd.ptr(), len, qb.acts(&xd, len))?;
    let mut want = x.clone();
    kasoku::kernels::activation::sigmoid_gate(&mut want, &g);
    let got = xd.read_f32(len)?;
    let e = rel_err(&got, &f64s(&want));
    let q_ok = qb.equal_ref(&got)?;
    rep.check(
        e < 1e-6 && q_ok,
        format!("sigmoid_gate {len}: rel err vs CPU {e:.1e} (bound 1e-6); its int8 blocks equal the reference's: {q_ok}"),
    );
    Ok(rep)
}
