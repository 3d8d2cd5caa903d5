//! Qwen3.5's Gated DeltaNet layers on the GPU: their weights, the per-sequence states and
//! pass buffers, one layer of a pass, and the commit of a verified path.
//!
//! ```text
//! mixed = h·W_qkvᵀ  z = h·W_gateᵀ  b = h·W_betaᵀ  a = h·W_alphaᵀ      (matvec)
//! q,k,v = silu(conv(mixed)); q,k l2-normed, q /= sqrt(dk); g, β     (gdn_conv)
//! o = gated delta rule(q, k, v, g, β)                               (gdn_recurrence; a chain
//!                                                                    also advances the conv
//!                                                                    state past its rows)
//! o = rmsnorm(o per value head) · silu(z)                           (gdn_out)
//! x += o·W_outᵀ                                                     (matvec)
//! ```
//! A pass of up to [`MAX_TREE`] rows keeps each layer's rows (inputs of the conv, prepared
//! q|k|v, gates, deltas) in that layer's own buffers, so after a verification
//! [`CudaState::commit`] replays the accepted path's updates from them (the CPU's "replay
//! commit": nothing is rolled back, the path is applied as decoding would have applied it).
//! Longer passes (prefill chains, never committed as trees) share one set of buffers.

use std::sync::Arc;

use kasoku::format::gguf::GgufFile;
use kasoku::model::{ModelConfig, SourceKind};

use super::{matrix, vector_f32, CudaState, NormTail, MAX_TREE};
use crate::kernels::{Acts, DeviceMatrix, GdnCommit, GdnConv, GdnRecurrence, GdnShape};
use crate::runtime::{DeviceBuffer, Error, Gpu, Result};

/// The geometry of a model's Gated DeltaNet layers.
pub fn shape_of(c: &ModelConfig) -> GdnShape {
    GdnShape {
        nk: c.linear_num_key_heads as i32,
        nv: c.linear_num_value_heads as i32,
        dk: c.linear_key_head_dim as i32,
        dv: c.linear_value_head_dim as i32,
        kernel: c.linear_conv_kernel_dim as i32,
        grouped: (c.source == SourceKind::Hf) as i32,
    }
}

/// One Gated DeltaNet layer's weights on the device.
pub(super) struct DeltaNetLayer {
    /// `attn_qkv`: `conv_dim × hidden`, rows `[q | k | v]`.
    qkv: DeviceMatrix,
    /// `attn_gate` (z): `nv·dv × hidden`.
    gate: DeviceMatrix,
    /// `ssm_beta` and `ssm_alpha` (`nv × hidden` each).
    beta_alpha: BetaAlpha,
    /// Conv taps, channel-major `conv_dim × K`.
    taps: DeviceBuffer,
    /// `−exp(A_log)` per value head.
    ssm_a: DeviceBuffer,
    dt_bias: DeviceBuffer,
    /// The gated RMSNorm's weight (dv values, plain).
    norm: DeviceBuffer,
    /// `ssm_out`: `hidden × nv·dv`.
    pub(super) out: DeviceMatrix,
}

impl DeltaNetLayer {
    /// Loads layer `i`'s `attn_qkv`, `attn_gate`, `ssm_*` tensors.
    pub(super) fn load(
        gpu: &Arc<Gpu>,
        file: &GgufFile,
        c: &ModelConfig,
        i: usize,
    ) -> Result<DeltaNetLayer> {
        let s = shape_of(c);
        let (h, cd, vd, nv) = (c.hidden, s.conv_dim(), s.value_dim(), s.nv as usize);
        let n = |p: &str| format!("blk.{i}.{p}");
        let kernel = s.kernel as usize;
        let taps = vector_f32(file, &n("ssm_conv1d.weight"), cd * kernel)?;
        let mut ssm_a = vector_f32(file, &n("ssm_a"), nv)?;
        if c.source == SourceKind::Hf {
            // Hugging Face stores A_log; the recurrence takes the rate −exp(A_log).
            ssm_a.iter_mut().for_each(|a| *a = -a.exp());
        }
        Ok(DeltaNetLayer {
            qkv: matrix(gpu, file, &n("attn_qkv.weight"), cd, h)?,
            gate: matrix(gpu, file, &n("attn_gate.weight"), vd, h)?,
            beta_alpha: BetaAlpha::load(gpu, file, i, nv, h)?,
            taps: gpu.upload_f32(&taps)?,
            ssm_a: gpu.upload_f32(&ssm_a)?,
            dt_bias: gpu.upload_f32(&vector_f32(file, &n("ssm_dt.bias"), nv)?)?,
            norm: gpu.upload_f32(&vector_f32(file, &n("ssm_norm.weight"), s.dv as usize)?)?,
            out: matrix(gpu, file, &n("ssm_out.weight"), h, vd)?,
        })
    }

    /// The matrices a decode step reads, in order.
    pub(super) fn matrices(&self) -> Vec<&DeviceMatrix> {
        let mut v = vec![&self.qkv, &self.gate];
        v.extend(self.beta_alpha.matrices());
        v.push(&self.out);
        v
    }

    /// The matrices of the layer's first product (what the product before it prefetches).
    pub(super) fn first_matrices(&self) -> Vec<&DeviceMatrix> {
        let mut v = vec![&self.qkv, &self.gate];
        v.extend(self.beta_alpha.matrices().into_iter().take(1));
        v
    }
}

/// The β and α projections: one matrix of `2·nv` rows where their formats agree (one product
/// with q|k|v and z), else two.
enum BetaAlpha {
    Stacked(DeviceMatrix),
    Separate(DeviceMatrix, DeviceMatrix),
}

impl BetaAlpha {
    fn load(gpu: &Arc<Gpu>, file: &GgufFile, i: usize, nv: usize, h: usize) -> Result<BetaAlpha> {
        let (b, a) = (
            format!("blk.{i}.ssm_beta.weight"),
            format!("blk.{i}.ssm_alpha.weight"),
        );
        let (tb, ta) = (super::tensor(file, &b)?, super::tensor(file, &a)?);
        if tb.dtype == ta.dtype && tb.shape == [nv, h] && ta.shape == [nv, h] {
            let bytes = [tb.data.as_slice(), ta.data.as_slice()].concat();
            let m = DeviceMatrix::upload(gpu, tb.dtype, 2 * nv, h, &bytes)
                .map_err(|e| Error::Invalid(format!("{b} and {a}: {e}")))?;
            return Ok(BetaAlpha::Stacked(m));
        }
        Ok(BetaAlpha::Separate(
            matrix(gpu, file, &b, nv, h)?,
            matrix(gpu, file, &a, nv, h)?,
        ))
    }

    fn matrices(&self) -> Vec<&DeviceMatrix> {
        match self {
            BetaAlpha::Stacked(m) => vec![m],
            BetaAlpha::Separate(b, a) => vec![b, a],
        }
    }
}

/// Where one layer's pass keeps its rows.
#[derive(Clone, Copy, Debug)]
struct Rows {
    mixed: u64,
    qkv: u64,
    gates: u64,
    deltas: u64,
}

/// One sequence's Gated DeltaNet states and pass buffers (every GDN layer's).
pub(super) struct DeltaNetState {
    shape: GdnShape,
    layers: usize,
    /// Recurrent states, `layers × nv × dv × dk` f32 (zero for a fresh sequence).
    state: DeviceBuffer,
    /// Conv states, `layers × (K−1) × conv_dim` f32.
    conv: DeviceBuffer,
    /// Per layer, the rows of the last pass of at most [`MAX_TREE`] rows: conv inputs
    /// (`conv_dim`), prepared q|k|v (`conv_dim`), gates (`2·nv`), deltas (`nv·dv`) each.
    tree_mixed: DeviceBuffer,
    tree_qkv: DeviceBuffer,
    tree_gates: DeviceBuffer,
    tree_deltas: DeviceBuffer,
    /// The same for longer passes, shared by the layers.
    long_mixed: DeviceBuffer,
    long_qkv: DeviceBuffer,
    long_gates: DeviceBuffer,
    long_deltas: DeviceBuffer,
    /// The z projection, β|α projections and the recurrence's output of a pass.
    z: DeviceBuffer,
    ba: DeviceBuffer,
    o: DeviceBuffer,
}

impl DeltaNetState {
    /// Buffers for `layers` GDN layers of `shape` and passes of up to `rows` rows.
    pub(super) fn new(
        gpu: &Arc<Gpu>,
        shape: GdnShape,
        layers: usize,
        rows: usize,
    ) -> Result<DeltaNetState> {
        let f = |n: usize| gpu.alloc(n.max(1) * 4);
        let (cd, vd, nv) = (shape.conv_dim(), shape.value_dim(), shape.nv as usize);
        let long = rows.max(MAX_TREE);
        let st = DeltaNetState {
            shape,
            layers,
            state: f(layers * shape.state_len())?,
            conv: f(layers * shape.conv_state_len())?,
            tree_mixed: f(layers * MAX_TREE * cd)?,
            tree_qkv: f(layers * MAX_TREE * cd)?,
            tree_gates: f(layers * MAX_TREE * 2 * nv)?,
            tree_deltas: f(layers * MAX_TREE * vd)?,
            long_mixed: f(long * cd)?,
            long_qkv: f(long * cd)?,
            long_gates: f(long * 2 * nv)?,
            long_deltas: f(long * vd)?,
            z: f(long * vd)?,
            ba: f(long * 2 * nv)?,
            o: f(long * vd)?,
        };
        st.zero()?;
        Ok(st)
    }

    /// Queues the zeroing of every layer's recurrent and conv state (a fresh sequence).
    pub(super) fn zero(&self) -> Result<()> {
        self.state.fill(0)?;
        self.conv.fill(0)
    }

    /// Layer `gi`'s rows for a pass of `n` rows.
    fn rows(&self, gi: usize, n: usize) -> Rows {
        let (cd, vd, nv) = (
            self.shape.conv_dim(),
            self.shape.value_dim(),
            self.shape.nv as usize,
        );
        if n > MAX_TREE {
            return Rows {
                mixed: self.long_mixed.ptr(),
                qkv: self.long_qkv.ptr(),
                gates: self.long_gates.ptr(),
                deltas: self.long_deltas.ptr(),
            };
        }
        Rows {
            mixed: self.tree_mixed.at(gi * MAX_TREE * cd * 4),
            qkv: self.tree_qkv.at(gi * MAX_TREE * cd * 4),
            gates: self.tree_gates.at(gi * MAX_TREE * 2 * nv * 4),
            deltas: self.tree_deltas.at(gi * MAX_TREE * vd * 4),
        }
    }

    /// The parameters of the commit of a `len`-node path at `path` (device i32s).
    fn commit_args(&self, path: u64, len: usize) -> GdnCommit {
        let s = self.shape;
        let (cd, vd, nv) = (s.conv_dim(), s.value_dim(), s.nv as usize);
        GdnCommit {
            shape: s,
            layers: self.layers,
            state: self.state.ptr(),
            state_stride: s.state_len(),
            conv_state: self.conv.ptr(),
            conv_stride: s.conv_state_len(),
            mixed: self.tree_mixed.ptr(),
            mixed_stride: MAX_TREE * cd,
            qkv: self.tree_qkv.ptr(),
            qkv_stride: MAX_TREE * cd,
            gates: self.tree_gates.ptr(),
            gates_stride: MAX_TREE * 2 * nv,
            deltas: self.tree_deltas.ptr(),
            deltas_stride: MAX_TREE * vd,
            path,
            len,
        }
    }

    /// Layer `gi`'s recurrent state (`nv × dv × dk`) and conv state (`(K−1) × conv_dim`),
    /// copied to the host (for checks).
    pub fn read_layer(&self, gi: usize) -> Result<(Vec<f32>, Vec<f32>)> {
        let (sl, cl) = (self.shape.state_len(), self.shape.conv_state_len());
        let all = self.state.read_f32((gi + 1) * sl)?;
        let conv = self.conv.read_f32((gi + 1) * cl)?;
        Ok((all[gi * sl..].to_vec(), conv[gi * cl..].to_vec()))
    }
}

impl CudaState {
    /// Queues Gated DeltaNet layer `gi` (its weights `d`) over the pass's `n` rows of
    /// `normed`, adding its output to the residual stream; then, when `norm` is given, the
    /// next RMSNorm inside the output product (its bits either way). Returns whether that
    /// norm ran.
    pub(super) fn record_delta_net(
        &self,
        m: &super::CudaModel,
        d: &DeltaNetLayer,
        gi: usize,
        normed: Acts,
        n: usize,
        norm: Option<NormTail>,
    ) -> Result<bool> {
        let g = self
            .delta
            .as_ref()
            .ok_or_else(|| Error::Invalid("a Gated DeltaNet layer without its state".into()))?;
        let (k, c, s) = (&m.kernels, &m.config, g.shape);
        let (h, cd, vd, nv) = (c.hidden, s.conv_dim(), s.value_dim(), s.nv as usize);
        let rows = g.rows(gi, n);
        let word = |w: usize| self.meta.at(w * 4);
        let skip = |what: u32| self.skip & what != 0;
        let layer_state = g.state.at(gi * s.state_len() * 4);
        let conv_state = g.conv.at(gi * s.conv_state_len() * 4);
        if !skip(super::Skip::PRODUCTS) {
            // Per row b then a: `2·nv` values.
            let (beta, alpha) = match &d.beta_alpha {
                BetaAlpha::Stacked(ba) => (ba.seg(g.ba.ptr(), 2 * nv, None, false), None),
                BetaAlpha::Separate(b, a) => (
                    b.seg(g.ba.ptr(), 2 * nv, None, false),
                    Some(a.seg(g.ba.at(nv * 4), 2 * nv, None, false)),
                ),
            };
            let qkv = d.qkv.seg(rows.mixed, cd, None, false);
            let z = d.gate.seg(g.z.ptr(), vd, None, false);
            self.product(m, &[qkv, z, beta], normed, n, h, &[])?;
            if let Some(alpha) = alpha {
                self.product(m, &[alpha], normed, n, h, &[])?;
            }
        }
        if !skip(super::Skip::ATTENTION) {
            k.gdn_conv(&GdnConv {
                shape: s,
                n,
                mixed: rows.mixed,
                taps: d.taps.ptr(),
                conv_state,
                ba: g.ba.ptr(),
                ssm_a: d.ssm_a.ptr(),
                dt_bias: d.dt_bias.ptr(),
                q_scale: 1.0 / (s.dk as f32).sqrt(),
                batch: self.meta.ptr(),
                pos: word(self.layout.pos),
                path: word(self.layout.path),
                qkv: rows.qkv,
                gates: rows.gates,
            })?;
            k.gdn_recurrence(&GdnRecurrence {
                shape: s,
                qkv: rows.qkv,
                gates: rows.gates,
                state: layer_state,
                batch: self.meta.ptr(),
                pos: word(self.layout.pos),
                path: word(self.layout.path),
                out: g.o.ptr(),
                deltas: rows.deltas,
                mixed: rows.mixed,
                conv_state,
            })?;
        }
        let o = Acts {
            x: g.o.ptr(),
            xq: self.xq.ptr(),
            xs: self.xs.ptr(),
            ld: vd,
        };
        if !skip(super::Skip::ELEMENTWISE) {
            k.gdn_out(s, g.o.ptr(), g.z.ptr(), d.norm.ptr(), c.rms_eps, n, o)?;
        }
        let out = d.out.seg(self.x.ptr(), h, None, true);
        match norm {
            Some(tail) => {
                k.matvec_norm(out, o, n, vd, tail)?;
                Ok(true)
            }
            None => {
                if !skip(super::Skip::PRODUCTS) {
                    self.product(m, &[out], o, n, vd, &[])?;
                }
                Ok(false)
            }
        }
    }

    /// Gated DeltaNet layer `gi`'s kernels for a one-row chain over `normed` (the batch
    /// description already in place), each as (what, weight bytes it reads, a launch), for
    /// timing them apart (`CudaModel::profile_step`). They overwrite the layer's state.
    #[allow(clippy::type_complexity)]
    pub(super) fn delta_net_steps<'a>(
        &'a self,
        m: &'a super::CudaModel,
        d: &'a DeltaNetLayer,
        gi: usize,
        normed: Acts,
    ) -> Result<Vec<(&'static str, usize, Box<dyn Fn() -> Result<()> + 'a>)>> {
        let g = self
            .delta
            .as_ref()
            .ok_or_else(|| Error::Invalid("a Gated DeltaNet layer without its state".into()))?;
        let (k, c, s) = (&m.kernels, &m.config, g.shape);
        let (h, cd, vd, nv) = (c.hidden, s.conv_dim(), s.value_dim(), s.nv as usize);
        let rows = g.rows(gi, 1);
        let word = move |w: usize| self.meta.at(w * 4);
        let layer_state = g.state.at(gi * s.state_len() * 4);
        let conv_state = g.conv.at(gi * s.conv_state_len() * 4);
        let mut segs = vec![
            d.qkv.seg(rows.mixed, cd, None, false),
            d.gate.seg(g.z.ptr(), vd, None, false),
        ];
        let mut in_bytes = d.qkv.buf.len() + d.gate.buf.len();
        if let BetaAlpha::Stacked(ba) = &d.beta_alpha {
            segs.push(ba.seg(g.ba.ptr(), 2 * nv, None, false));
            in_bytes += ba.buf.len();
        }
        let o = Acts {
            x: g.o.ptr(),
            xq: self.xq.ptr(),
            xs: self.xs.ptr(),
            ld: vd,
        };
        let conv = GdnConv {
            shape: s,
            n: 1,
            mixed: rows.mixed,
            taps: d.taps.ptr(),
            conv_state,
            ba: g.ba.ptr(),
            ssm_a: d.ssm_a.ptr(),
            dt_bias: d.dt_bias.ptr(),
            q_scale: 1.0 / (s.dk as f32).sqrt(),
            batch: self.meta.ptr(),
            pos: word(self.layout.pos),
            path: word(self.layout.path),
            qkv: rows.qkv,
            gates: rows.gates,
        };
        let rec = GdnRecurrence {
            shape: s,
            qkv: rows.qkv,
            gates: rows.gates,
            state: layer_state,
            batch: self.meta.ptr(),
            pos: word(self.layout.pos),
            path: word(self.layout.path),
            out: g.o.ptr(),
            deltas: rows.deltas,
            mixed: rows.mixed,
            conv_state,
        };
        let out = d.out.seg(self.x.ptr(), h, None, true);
        let (state_bytes, out_bytes) = (s.state_len() * 4, d.out.buf.len());
        let (norm, z, eps) = (d.norm.ptr(), g.z.ptr(), c.rms_eps);
        Ok(vec![
            (
                "gdn matvec q|k|v|z|b|a",
                in_bytes,
                Box::new(move || k.matvec(&segs, normed, 1, h)),
            ),
            (
                "gdn conv + q/k norms + gates",
                0,
                Box::new(move || k.gdn_conv(&conv)),
            ),
            (
                "gdn recurrence (state read and written)",
                2 * state_bytes,
                Box::new(move || k.gdn_recurrence(&rec)),
            ),
            (
                "gdn gated norm (+int8)",
                0,
                Box::new(move || k.gdn_out(s, o.x, z, norm, eps, 1, o)),
            ),
            (
                "gdn matvec out (+residual)",
                out_bytes,
                Box::new(move || k.matvec(&[out], o, 1, vd)),
            ),
        ])
    }

    /// Queues the commit of the accepted `len`-node path (device i32s at `path`) into every
    /// Gated DeltaNet layer's states.
    pub(super) fn commit_delta_net(
        &self,
        m: &super::CudaModel,
        path: u64,
        len: usize,
    ) -> Result<()> {
        match &self.delta {
            Some(g) => m.kernels.gdn_commit(&g.commit_args(path, len)),
            None => Ok(()),
        }
    }
}
