//! The reference backend: every kernel family written out in f64 from its definition, one
//! row and one head at a time, with nothing fused, blocked or vectorised. Weights are
//! dequantized once when packed; activations are read as given (a backend that quantizes
//! them, as the CPU one does for block formats, differs from it by that rounding). It is the
//! oracle the backends are tested against (`tests.rs`), not a way to run a model.

use super::cpu::{copy_rows, gather_rows};
use super::{
    Activation, Attend, Backend, Conv, CopyRows, DeltaInputs, DeltaNet, Epilogue, Fused, Gather,
    KvCache, KvType, Logits, MatMul, MatMulMany, MatMulPrepared, Norm, NormInPlace, RopeArgs,
    WeightInfo,
};
use crate::kernels::attention::{KvHeads, Stored};
use crate::kernels::conv1d::ConvTaps;
use crate::kernels::gated_delta::GdnDims;
use crate::kernels::matmul::{MatMulError, WeightFormat};
use crate::kernels::rope::RopeLayout;
use crate::quant::kasoku::QuantizedView;
use crate::quant::{dequantize, DType};

impl super::PreparedRows for Vec<f32> {
    fn bytes(&self) -> usize {
        self.capacity() * 4
    }
}

/// The f64 oracle.
#[derive(Clone, Copy, Debug, Default)]
pub struct Reference;

/// A weight matrix as f64 values, row by row.
#[derive(Clone, Debug)]
pub struct RefMatrix {
    /// Output rows.
    pub rows: usize,
    /// Values per row.
    pub cols: usize,
    /// The format it was packed from.
    format: WeightFormat,
    values: Vec<f64>,
}

impl WeightInfo for RefMatrix {
    fn rows(&self) -> usize {
        self.rows
    }
    fn cols(&self) -> usize {
        self.cols
    }
    fn format(&self) -> WeightFormat {
        self.format
    }
    fn size_bytes(&self) -> usize {
        self.values.len() * 8
    }
}

impl Backend for Reference {
    type Buffer = [f32];
    type Vec = Vec<f32>;
    type Weight = RefMatrix;
    type Kv<'a> = KvHeads<'a>;
    /// The epilogue's rows as f32, unchanged: the reference fuses nothing.
    type Prepared = Vec<f32>;
    type KvCache = KvCache;

    fn new_kv_cache(&self, n_kv_heads: usize, head_dim: usize, kv_type: KvType) -> KvCache {
        KvCache::with_type(n_kv_heads, head_dim, kv_type)
    }

    fn pack(
        &self,
        dtype: DType,
        rows: usize,
        cols: usize,
        bytes: &[u8],
    ) -> Result<RefMatrix, MatMulError> {
        let row_bytes = dtype.bytes_for(cols).ok_or(MatMulError::Columns {
            dtype,
            cols,
            block: dtype.block_size(),
        })?;
        if Some(bytes.len()) != rows.checked_mul(row_bytes) {
            return Err(MatMulError::Size {
                dtype,
                rows,
                cols,
                expected: rows.saturating_mul(row_bytes),
                found: bytes.len(),
            });
        }
        let mut row = vec![0f32; cols];
        let mut values = Vec::with_capacity(rows * cols);
        for r in bytes.chunks_exact(row_bytes) {
            dequantize(dtype, r, &mut row);
            values.extend(row.iter().map(|&v| v as f64));
        }
        Ok(RefMatrix {
            rows,
            cols,
            format: WeightFormat::Gguf(dtype),
            values,
        })
    }

    fn upload(&self, values: &[f32]) -> Vec<f32> {
        values.to_vec()
    }

    fn pack_kasoku(&self, q: QuantizedView<'_>) -> RefMatrix {
        // The values in the original basis: the rotation is undone here, and the reference
        // products read the activations as given (unrotated, unquantized).
        RefMatrix {
            rows: q.spec.rows,
            cols: q.spec.cols,
            format: WeightFormat::Kasoku(q.spec.format),
            values: q.dequantize().into_iter().map(f64::from).collect(),
        }
    }

    fn matmul(&self, a: MatMul<'_, Self>) {
        let w = a.w;
        for r in 0..a.n {
            let x = &a.x[r * w.cols..(r + 1) * w.cols];
            for j in 0..w.rows {
                let wr = &w.values[j * w.cols..(j + 1) * w.cols];
                let s: f64 = wr.iter().zip(x).map(|(&w, &x)| w * x as f64).sum();
                a.y[r * w.rows + j] = s as f32;
            }
        }
    }

    fn matmul_many(&self, a: MatMulMany<'_, '_, Self>) {
        for (w, y) in a.ws.iter().zip(a.ys.iter_mut()) {
            self.matmul(MatMul {
                w,
                x: a.x,
                n: a.n,
                y,
            });
        }
    }

    fn can_prepare(&self, ws: &[&RefMatrix]) -> bool {
        ws.first()
            .is_some_and(|w| ws.iter().all(|v| v.cols == w.cols))
    }

    fn fused(&self, a: Fused<'_, '_, '_, Self>) {
        let out = a.out;
        match a.epilogue {
            Epilogue::RmsNorm { x, weight, eps } => {
                out.resize(x.len(), 0.0);
                self.rmsnorm(Norm {
                    x,
                    weight,
                    eps,
                    out,
                });
            }
            Epilogue::SwiGlu { gate, up } => {
                out.clear();
                out.extend_from_slice(gate);
                self.activation(Activation::SwiGlu { gate: out, up });
            }
            Epilogue::Attention {
                geo,
                q,
                keys,
                values,
                past,
                scale,
                tree,
            } => {
                out.resize(q.len(), 0.0);
                self.attention(Attend {
                    geo,
                    q,
                    keys,
                    values,
                    past,
                    scale,
                    tree,
                    out,
                });
            }
        }
        assert_eq!(out.len() % a.w.cols, 0, "fused: rows of another width");
    }

    fn matmul_prepared(&self, a: MatMulPrepared<'_, '_, Self>) {
        self.matmul_many(MatMulMany {
            ws: a.ws,
            x: a.x,
            n: a.n,
            ys: a.ys,
        });
    }

    fn logits(&self, a: Logits<'_, Self>) {
        self.matmul(MatMul {
            w: a.w,
            x: a.x,
            n: a.n,
            y: a.y,
        })
    }

    fn copy(&self, a: CopyRows<'_, [f32], [f32]>) {
        copy_rows(a)
    }

    fn read(&self, a: CopyRows<'_, [f32], [f32]>) {
        copy_rows(a)
    }

    fn write(&self, a: CopyRows<'_, [f32], [f32]>) {
        copy_rows(a)
    }

    /// A row is its stored values dequantized (the definition), as on the CPU.
    fn gather(&self, a: Gather<'_, Self>) {
        gather_rows(a.table, a.dim, a.tokens, a.out)
    }

    fn rmsnorm(&self, a: Norm<'_, Self>) {
        let d = a.weight.len();
        for (x, y) in a.x.chunks_exact(d).zip(a.out.chunks_exact_mut(d)) {
            let ms = x.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / d as f64;
            let inv = 1.0 / (ms + a.eps as f64).sqrt();
            for ((y, &x), &w) in y.iter_mut().zip(x).zip(a.weight) {
                *y = (x as f64 * inv * w as f64) as f32;
            }
        }
    }

    fn rmsnorm_inplace(&self, a: NormInPlace<'_, Self>) {
        let x = a.x.to_vec();
        self.rmsnorm(Norm {
            x: &x,
            weight: a.weight,
            eps: a.eps,
            out: a.x,
        });
    }

    fn rope(&self, a: RopeArgs<'_, Self>) {
        let rope = a.rope;
        let (hd, half) = (rope.head_dim, rope.rot_dim / 2);
        for (row, &p) in a.x.chunks_exact_mut(a.heads * hd).zip(a.positions) {
            for head in row.chunks_exact_mut(hd) {
                for (i, &f) in rope.inv_freq().iter().enumerate().take(half) {
                    // The angle of position p, rounded to f32 as Hugging Face computes it.
                    let (s, c) = ((p as f32 * f as f32) as f64).sin_cos();
                    let (i0, i1) = match rope.layout {
                        RopeLayout::Neox => (i, i + half),
                        RopeLayout::Interleaved => (2 * i, 2 * i + 1),
                    };
                    let (x0, x1) = (head[i0] as f64, head[i1] as f64);
                    head[i0] = (x0 * c - x1 * s) as f32;
                    head[i1] = (x1 * c + x0 * s) as f32;
                }
            }
        }
    }

    fn activation(&self, a: Activation<'_, Self>) {
        let sigmoid = |x: f64| 1.0 / (1.0 + (-x).exp());
        match a {
            Activation::SwiGlu { gate, up } => {
                for (g, &u) in gate.iter_mut().zip(up) {
                    let x = *g as f64;
                    *g = (x * sigmoid(x) * u as f64) as f32;
                }
            }
            Activation::SigmoidGate { x, gate } => {
                for (v, &g) in x.iter_mut().zip(gate) {
                    *v = (*v as f64 * sigmoid(g as f64)) as f32;
                }
            }
            Activation::SiluGate { x, gate } => {
                for (v, &g) in x.iter_mut().zip(gate) {
                    let g = g as f64;
                    *v = (*v as f64 * g * sigmoid(g)) as f32;
                }
            }
            Activation::Add { x, d } => {
                for (v, &d) in x.iter_mut().zip(d) {
                    *v = (*v as f64 + d as f64) as f32;
                }
            }
            Activation::AddBias { x, bias } => {
                for row in x.chunks_exact_mut(bias.len()) {
                    for (v, &b) in row.iter_mut().zip(bias) {
                        *v = (*v as f64 + b as f64) as f32;
                    }
                }
            }
            Activation::L2Norm { x, dim, scale } => {
                for v in x.chunks_exact_mut(dim) {
                    let ss: f64 = v.iter().map(|&x| (x as f64).powi(2)).sum();
                    let f = scale as f64 / (ss + 1e-6).sqrt();
                    v.iter_mut().for_each(|x| *x = (*x as f64 * f) as f32);
                }
            }
        }
    }

    fn attention(&self, a: Attend<'_, '_, Self>) {
        let geo = a.geo;
        let hd = geo.head_dim;
        let group = geo.n_heads / geo.n_kv_heads;
        let keys = heads_f32(a.keys);
        let values = heads_f32(a.values);
        let n = a.q.len() / (geo.n_heads * hd);
        for i in 0..n {
            // The positions row i sees, in order.
            let seen: Vec<usize> = match a.tree {
                None => (0..=a.past + i).collect(),
                Some(t) => {
                    let mut path = vec![t.first + i];
                    while let Some(&p) = path.last().map(|&j| &t.parents[j]) {
                        if p == usize::MAX {
                            break;
                        }
                        path.push(p);
                    }
                    (0..a.past)
                        .chain(path.iter().rev().map(|j| a.past + j))
                        .collect()
                }
            };
            for h in 0..geo.n_heads {
                let kvh = h / group;
                let q = &a.q[(i * geo.n_heads + h) * hd..][..hd];
                let scores: Vec<f64> = seen
                    .iter()
                    .map(|&p| {
                        let k = &keys[kvh][p * hd..(p + 1) * hd];
                        q.iter()
                            .zip(k)
                            .map(|(&q, &k)| q as f64 * k as f64)
                            .sum::<f64>()
                            * a.scale as f64
                    })
                    .collect();
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let z: f64 = weights.iter().sum();
                let out = &mut a.out[(i * geo.n_heads + h) * hd..][..hd];
                for (d, o) in out.iter_mut().enumerate() {
                    let s: f64 = seen
                        .iter()
                        .zip(&weights)
                        .map(|(&p, w)| w * values[kvh][p * hd + d] as f64)
                        .sum();
                    *o = (s / z) as f32;
                }
            }
        }
    }

    fn gated_delta(&self, a: DeltaNet<'_, Self>) {
        match a {
            DeltaNet::Chain {
                dims,
                inputs,
                n,
                state,
                out,
            } => {
                let mut s: Vec<f64> = state.iter().map(|&v| v as f64).collect();
                for t in 0..n {
                    step(
                        &dims,
                        &inputs,
                        t,
                        &mut s,
                        &mut out[t * dims.nv * dims.dv..],
                        None,
                    );
                }
                for (d, v) in state.iter_mut().zip(&s) {
                    *d = *v as f32;
                }
            }
            DeltaNet::Tree {
                dims,
                inputs,
                parents,
                state,
                out,
                deltas,
            } => {
                let vd = dims.nv * dims.dv;
                for node in 0..parents.len() {
                    // The node's own path from the root, each step from the committed state.
                    let mut path = vec![node];
                    while let Some(&p) = path.last().map(|&j| &parents[j]) {
                        if p == usize::MAX {
                            break;
                        }
                        path.push(p);
                    }
                    let mut s: Vec<f64> = state.iter().map(|&v| v as f64).collect();
                    let mut o = vec![0f32; vd];
                    let mut delta = vec![0f64; vd];
                    for &j in path.iter().rev() {
                        step(&dims, &inputs, j, &mut s, &mut o, Some(&mut delta));
                    }
                    out[node * vd..(node + 1) * vd].copy_from_slice(&o);
                    for (d, &v) in deltas[node * vd..(node + 1) * vd].iter_mut().zip(&delta) {
                        *d = v as f32;
                    }
                }
            }
            DeltaNet::Gates {
                a,
                b,
                ssm_a,
                dt_bias,
                g,
                beta,
            } => {
                let nv = ssm_a.len();
                for i in 0..a.len() {
                    let h = i % nv;
                    let x = a[i] as f64 + dt_bias[h] as f64;
                    // softplus, written out: log(1 + e^x).
                    let softplus = if x > 20.0 { x } else { x.exp().ln_1p() };
                    g[i] = (ssm_a[h] as f64 * softplus) as f32;
                    beta[i] = (1.0 / (1.0 + (-(b[i] as f64)).exp())) as f32;
                }
            }
            DeltaNet::Replay {
                dims,
                state,
                k,
                g,
                delta,
            } => {
                let GdnDims { nv, dk, dv, .. } = dims;
                for hv in 0..nv {
                    let kh = dims.key_head(hv);
                    let decay = (g[hv] as f64).exp();
                    let s = &mut state[hv * dk * dv..(hv + 1) * dk * dv];
                    for i in 0..dk {
                        for j in 0..dv {
                            let v = s[i * dv + j] as f64 * decay
                                + k[kh * dk + i] as f64 * delta[hv * dv + j] as f64;
                            s[i * dv + j] = v as f32;
                        }
                    }
                }
            }
        }
    }

    fn conv1d(&self, a: Conv<'_, Self>) {
        match a {
            Conv::Chain {
                taps,
                state,
                x,
                n,
                y,
            } => {
                let (ch, k) = (taps.channels(), taps.kernel());
                let seq: Vec<f32> = state.iter().chain(&x[..n * ch]).copied().collect();
                for t in 0..n {
                    let rows: Vec<usize> = (t..t + k).collect();
                    conv_row(taps, &seq, &rows, &mut y[t * ch..(t + 1) * ch]);
                }
                let hist = (k - 1) * ch;
                state.copy_from_slice(&seq[seq.len() - hist..]);
            }
            Conv::Tree {
                taps,
                state,
                x,
                parents,
                y,
            } => {
                let ch = taps.channels();
                let seq: Vec<f32> = state.iter().chain(x).copied().collect();
                for node in 0..parents.len() {
                    let rows = window(parents, taps.kernel(), node);
                    conv_row(taps, &seq, &rows, &mut y[node * ch..(node + 1) * ch]);
                }
            }
            Conv::Commit {
                taps,
                state,
                x,
                parents,
                node,
            } => {
                let ch = taps.channels();
                let seq: Vec<f32> = state.iter().chain(x).copied().collect();
                let rows = window(parents, taps.kernel(), node);
                for (dst, &r) in state.chunks_exact_mut(ch).zip(&rows[1..]) {
                    dst.copy_from_slice(&seq[r * ch..(r + 1) * ch]);
                }
            }
        }
    }
}

/// Each head's rows as f32.
fn heads_f32(kv: KvHeads) -> Vec<Vec<f32>> {
    fn load<S: Stored>(heads: &[&[S]]) -> Vec<Vec<f32>> {
        heads
            .iter()
            .map(|h| {
                let mut out = vec![0f32; h.len() * S::VALUES];
                S::load(h, &mut out);
                out
            })
            .collect()
    }
    match kv {
        KvHeads::F32(h) => load(h),
        KvHeads::F16(h) => load(h),
        KvHeads::Q8_0(h) => load(h),
    }
}

/// One token `t` of the recurrence on `s` (f64, `nv × dk × dv`): decay, read, delta, update,
/// read. Writes the token's output (`nv × dv`) to `out` and, when asked, its deltas.
fn step(
    dims: &GdnDims,
    inp: &DeltaInputs<'_, Reference>,
    t: usize,
    s: &mut [f64],
    out: &mut [f32],
    mut deltas: Option<&mut Vec<f64>>,
) {
    let GdnDims { nk, nv, dk, dv, .. } = *dims;
    for hv in 0..nv {
        let kh = dims.key_head(hv);
        let q = &inp.q[(t * nk + kh) * dk..][..dk];
        let k = &inp.k[(t * nk + kh) * dk..][..dk];
        let v = &inp.v[(t * nv + hv) * dv..][..dv];
        let (g, beta) = (inp.g[t * nv + hv] as f64, inp.beta[t * nv + hv] as f64);
        let sh = &mut s[hv * dk * dv..(hv + 1) * dk * dv];
        sh.iter_mut().for_each(|e| *e *= g.exp());
        for j in 0..dv {
            let mem: f64 = (0..dk).map(|i| sh[i * dv + j] * k[i] as f64).sum();
            let delta = (v[j] as f64 - mem) * beta;
            for i in 0..dk {
                sh[i * dv + j] += k[i] as f64 * delta;
            }
            if let Some(d) = deltas.as_deref_mut() {
                d[hv * dv + j] = delta;
            }
        }
        for j in 0..dv {
            let o: f64 = (0..dk).map(|i| sh[i * dv + j] * q[i] as f64).sum();
            out[hv * dv + j] = o as f32;
        }
    }
}

/// `silu(Σ_j tap_j · seq[rows[j]])` per channel into `y`.
fn conv_row(taps: &ConvTaps, seq: &[f32], rows: &[usize], y: &mut [f32]) {
    let ch = taps.channels();
    for (c, y) in y.iter_mut().enumerate() {
        let s: f64 = rows
            .iter()
            .enumerate()
            .map(|(j, &r)| taps.tap(j)[c] as f64 * seq[r * ch + c] as f64)
            .sum();
        *y = (s / (1.0 + (-s).exp())) as f32;
    }
}

/// The rows (of [state rows | tree rows]) node `node`'s window reads, oldest first: its
/// `K − 1` predecessors along the parents, reaching into the state above the root.
fn window(parents: &[usize], k: usize, node: usize) -> Vec<usize> {
    let hist = k - 1;
    let mut rows = vec![hist + node];
    let (mut at, mut in_state) = (Some(node), hist);
    while rows.len() < k {
        match at.map(|j| parents[j]).filter(|&p| p != usize::MAX) {
            Some(p) => {
                rows.push(hist + p);
                at = Some(p);
            }
            None => {
                at = None;
                in_state -= 1;
                rows.push(in_state);
            }
        }
    }
    rows.reverse();
    rows
}
