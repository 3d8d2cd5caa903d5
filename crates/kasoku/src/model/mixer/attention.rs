//! The attention mixer of every family (its KV cache is the backend's `KvCache`).
//!
//! One layer: Q/K/V projections (+ bias for Qwen2), optional per-head q/k RMSNorm (Qwen3,
//! Qwen3.5), RoPE at the tokens' positions, append K/V to the cache, causal grouped-query
//! attention of the new tokens over the cache, optional sigmoid output gate (Qwen3.5: the
//! q projection yields `[query(hd) | gate(hd)]` per head), output projection.

use std::sync::Arc;

use crate::backend::{
    Activation, Attend, Backend, BufVec, CopyRows, Cpu, Epilogue, Fused, KvStore, KvType, MatMul,
    MatMulMany, MatMulPrepared, RopeArgs, WeightInfo,
};
use crate::format::Claims;
use crate::kernels::attention::AttnGeometry;
use crate::kernels::matmul::WeightFormat;
use crate::kernels::rope::Rope;

use super::super::batch::Pass;
use super::super::scratch::carve;
use super::super::trace::{Op, Trace};
use super::super::weights::{self, MatrixRows};
use super::super::{ModelConfig, ModelError, RmsNorm};

/// Weights and geometry of one attention layer.
pub struct Attention<B: Backend = Cpu> {
    /// The q, k and v projections, stacked into one matrix where their formats allow it.
    pub qkv: Projections<B>,
    pub wo: B::Weight,
    pub bq: Option<B::Vec>,
    pub bk: Option<B::Vec>,
    pub bv: Option<B::Vec>,
    pub q_norm: Option<RmsNorm<B>>,
    pub k_norm: Option<RmsNorm<B>>,
    pub rope: Arc<Rope>,
    pub geo: AttnGeometry,
    /// Qwen3.5 output gate: q projection rows are `[query | gate]` per head.
    pub gated: bool,
    pub scale: f32,
    /// How its caches store keys and values (see `Model::set_kv_type`).
    pub kv_type: KvType,
}

/// An attention layer's q, k and v projections: one stacked matrix (one pass over the
/// weights, which matters for small models whose matrices are too small to stream at full
/// speed one by one), or three when their formats differ.
pub enum Projections<B: Backend = Cpu> {
    /// Rows `[q | k | v]`, k and v of equal height.
    Stacked { w: B::Weight, q_rows: usize },
    Separate {
        wq: B::Weight,
        wk: B::Weight,
        wv: B::Weight,
    },
}

impl<B: Backend> Projections<B> {
    /// Packs the three matrices (k and v of equal height) for `b`, stacked when they share a
    /// format.
    pub fn load(
        b: &B,
        q: &MatrixRows,
        k: &MatrixRows,
        v: &MatrixRows,
    ) -> Result<Projections<B>, ModelError> {
        Ok(match MatrixRows::pack_stacked(b, &[q, k, v]) {
            Some(w) => Projections::Stacked {
                w: w?,
                q_rows: q.rows,
            },
            None => Projections::Separate {
                wq: q.pack(b)?,
                wk: k.pack(b)?,
                wv: v.pack(b)?,
            },
        })
    }

    /// The format of the (first) matrix.
    pub fn format(&self) -> WeightFormat {
        match self {
            Projections::Stacked { w, .. } => w.format(),
            Projections::Separate { wq, .. } => wq.format(),
        }
    }

    /// Bytes of the packed matrices (what one product reads).
    pub fn size_bytes(&self) -> usize {
        match self {
            Projections::Stacked { w, .. } => w.size_bytes(),
            Projections::Separate { wq, wk, wv } => {
                wq.size_bytes() + wk.size_bytes() + wv.size_bytes()
            }
        }
    }

    /// Values of the stacked product of `n` rows that [`Projections::project`] needs as
    /// room (0 for separate matrices).
    fn stacked_len(&self, n: usize) -> usize {
        match self {
            Projections::Stacked { w, .. } => n * w.rows(),
            Projections::Separate { .. } => 0,
        }
    }

    /// The matrix to prepare rows for on `b` when one fused norm can write them for every
    /// matrix; `None` for f32 rows.
    fn prepared_input(&self, b: &B) -> Option<&B::Weight> {
        let ws = match self {
            Projections::Stacked { w, .. } => [w, w, w],
            Projections::Separate { wq, wk, wv } => [wq, wk, wv],
        };
        b.can_prepare(&ws).then_some(ws[0])
    }

    /// `q = x·Wqᵀ, k = x·Wkᵀ, v = x·Wvᵀ` for the `n` rows of `x`, or of `prepared` when given
    /// (`all`: room for the stacked product, [`Projections::stacked_len`]).
    #[allow(clippy::too_many_arguments)]
    fn project(
        &self,
        b: &B,
        x: &B::Buffer,
        prepared: Option<&B::Prepared>,
        n: usize,
        all: &mut B::Buffer,
        q: &mut B::Buffer,
        k: &mut B::Buffer,
        v: &mut B::Buffer,
    ) {
        match self {
            &Projections::Stacked { ref w, q_rows } => {
                let rows = w.rows();
                let kv_rows = (rows - q_rows) / 2;
                match prepared {
                    Some(p) => b.matmul_prepared(MatMulPrepared {
                        ws: &[w],
                        x: p,
                        n,
                        ys: &mut [&mut *all],
                    }),
                    None => b.matmul(MatMul { w, x, n, y: all }),
                }
                // Each row's [q | k | v] into the three outputs.
                for (dst, at, width) in [
                    (q, 0, q_rows),
                    (k, q_rows, kv_rows),
                    (v, q_rows + kv_rows, kv_rows),
                ] {
                    b.copy(CopyRows {
                        src: &*all,
                        src_at: at,
                        src_stride: rows,
                        dst,
                        dst_at: 0,
                        dst_stride: width,
                        rows: n,
                        width,
                    });
                }
            }
            Projections::Separate { wq, wk, wv } => match prepared {
                Some(p) => b.matmul_prepared(MatMulPrepared {
                    ws: &[wq, wk, wv],
                    x: p,
                    n,
                    ys: &mut [q, k, v],
                }),
                None => b.matmul_many(MatMulMany {
                    ws: &[wq, wk, wv],
                    x,
                    n,
                    ys: &mut [q, k, v],
                }),
            },
        }
    }
}

impl<B: Backend> Attention<B> {
    /// Loads `blk.{layer}.attn_{q,k,v,output}` (+ `.bias`, `attn_{q,k}_norm`) per `cfg`.
    pub fn load(
        b: &B,
        claims: &Claims,
        layer: usize,
        cfg: &ModelConfig,
        rope: Arc<Rope>,
    ) -> Result<Attention<B>, ModelError> {
        let (h, hd) = (cfg.hidden, cfg.head_dim);
        let q_dim = cfg.n_heads * hd;
        let kv_dim = cfg.n_kv_heads * hd;
        let q_rows = if cfg.attn_output_gate {
            2 * q_dim
        } else {
            q_dim
        };
        let name = |part: &str| format!("blk.{layer}.{part}");
        let bias = |part: &str, len: usize| -> Result<Option<B::Vec>, ModelError> {
            if cfg.qkv_bias {
                weights::vector(claims, &name(part), len).map(|v| Some(b.upload(&v)))
            } else {
                Ok(None)
            }
        };
        let norm = |part: &str| -> Result<Option<RmsNorm<B>>, ModelError> {
            if cfg.qk_norm {
                RmsNorm::load(b, claims, &name(part), hd, cfg.rms_eps, cfg.norm_offset_one)
                    .map(Some)
            } else {
                Ok(None)
            }
        };
        if rope.head_dim != hd {
            return Err(ModelError::Unsupported(format!(
                "rope head dim {} != head dim {hd}",
                rope.head_dim
            )));
        }
        let q = weights::matrix_rows(claims, &name("attn_q.weight"), q_rows, h)?;
        let k = weights::matrix_rows(claims, &name("attn_k.weight"), kv_dim, h)?;
        let v = weights::matrix_rows(claims, &name("attn_v.weight"), kv_dim, h)?;
        Ok(Attention {
            qkv: Projections::load(b, &q, &k, &v)?,
            wo: weights::matrix(b, claims, &name("attn_output.weight"), h, q_dim)?,
            bq: bias("attn_q.bias", q_rows)?,
            bk: bias("attn_k.bias", kv_dim)?,
            bv: bias("attn_v.bias", kv_dim)?,
            q_norm: norm("attn_q_norm.weight")?,
            k_norm: norm("attn_k_norm.weight")?,
            rope,
            geo: AttnGeometry {
                n_heads: cfg.n_heads,
                n_kv_heads: cfg.n_kv_heads,
                head_dim: hd,
            },
            gated: cfg.attn_output_gate,
            scale: 1.0 / (hd as f32).sqrt(),
            kv_type: KvType::F32,
        })
    }

    /// The packed matrices by part name (`attn_qkv` stacked, else `attn_q`, `attn_k`,
    /// `attn_v`; then `attn_output`).
    pub(crate) fn matrices(&self) -> Vec<(&'static str, &B::Weight)> {
        let mut out = match &self.qkv {
            Projections::Stacked { w, .. } => vec![("attn_qkv", w)],
            Projections::Separate { wq, wk, wv } => {
                vec![("attn_q", wq), ("attn_k", wk), ("attn_v", wv)]
            }
        };
        out.push(("attn_output", &self.wo));
        out
    }

    /// The matrix whose prepared rows [`Attention::run`] reads instead of f32 ones on `b`,
    /// when one fused norm can write them for q, k and v; `None` for f32 rows.
    pub(crate) fn prepared_input(&self, b: &B) -> Option<&B::Weight> {
        self.qkv.prepared_input(b)
    }

    /// `n_kv_heads × head_dim`: the width of a KV cache row.
    pub fn kv_dim(&self) -> usize {
        self.geo.n_kv_heads * self.geo.head_dim
    }

    /// An empty cache in this layer's [`KvType`] on `b`.
    pub fn new_cache(&self, b: &B) -> B::KvCache {
        b.new_kv_cache(self.geo.n_kv_heads, self.geo.head_dim, self.kv_type)
    }

    /// Runs the pass's rows (`x`: `n × hidden`, already normed) at their positions, appends
    /// their keys and values to `cache` and writes the layer's output (`n × hidden`) to `out`;
    /// intermediates are carved from `work`. Chain rows see the cache and the rows before
    /// them; tree nodes see the committed positions and their ancestors, and their keys and
    /// values wait past the committed end, uncommitted: [`KvStore::commit`] keeps the accepted
    /// ones, [`KvStore::truncate`] drops them all. When [`Attention::prepared_input`] names
    /// a matrix, the rows are read from `prepared` instead of `x`; the attention output goes
    /// into `prepared` for the output projection where that matrix takes it.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn run<T: Trace>(
        &self,
        b: &B,
        cache: &mut B::KvCache,
        x: &B::Buffer,
        pass: &Pass,
        out: &mut B::Buffer,
        work: &mut B::Vec,
        prepared: &mut B::Prepared,
        layer: usize,
        tr: &mut T,
    ) {
        let AttnGeometry {
            n_heads,
            n_kv_heads,
            head_dim: hd,
        } = self.geo;
        let (n, past, positions) = (pass.n, pass.past, pass.positions);
        let q_dim = n_heads * hd;
        let kv_dim = n_kv_heads * hd;
        let q_rows = if self.gated { 2 * q_dim } else { q_dim };
        let split = if self.gated { n * q_dim } else { 0 };
        let first = pass.tree.map_or(0, |t| t.first);
        assert_eq!(
            cache.len(),
            past + first,
            "attention: the cache holds other rows"
        );
        let op = |name| Op::new(name, Some(layer), n);
        let [all, q_raw, k, v, q_split, gate, att] = carve(
            work,
            [
                self.qkv.stacked_len(n),
                n * q_rows,
                n * kv_dim,
                n * kv_dim,
                split,
                split,
                n * q_dim,
            ],
        );

        let qkv_op = op("qkv")
            .matmul(self.qkv.format())
            .reading(self.qkv.size_bytes());
        let input = self.prepared_input(b).map(|_| &*prepared);
        tr.op(qkv_op, || {
            self.qkv.project(b, x, input, n, all, q_raw, k, v)
        });
        if self.bq.is_some() {
            tr.op(op("qkv_bias"), || {
                for (buf, bias) in [
                    (&mut *q_raw, &self.bq),
                    (&mut *k, &self.bk),
                    (&mut *v, &self.bv),
                ] {
                    if let Some(bias) = bias {
                        b.activation(Activation::AddBias {
                            x: buf,
                            bias: bias.all(),
                        });
                    }
                }
            });
        }
        // Qwen3.5: per head, the first hd values are the query, the next hd the gate.
        let (q, gate) = if self.gated {
            tr.op(op("q_gate_split"), || {
                for (dst, at) in [(&mut *q_split, 0), (&mut *gate, hd)] {
                    b.copy(CopyRows {
                        src: &*q_raw,
                        src_at: at,
                        src_stride: 2 * hd,
                        dst,
                        dst_at: 0,
                        dst_stride: hd,
                        rows: n * n_heads,
                        width: hd,
                    });
                }
            });
            (q_split, Some(&*gate))
        } else {
            (q_raw, None)
        };
        if self.q_norm.is_some() || self.k_norm.is_some() {
            tr.op(op("qk_norm"), || {
                if let Some(norm) = &self.q_norm {
                    norm.forward_inplace(b, q);
                }
                if let Some(norm) = &self.k_norm {
                    norm.forward_inplace(b, k);
                }
            });
        }
        tr.op(op("rope"), || {
            let rope = &*self.rope;
            b.rope(RopeArgs {
                rope,
                heads: n_heads,
                positions,
                x: q,
            });
            b.rope(RopeArgs {
                rope,
                heads: n_kv_heads,
                positions,
                x: k,
            });
        });
        tr.op(op("kv_append"), || cache.append(k, v));

        let kv_bytes = cache.bytes();
        // Without an output gate, attention writes its rows prepared for the output
        // projection where that matrix takes them.
        let fused_out = gate.is_none() && b.can_prepare(&[&self.wo]);
        let wo = op("attn_out")
            .matmul(self.wo.format())
            .reading(self.wo.size_bytes());
        if fused_out {
            tr.op(op("attention").reading(kv_bytes), || {
                cache.with_heads(|keys, values| {
                    b.fused(Fused {
                        w: &self.wo,
                        epilogue: Epilogue::Attention {
                            geo: self.geo,
                            q,
                            keys,
                            values,
                            past,
                            scale: self.scale,
                            tree: pass.tree,
                        },
                        out: prepared,
                    })
                })
            });
            tr.op(wo, || {
                b.matmul_prepared(MatMulPrepared {
                    ws: &[&self.wo],
                    x: prepared,
                    n,
                    ys: &mut [out],
                })
            });
            return;
        }
        tr.op(op("attention").reading(kv_bytes), || {
            cache.with_heads(|keys, values| {
                b.attention(Attend {
                    geo: self.geo,
                    q,
                    keys,
                    values,
                    past,
                    scale: self.scale,
                    tree: pass.tree,
                    out: att,
                })
            })
        });
        if let Some(g) = gate {
            tr.op(op("attn_gate"), || {
                b.activation(Activation::SigmoidGate { x: att, gate: g })
            });
        }
        tr.op(wo, || {
            b.matmul(MatMul {
                w: &self.wo,
                x: att,
                n,
                y: out,
            })
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::matmul::MatMulWeight;
    use crate::quant::legacy::tests::{random_blocks, Rng};
    use crate::quant::DType;

    /// Stacked projections give exactly the separate ones' rows, in every matrix format
    /// family, for one row and for several.
    #[test]
    fn stacked_projections_equal_separate_ones() {
        let mut rng = Rng(21);
        let (cols, q_rows, kv_rows) = (64, 24, 12);
        for (dtype, block) in [(DType::Q4_0, 18), (DType::Q8_0, 34), (DType::F32, 4)] {
            let per_row = dtype.bytes_for(cols).unwrap() / block;
            let mut bytes = |rows: usize| -> Vec<u8> {
                if dtype == DType::F32 {
                    (0..rows * cols)
                        .flat_map(|_| (rng.f32() - 0.5).to_le_bytes())
                        .collect()
                } else {
                    random_blocks(&mut rng, block, rows * per_row)
                }
            };
            let (bq, bk, bv) = (bytes(q_rows), bytes(kv_rows), bytes(kv_rows));
            let new = |rows, b: &[u8]| MatMulWeight::new(dtype, rows, cols, b).unwrap();
            let all: Vec<u8> = [&bq, &bk, &bv].into_iter().flatten().copied().collect();
            let stacked = Projections::Stacked {
                w: new(q_rows + 2 * kv_rows, &all),
                q_rows,
            };
            let separate = Projections::Separate {
                wq: new(q_rows, &bq),
                wk: new(kv_rows, &bk),
                wv: new(kv_rows, &bv),
            };
            let project = |p: &Projections, x: &[f32], n: usize| {
                let mut all = vec![0f32; p.stacked_len(n)];
                let mut q = vec![0f32; n * q_rows];
                let (mut k, mut v) = (vec![0f32; n * kv_rows], vec![0f32; n * kv_rows]);
                p.project(&Cpu, x, None, n, &mut all, &mut q, &mut k, &mut v);
                (q, k, v)
            };
            for n in [1, 5] {
                let x: Vec<f32> = (0..n * cols).map(|_| rng.f32() - 0.5).collect();
                assert_eq!(
                    project(&stacked, &x, n),
                    project(&separate, &x, n),
                    "{dtype} n={n}"
                );
            }
        }
    }
}
