//! Gated DeltaNet mixer: the linear-attention layers of Qwen3.5 (qwen35.md §5).
//!
//! ```text
//! mixed = x·W_qkvᵀ  z = x·W_gateᵀ  b = x·W_betaᵀ  a = x·W_alphaᵀ      projections
//! mixed = silu(causal_depthwise_conv(mixed))                       q,k,v channels only
//! q, k, v = split(mixed, [nk·dk, nk·dk, nv·dv])                     then l2-norm q, k; q /= sqrt(dk)
//! g = ssm_a · softplus(a + dt_bias);  β = sigmoid(b)
//! o = gated_delta(q, k, v, g, β)                                   value head h reads key head map(h)
//! o = rmsnorm(o per value head, ssm_norm) · silu(z)                plain weight, no (1 + w)
//! y = o·W_outᵀ
//! ```
//! Sources differ in two ways, both settled at load: GGUF stores `ssm_a = −exp(A_log)` and
//! re-orders value heads so that head `h` reads key head `h % nk` (HF: raw `A_log`, key head
//! `h / (nv/nk)`).
//!
//! Per-sequence state ([`GdnState`]): the last `K−1` conv inputs (time-major rows, oldest
//! first) and the recurrent state (`nv × dk × dv`, f32). A draft tree is verified without
//! writing either ([`GatedDeltaNet::run`] of a tree); the accepted path is then committed by
//! taking the conv rows of the path and replaying `S ← e^{g}·S + k ⊗ δ` per accepted node
//! ([`GatedDeltaNet::commit`], see `kernels::gated_delta::tree`).

use crate::backend::{
    Activation, Backend, Buf, BufVec, Conv, CopyRows, Cpu, DeltaInputs, DeltaNet, MatMul,
    NormInPlace, WeightInfo,
};
use crate::format::Claims;
use crate::kernels::conv1d::ConvTaps;
use crate::kernels::gated_delta::{GdnDims, HeadMap};

use super::super::batch::Pass;
use super::super::config::SourceKind;
use super::super::scratch::{carve, rows};
use super::super::trace::{Op, Trace};
use super::super::{weights, ModelConfig, ModelError};

/// Weights of one Gated DeltaNet layer. Immutable; shared by every sequence.
pub struct GatedDeltaNet<B: Backend = Cpu> {
    dims: GdnDims,
    hidden: usize,
    eps: f32,
    /// `attn_qkv`: `[2·nk·dk + nv·dv, hidden]`, rows `[q | k | v]`.
    qkv: B::Weight,
    /// `attn_gate` (z): `[nv·dv, hidden]`.
    gate: B::Weight,
    /// `ssm_beta` (b): `[nv, hidden]`.
    beta: B::Weight,
    /// `ssm_alpha` (a): `[nv, hidden]`.
    alpha: B::Weight,
    conv: ConvTaps,
    /// `−exp(A_log)` per value head.
    ssm_a: B::Vec,
    dt_bias: B::Vec,
    /// Gated RMSNorm weight over `dv` (plain, shared by all value heads).
    norm: B::Vec,
    /// `ssm_out`: `[hidden, nv·dv]`.
    out: B::Weight,
}

/// Per-sequence state of one Gated DeltaNet layer, in the backend's memory.
#[derive(Debug)]
pub struct GdnState<B: Backend = Cpu> {
    /// The last `K−1` inputs of the conv (pre-activation q,k,v channels): `(K−1) × conv_dim`,
    /// oldest row first; zeros for a fresh sequence.
    pub(crate) conv: B::Vec,
    /// Recurrent state: `nv × dk × dv` (key dimension first), f32.
    pub(crate) ssm: B::Vec,
    /// What the last tree pass left for its commit (its buffers kept from tree to tree).
    pending: GdnPending<B>,
}

/// A copy of the committed state; the pending tree's data comes along only while one is
/// pending.
impl<B: Backend> Clone for GdnState<B> {
    fn clone(&self) -> GdnState<B> {
        GdnState {
            conv: self.conv.clone(),
            ssm: self.ssm.clone(),
            pending: if self.pending.active {
                self.pending.clone()
            } else {
                GdnPending::default()
            },
        }
    }
}

impl<B: Backend> GdnState<B> {
    /// Forgets the pending tree's commit data.
    pub(crate) fn discard_pending(&mut self) {
        self.pending.active = false;
    }

    /// Bytes of the recurrent and conv states.
    pub(crate) fn bytes(&self) -> usize {
        (self.conv.len() + self.ssm.len()) * 4
    }

    /// Whether `other` is a state of a layer of the same shape.
    pub(crate) fn same_shape(&self, other: &GdnState<B>) -> bool {
        self.conv.len() == other.conv.len() && self.ssm.len() == other.ssm.len()
    }
}

impl<B: Backend> GatedDeltaNet<B> {
    /// Claims layer `layer`'s tensors (GGUF names; the format layer maps HF names), packed
    /// by `b`.
    pub fn load(
        b: &B,
        claims: &Claims,
        layer: usize,
        cfg: &ModelConfig,
    ) -> Result<Self, ModelError> {
        let (nk, nv) = (cfg.linear_num_key_heads, cfg.linear_num_value_heads);
        let (dk, dv) = (cfg.linear_key_head_dim, cfg.linear_value_head_dim);
        let kernel = cfg.linear_conv_kernel_dim;
        if nk == 0 || dk == 0 || dv == 0 || kernel == 0 || nv == 0 || !nv.is_multiple_of(nk) {
            return Err(ModelError::Unsupported(format!(
                "layer {layer}: Gated DeltaNet dims nk={nk} nv={nv} dk={dk} dv={dv} conv={kernel}"
            )));
        }
        let h = cfg.hidden;
        let conv_dim = 2 * nk * dk + nv * dv;
        let name = |s: &str| format!("blk.{layer}.{s}");

        let qkv = weights::matrix(b, claims, &name("attn_qkv.weight"), conv_dim, h)?;
        let gate = weights::matrix(b, claims, &name("attn_gate.weight"), nv * dv, h)?;
        let beta = weights::matrix(b, claims, &name("ssm_beta.weight"), nv, h)?;
        let alpha = weights::matrix(b, claims, &name("ssm_alpha.weight"), nv, h)?;
        let out = weights::matrix(b, claims, &name("ssm_out.weight"), h, nv * dv)?;

        let conv_name = name("ssm_conv1d.weight");
        let t = claims.take(&conv_name, &[conv_dim, kernel])?;
        let taps = weights::to_f32(&conv_name, t.dtype, t.data.as_slice(), conv_dim * kernel)?;
        let conv = ConvTaps::from_channel_major(&taps, conv_dim, kernel);

        let dt_bias = weights::vector(claims, &name("ssm_dt.bias"), nv)?;
        let mut ssm_a = weights::vector(claims, &name("ssm_a"), nv)?;
        let map = match cfg.source {
            SourceKind::Gguf => HeadMap::Tiled,
            SourceKind::Hf => {
                // HF stores A_log; the recurrence wants the (negative) rate −exp(A_log).
                ssm_a.iter_mut().for_each(|a| *a = -a.exp());
                HeadMap::Grouped
            }
        };
        let norm = weights::vector(claims, &name("ssm_norm.weight"), dv)?;

        Ok(GatedDeltaNet {
            dims: GdnDims {
                nk,
                nv,
                dk,
                dv,
                map,
            },
            hidden: h,
            eps: cfg.rms_eps,
            qkv,
            gate,
            beta,
            alpha,
            conv,
            ssm_a: b.upload(&ssm_a),
            dt_bias: b.upload(&dt_bias),
            norm: b.upload(&norm),
            out,
        })
    }

    /// The packed matrices by part name, in forward order.
    pub(crate) fn matrices(&self) -> Vec<(&'static str, &B::Weight)> {
        vec![
            ("attn_qkv", &self.qkv),
            ("attn_gate", &self.gate),
            ("ssm_beta", &self.beta),
            ("ssm_alpha", &self.alpha),
            ("ssm_out", &self.out),
        ]
    }

    /// Channels of the conv: `2·nk·dk + nv·dv`.
    pub fn conv_dim(&self) -> usize {
        self.conv.channels()
    }

    /// A fresh state (zeros) for one sequence.
    pub fn new_state(&self) -> GdnState<B> {
        GdnState {
            conv: B::Vec::zeros(self.conv.state_len()),
            ssm: B::Vec::zeros(self.dims.state_len()),
            pending: GdnPending::default(),
        }
    }

    /// Mixes the pass's rows (`x`: one normed row each) into `out`, intermediates carved
    /// from `work`: a chain advances `state` past them; tree nodes (a whole tree: this layer
    /// cannot grow one) are computed from the committed state along their own paths, with
    /// the bits plain decoding of each path gives, and what [`GatedDeltaNet::commit`] needs
    /// to advance along an accepted path waits in `state`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn run<T: Trace>(
        &self,
        bk: &B,
        state: &mut GdnState<B>,
        x: &B::Buffer,
        pass: &Pass,
        out: &mut B::Buffer,
        work: &mut B::Vec,
        layer: usize,
        tr: &mut T,
    ) {
        let n = pass.n;
        self.check(state, x, n, out);
        if n == 0 {
            return;
        }
        let tree = pass.tree.map(|t| {
            assert_eq!(
                t.first, 0,
                "gated delta net: a tree grows only in attention"
            );
            t.parents
        });
        let GdnDims { nk, nv, dk, dv, .. } = self.dims;
        let (kd, vd, cd) = (nk * dk, nv * dv, self.conv_dim());
        let op = |name| Op::new(name, Some(layer), n);
        let GdnState { conv, ssm, pending } = state;
        // A chain's projections, keys and decays are intermediates; a tree's are its commit
        // data, kept in the state.
        let own = |len: usize| if tree.is_some() { 0 } else { len };
        let [z, b, a, conv_out, q, v, beta, o, mixed, k, g, none] = carve(
            work,
            [
                n * vd,
                n * nv,
                n * nv,
                n * cd,
                n * kd,
                n * vd,
                n * nv,
                n * vd,
                own(n * cd),
                own(n * kd),
                own(n * nv),
                0,
            ],
        );
        let (mixed, k, g, deltas) = match tree {
            None => (mixed, k, g, none),
            Some(parents) => {
                pending.active = true;
                pending.parents.clear();
                pending.parents.extend_from_slice(parents);
                (
                    rows(&mut pending.mixed, n * cd),
                    rows(&mut pending.k, n * kd),
                    rows(&mut pending.g, n * nv),
                    rows(&mut pending.deltas, n * vd),
                )
            }
        };

        // The four input projections.
        let proj = |name, w: &B::Weight| {
            Op::new(name, Some(layer), n)
                .matmul(w.format())
                .reading(w.size_bytes())
        };
        let mm = |w, y| bk.matmul(MatMul { w, x, n, y });
        tr.op(proj("ssm_qkv", &self.qkv), || mm(&self.qkv, mixed));
        tr.op(proj("ssm_z", &self.gate), || mm(&self.gate, z));
        tr.op(proj("ssm_beta", &self.beta), || mm(&self.beta, b));
        tr.op(proj("ssm_alpha", &self.alpha), || mm(&self.alpha, a));
        // Short causal conv + SiLU over [q | k | v].
        let taps = &self.conv;
        tr.op(op("conv1d"), || {
            bk.conv1d(match tree {
                None => Conv::Chain {
                    taps,
                    state: conv.all_mut(),
                    x: mixed,
                    n,
                    y: conv_out,
                },
                Some(parents) => Conv::Tree {
                    taps,
                    state: conv.all(),
                    x: mixed,
                    parents,
                    y: conv_out,
                },
            })
        });
        // Contiguous q, k, v (q and k l2-normalised per head, q scaled) and the gates.
        tr.op(op("ssm_inputs"), || {
            let parts = [(&mut *q, 0, kd), (&mut *k, kd, kd), (&mut *v, 2 * kd, vd)];
            for (dst, at, width) in parts {
                bk.copy(CopyRows {
                    src: &*conv_out,
                    src_at: at,
                    src_stride: cd,
                    dst,
                    dst_at: 0,
                    dst_stride: width,
                    rows: n,
                    width,
                });
            }
            let scale = 1.0 / (dk as f32).sqrt();
            bk.activation(Activation::L2Norm {
                x: q,
                dim: dk,
                scale,
            });
            bk.activation(Activation::L2Norm {
                x: k,
                dim: dk,
                scale: 1.0,
            });
            bk.gated_delta(DeltaNet::Gates {
                a,
                b,
                ssm_a: self.ssm_a.all(),
                dt_bias: self.dt_bias.all(),
                g,
                beta,
            });
        });
        let dims = self.dims;
        let state_bytes = ssm.bytes();
        tr.op(op("gated_delta").reading(state_bytes), || {
            let inputs = DeltaInputs { q, k, v, g, beta };
            bk.gated_delta(match tree {
                None => DeltaNet::Chain {
                    dims,
                    inputs,
                    n,
                    state: ssm.all_mut(),
                    out: o,
                },
                Some(parents) => DeltaNet::Tree {
                    dims,
                    inputs,
                    parents,
                    state: ssm.all(),
                    out: o,
                    deltas,
                },
            })
        });
        // Gated RMSNorm per value head, then the output projection.
        tr.op(op("ssm_norm_gate"), || {
            bk.rmsnorm_inplace(NormInPlace {
                x: o,
                weight: self.norm.all(),
                eps: self.eps,
            });
            bk.activation(Activation::SiluGate { x: o, gate: z });
        });
        let op_out = op("ssm_out")
            .matmul(self.out.format())
            .reading(self.out.size_bytes());
        tr.op(op_out, || {
            bk.matmul(MatMul {
                w: &self.out,
                x: o,
                n,
                y: out,
            })
        });
    }

    /// Mixes `n` tokens: `x` is `n × hidden` (already normed), `out` receives `n × hidden`;
    /// `state` advances past the tokens. (A convenience of tests: it allocates its
    /// intermediates.)
    #[cfg(test)]
    pub fn forward(&self, state: &mut GdnState<B>, x: &B::Buffer, n: usize, out: &mut B::Buffer)
    where
        B: Default,
    {
        let positions: Vec<usize> = (0..n).collect();
        let pass = Pass {
            n,
            past: 0,
            positions: &positions,
            tree: None,
        };
        self.run(
            &B::default(),
            state,
            x,
            &pass,
            out,
            &mut B::Vec::default(),
            0,
            &mut super::super::NoTrace,
        )
    }

    /// Advances `state` along `path` (node indices of its pending tree, root first, each a
    /// child of the one before): the recurrent state replays each node's update, the conv
    /// state becomes the path's last inputs. The pending tree is consumed.
    pub(crate) fn commit(&self, b: &B, state: &mut GdnState<B>, path: &[usize]) {
        assert!(state.pending.active, "gated delta net: no pending tree");
        state.pending.active = false;
        let pending = &state.pending;
        let GdnDims { nk, nv, dk, dv, .. } = self.dims;
        let (kd, vd) = (nk * dk, nv * dv);
        for &i in path {
            b.gated_delta(DeltaNet::Replay {
                dims: self.dims,
                state: state.ssm.all_mut(),
                k: pending.k.all().at(i * kd..(i + 1) * kd),
                g: pending.g.all().at(i * nv..(i + 1) * nv),
                delta: pending.deltas.all().at(i * vd..(i + 1) * vd),
            });
        }
        if let Some(&last) = path.last() {
            b.conv1d(Conv::Commit {
                taps: &self.conv,
                state: state.conv.all_mut(),
                x: pending.mixed.all(),
                parents: &pending.parents,
                node: last,
            });
        }
    }

    fn check(&self, state: &GdnState<B>, x: &B::Buffer, n: usize, out: &B::Buffer) {
        assert_eq!(x.len(), n * self.hidden, "gated delta net: x length");
        assert_eq!(out.len(), n * self.hidden, "gated delta net: out length");
        assert!(
            state.conv.len() == self.conv.state_len() && state.ssm.len() == self.dims.state_len(),
            "gated delta net: state of another layer shape"
        );
    }
}

/// What a tree pass leaves for [`GatedDeltaNet::commit`]: per node, the conv inputs, the
/// normalised key, the log-decays and the deltas of the recurrence.
#[derive(Debug)]
pub(crate) struct GdnPending<B: Backend = Cpu> {
    /// Whether a tree is pending (the buffers hold it).
    active: bool,
    parents: Vec<usize>,
    mixed: B::Vec,
    k: B::Vec,
    g: B::Vec,
    deltas: B::Vec,
}

impl<B: Backend> Default for GdnPending<B> {
    fn default() -> Self {
        GdnPending {
            active: false,
            parents: Vec::new(),
            mixed: B::Vec::default(),
            k: B::Vec::default(),
            g: B::Vec::default(),
            deltas: B::Vec::default(),
        }
    }
}

impl<B: Backend> Clone for GdnPending<B> {
    fn clone(&self) -> Self {
        GdnPending {
            active: self.active,
            parents: self.parents.clone(),
            mixed: self.mixed.clone(),
            k: self.k.clone(),
            g: self.g.clone(),
            deltas: self.deltas.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::config::{Arch, LayerKind};
    use crate::model::testing::{tiny_config, MemSource, Rng};

    /// A config with one GDN layer of the given dims.
    fn config(source: SourceKind, nk: usize, nv: usize, dk: usize, dv: usize) -> ModelConfig {
        let mut cfg = tiny_config(Arch::Qwen35, source);
        cfg.layer_kinds = vec![LayerKind::GatedDeltaNet; cfg.n_layers];
        cfg.linear_num_key_heads = nk;
        cfg.linear_num_value_heads = nv;
        cfg.linear_key_head_dim = dk;
        cfg.linear_value_head_dim = dv;
        cfg.linear_conv_kernel_dim = 4;
        cfg
    }

    /// Random weights for layer 0 under GGUF names. `ssm_a` holds −exp(A_log) for GGUF and
    /// A_log for HF, as the real files do.
    fn random_layer(cfg: &ModelConfig, seed: u64) -> MemSource {
        let mut r = Rng::new(seed);
        let (nk, nv, dk, dv) = (
            cfg.linear_num_key_heads,
            cfg.linear_num_value_heads,
            cfg.linear_key_head_dim,
            cfg.linear_value_head_dim,
        );
        let (h, kern) = (cfg.hidden, cfg.linear_conv_kernel_dim);
        let cd = 2 * nk * dk + nv * dv;
        let mut s = MemSource::new();
        s.add_f32("blk.0.attn_qkv.weight", &[cd, h], &r.vec(cd * h, 0.3));
        s.add_f32(
            "blk.0.attn_gate.weight",
            &[nv * dv, h],
            &r.vec(nv * dv * h, 0.3),
        );
        s.add_f32("blk.0.ssm_beta.weight", &[nv, h], &r.vec(nv * h, 0.3));
        s.add_f32("blk.0.ssm_alpha.weight", &[nv, h], &r.vec(nv * h, 0.3));
        s.add_f32(
            "blk.0.ssm_conv1d.weight",
            &[cd, 1, kern],
            &r.vec(cd * kern, 0.6),
        );
        s.add_f32("blk.0.ssm_dt.bias", &[nv], &r.vec(nv, 1.0));
        let a_log: Vec<f32> = r.vec(nv, 1.0);
        let ssm_a: Vec<f32> = match cfg.source {
            SourceKind::Gguf => a_log.iter().map(|x| -x.exp()).collect(),
            SourceKind::Hf => a_log,
        };
        s.add_f32("blk.0.ssm_a", &[nv], &ssm_a);
        let norm: Vec<f32> = r.vec(dv, 0.5).iter().map(|x| 1.0 + x).collect();
        s.add_f32("blk.0.ssm_norm.weight", &[dv], &norm);
        s.add_f32(
            "blk.0.ssm_out.weight",
            &[h, nv * dv],
            &r.vec(h * nv * dv, 0.3),
        );
        s
    }

    fn load(cfg: &ModelConfig, src: &MemSource) -> GatedDeltaNet {
        let claims = Claims::new(src);
        let m = GatedDeltaNet::load(&Cpu, &claims, 0, cfg).unwrap();
        claims.finish().unwrap();
        m
    }

    /// The whole layer written out directly from qwen35.md §5, in f64, token by token,
    /// reading the weights straight from the source: full-sequence conv with zero padding,
    /// recurrence in the reference's order (decay, read, delta, update, read).
    fn naive_layer(cfg: &ModelConfig, src: &MemSource, x: &[f32], n: usize) -> Vec<f64> {
        let (nk, nv, dk, dv) = (
            cfg.linear_num_key_heads,
            cfg.linear_num_value_heads,
            cfg.linear_key_head_dim,
            cfg.linear_value_head_dim,
        );
        let (h, kern, eps) = (cfg.hidden, cfg.linear_conv_kernel_dim, cfg.rms_eps as f64);
        let cd = 2 * nk * dk + nv * dv;
        let w = |name: &str| src.f32(&format!("blk.0.{name}")).unwrap();
        let (wqkv, wz, wb, wa, wconv, dt, araw, wn, wo) = (
            w("attn_qkv.weight"),
            w("attn_gate.weight"),
            w("ssm_beta.weight"),
            w("ssm_alpha.weight"),
            w("ssm_conv1d.weight"),
            w("ssm_dt.bias"),
            w("ssm_a"),
            w("ssm_norm.weight"),
            w("ssm_out.weight"),
        );
        let rate: Vec<f64> = match cfg.source {
            SourceKind::Gguf => araw.clone(),
            SourceKind::Hf => araw.iter().map(|a| -a.exp()).collect(),
        };
        let lin = |wt: &[f64], rows: usize, xr: &[f64]| -> Vec<f64> {
            (0..rows)
                .map(|j| (0..xr.len()).map(|c| wt[j * xr.len() + c] * xr[c]).sum())
                .collect()
        };
        let xs: Vec<Vec<f64>> = (0..n)
            .map(|t| x[t * h..(t + 1) * h].iter().map(|&v| v as f64).collect())
            .collect();
        let mixed: Vec<Vec<f64>> = xs.iter().map(|xr| lin(&wqkv, cd, xr)).collect();
        let mut state = vec![0f64; nv * dk * dv];
        let mut y = Vec::with_capacity(n * h);
        for (t, xt) in xs.iter().enumerate() {
            let zt = lin(&wz, nv * dv, xt);
            let bt = lin(&wb, nv, xt);
            let at = lin(&wa, nv, xt);
            // Conv over the zero-padded history, then SiLU.
            let c: Vec<f64> = (0..cd)
                .map(|ch| {
                    let mut s = 0.0;
                    for j in 0..kern {
                        let ti = t as isize - (kern as isize - 1) + j as isize;
                        if ti >= 0 {
                            s += wconv[ch * kern + j] * mixed[ti as usize][ch];
                        }
                    }
                    s / (1.0 + (-s).exp())
                })
                .collect();
            let mut o = vec![0f64; nv * dv];
            for hv in 0..nv {
                let kh = match cfg.source {
                    SourceKind::Gguf => hv % nk,
                    SourceKind::Hf => hv / (nv / nk),
                };
                let norm = |v: &[f64]| -> Vec<f64> {
                    let r = (v.iter().map(|x| x * x).sum::<f64>() + 1e-6).sqrt();
                    v.iter().map(|x| x / r).collect()
                };
                let q: Vec<f64> = norm(&c[kh * dk..(kh + 1) * dk])
                    .iter()
                    .map(|x| x / (dk as f64).sqrt())
                    .collect();
                let k = norm(&c[nk * dk + kh * dk..nk * dk + (kh + 1) * dk]);
                let v = &c[2 * nk * dk + hv * dv..2 * nk * dk + (hv + 1) * dv];
                let beta = 1.0 / (1.0 + (-bt[hv]).exp());
                let sp = (at[hv] + dt[hv]).exp().ln_1p();
                let g = rate[hv] * sp;
                let s = &mut state[hv * dk * dv..(hv + 1) * dk * dv];
                s.iter_mut().for_each(|e| *e *= g.exp());
                let mem: Vec<f64> = (0..dv)
                    .map(|j| (0..dk).map(|i| s[i * dv + j] * k[i]).sum())
                    .collect();
                let delta: Vec<f64> = (0..dv).map(|j| (v[j] - mem[j]) * beta).collect();
                for i in 0..dk {
                    for j in 0..dv {
                        s[i * dv + j] += k[i] * delta[j];
                    }
                }
                let oh: Vec<f64> = (0..dv)
                    .map(|j| (0..dk).map(|i| s[i * dv + j] * q[i]).sum())
                    .collect();
                // Gated RMSNorm with the plain weight.
                let ms = oh.iter().map(|x| x * x).sum::<f64>() / dv as f64;
                for j in 0..dv {
                    let zz = zt[hv * dv + j];
                    o[hv * dv + j] = wn[j] * oh[j] / (ms + eps).sqrt() * (zz / (1.0 + (-zz).exp()));
                }
            }
            y.extend(lin(&wo, h, &o));
        }
        y
    }

    fn rel_err(a: &[f32], b: &[f64]) -> f64 {
        let num = a
            .iter()
            .zip(b)
            .map(|(x, y)| (*x as f64 - y).powi(2))
            .sum::<f64>()
            .sqrt();
        let den = b.iter().map(|y| y * y).sum::<f64>().sqrt();
        num / den.max(1e-30)
    }

    fn input(cfg: &ModelConfig, n: usize, seed: u64) -> Vec<f32> {
        Rng::new(seed).vec(n * cfg.hidden, 1.0)
    }

    #[test]
    fn matches_naive_layer() {
        // nv = 2·nk so the head map matters; dv = 8 (AVX2 path) and 12 (portable fallback);
        // n = 40 runs the chunked form, n = 7 the recurrent one.
        for source in [SourceKind::Gguf, SourceKind::Hf] {
            for &(nk, nv, dk, dv) in &[(2, 4, 16, 8), (1, 3, 8, 12)] {
                let cfg = config(source, nk, nv, dk, dv);
                let src = random_layer(&cfg, 11);
                let m = load(&cfg, &src);
                for n in [7, 40] {
                    let x = input(&cfg, n, 5);
                    let want = naive_layer(&cfg, &src, &x, n);
                    let mut st = m.new_state();
                    let mut y = vec![0f32; n * cfg.hidden];
                    m.forward(&mut st, &x, n, &mut y);
                    let e = rel_err(&y, &want);
                    assert!(
                        e < 1e-4,
                        "{source:?} nk={nk} nv={nv} dk={dk} dv={dv} n={n}: rel err {e}"
                    );
                }
            }
        }
    }

    #[test]
    fn wrong_head_map_is_detected() {
        // Loading HF weights as if they were GGUF (tiled map, ssm_a taken as the rate) must
        // not match the reference: the test above can tell the conventions apart.
        let cfg = config(SourceKind::Hf, 2, 4, 16, 8);
        let src = random_layer(&cfg, 11);
        let gguf_cfg = ModelConfig {
            source: SourceKind::Gguf,
            ..cfg.clone()
        };
        let m = load(&gguf_cfg, &src);
        let x = input(&cfg, 6, 5);
        let want = naive_layer(&cfg, &src, &x, 6);
        let mut y = vec![0f32; 6 * cfg.hidden];
        m.forward(&mut m.new_state(), &x, 6, &mut y);
        assert!(rel_err(&y, &want) > 1e-2);
    }

    #[test]
    fn batched_equals_token_by_token() {
        let cfg = config(SourceKind::Gguf, 2, 4, 16, 8);
        let src = random_layer(&cfg, 3);
        let m = load(&cfg, &src);
        let n = 45;
        let h = cfg.hidden;
        let x = input(&cfg, n, 9);
        let mut batched_state = m.new_state();
        let mut batched = vec![0f32; n * h];
        m.forward(&mut batched_state, &x, n, &mut batched);

        let mut st = m.new_state();
        let mut one = vec![0f32; n * h];
        for t in 0..n {
            m.forward(
                &mut st,
                &x[t * h..(t + 1) * h],
                1,
                &mut one[t * h..(t + 1) * h],
            );
        }
        let want: Vec<f64> = batched.iter().map(|&v| v as f64).collect();
        assert!(
            rel_err(&one, &want) < 1e-5,
            "token by token: {}",
            rel_err(&one, &want)
        );
        // Same final state (conv rows exactly; recurrent state to rounding).
        assert_eq!(st.conv, batched_state.conv);
        let sw: Vec<f64> = batched_state.ssm.iter().map(|&v| v as f64).collect();
        assert!(rel_err(&st.ssm, &sw) < 1e-5);

        // Prefill in uneven pieces (3, 20, 1, 21): chunked and recurrent forms interleaved.
        let mut st = m.new_state();
        let mut pieces = vec![0f32; n * h];
        let mut t0 = 0;
        for p in [3, 20, 1, 21] {
            m.forward(
                &mut st,
                &x[t0 * h..(t0 + p) * h],
                p,
                &mut pieces[t0 * h..(t0 + p) * h],
            );
            t0 += p;
        }
        assert!(rel_err(&pieces, &want) < 1e-5);
    }

    #[test]
    fn missing_or_misshapen_tensor_is_an_error() {
        let cfg = config(SourceKind::Gguf, 2, 4, 16, 8);
        let mut src = random_layer(&cfg, 1);
        src.tensors.retain(|t| t.name != "blk.0.ssm_dt.bias");
        assert!(GatedDeltaNet::<Cpu>::load(&Cpu, &Claims::new(&src), 0, &cfg).is_err());
        let mut src = random_layer(&cfg, 1);
        for t in &mut src.tensors {
            if t.name == "blk.0.ssm_norm.weight" {
                t.shape = vec![2, 4];
            }
        }
        let err = GatedDeltaNet::<Cpu>::load(&Cpu, &Claims::new(&src), 0, &cfg)
            .err()
            .expect("wrong shape accepted");
        assert!(err.to_string().contains("ssm_norm"), "{err}");
    }
}
