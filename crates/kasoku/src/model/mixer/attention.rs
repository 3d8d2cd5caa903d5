//! The attention mixer of every family, and its KV cache.
//!
//! One layer: Q/K/V projections (+ bias for Qwen2), optional per-head q/k RMSNorm (Qwen3,
//! Qwen3.5), RoPE at the tokens' positions, append K/V to the cache, causal grouped-query
//! attention of the new tokens over the cache, optional sigmoid output gate (Qwen3.5: the
//! q projection yields `[query(hd) | gate(hd)]` per head), output projection.

use std::sync::Arc;

use crate::format::Claims;
use crate::kernels::activation::sigmoid_gate;
use crate::kernels::attention::{attention, AttnGeometry};
use crate::kernels::matmul::{matmul, MatMulWeight};
use crate::kernels::rope::Rope;

use super::super::{weights, ModelConfig, ModelError, RmsNorm};

/// Keys and values of one attention layer, f32, `[position][kv_head][head_dim]`.
#[derive(Clone, Debug)]
pub struct KvCache {
    kv_dim: usize,
    keys: Vec<f32>,
    values: Vec<f32>,
}

impl KvCache {
    /// An empty cache for rows of `kv_dim` values (`n_kv_heads × head_dim`).
    pub fn new(kv_dim: usize) -> KvCache {
        KvCache {
            kv_dim,
            keys: Vec::new(),
            values: Vec::new(),
        }
    }

    /// Positions held.
    pub fn len(&self) -> usize {
        self.keys.len() / self.kv_dim.max(1)
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    pub fn kv_dim(&self) -> usize {
        self.kv_dim
    }

    /// All keys, `len × kv_dim`.
    pub fn keys(&self) -> &[f32] {
        &self.keys
    }

    /// All values, `len × kv_dim`.
    pub fn values(&self) -> &[f32] {
        &self.values
    }

    /// Appends rows of keys and values (equal lengths, whole rows).
    pub fn append(&mut self, keys: &[f32], values: &[f32]) {
        assert!(
            keys.len() == values.len() && keys.len().is_multiple_of(self.kv_dim.max(1)),
            "kv cache: bad rows"
        );
        self.keys.extend_from_slice(keys);
        self.values.extend_from_slice(values);
    }

    /// Keeps the first `len` positions.
    pub fn truncate(&mut self, len: usize) {
        self.keys.truncate(len * self.kv_dim);
        self.values.truncate(len * self.kv_dim);
    }

    /// After a batch appended at `base`, keeps only the rows `base + accepted[i]` (in that
    /// order, each index < the batch size, increasing) at positions `base + i`.
    pub fn commit(&mut self, base: usize, accepted: &[usize]) {
        let d = self.kv_dim;
        for (i, &a) in accepted.iter().enumerate() {
            assert!(
                base + a < self.len(),
                "kv cache: accepted row {a} past the end"
            );
            if a != i {
                let (src, dst) = ((base + a) * d, (base + i) * d);
                self.keys.copy_within(src..src + d, dst);
                self.values.copy_within(src..src + d, dst);
            }
        }
        self.truncate(base + accepted.len());
    }
}

/// Weights and geometry of one attention layer.
pub struct Attention {
    pub wq: MatMulWeight,
    pub wk: MatMulWeight,
    pub wv: MatMulWeight,
    pub wo: MatMulWeight,
    pub bq: Option<Vec<f32>>,
    pub bk: Option<Vec<f32>>,
    pub bv: Option<Vec<f32>>,
    pub q_norm: Option<RmsNorm>,
    pub k_norm: Option<RmsNorm>,
    pub rope: Arc<Rope>,
    pub geo: AttnGeometry,
    /// Qwen3.5 output gate: q projection rows are `[query | gate]` per head.
    pub gated: bool,
    pub scale: f32,
}

impl Attention {
    /// Loads `blk.{layer}.attn_{q,k,v,output}` (+ `.bias`, `attn_{q,k}_norm`) per `cfg`.
    pub fn load(
        claims: &Claims,
        layer: usize,
        cfg: &ModelConfig,
        rope: Arc<Rope>,
    ) -> Result<Attention, ModelError> {
        let (h, hd) = (cfg.hidden, cfg.head_dim);
        let q_dim = cfg.n_heads * hd;
        let kv_dim = cfg.n_kv_heads * hd;
        let q_rows = if cfg.attn_output_gate {
            2 * q_dim
        } else {
            q_dim
        };
        let name = |part: &str| format!("blk.{layer}.{part}");
        let bias = |part: &str, len: usize| -> Result<Option<Vec<f32>>, ModelError> {
            if cfg.qkv_bias {
                weights::vector(claims, &name(part), len).map(Some)
            } else {
                Ok(None)
            }
        };
        let norm = |part: &str| -> Result<Option<RmsNorm>, ModelError> {
            if cfg.qk_norm {
                RmsNorm::load(claims, &name(part), hd, cfg.rms_eps, cfg.norm_offset_one).map(Some)
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
        Ok(Attention {
            wq: weights::matrix(claims, &name("attn_q.weight"), q_rows, h)?,
            wk: weights::matrix(claims, &name("attn_k.weight"), kv_dim, h)?,
            wv: weights::matrix(claims, &name("attn_v.weight"), kv_dim, h)?,
            wo: weights::matrix(claims, &name("attn_output.weight"), h, q_dim)?,
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
        })
    }

    /// `n_kv_heads × head_dim`: the width of a KV cache row.
    pub fn kv_dim(&self) -> usize {
        self.geo.n_kv_heads * self.geo.head_dim
    }

    pub fn new_cache(&self) -> KvCache {
        KvCache::new(self.kv_dim())
    }

    /// Runs `n` new tokens (`x`: `n × hidden`, already normed) at positions
    /// `cache.len()..cache.len() + n`, appends their keys and values to `cache`, and writes the
    /// layer's output (`n × hidden`) to `out`.
    pub fn forward(&self, cache: &mut KvCache, x: &[f32], n: usize, out: &mut [f32]) {
        let AttnGeometry {
            n_heads,
            n_kv_heads,
            head_dim: hd,
        } = self.geo;
        let q_dim = n_heads * hd;
        let kv_dim = n_kv_heads * hd;
        let past = cache.len();

        let mut q_raw = vec![0f32; n * self.wq.rows];
        let mut k = vec![0f32; n * kv_dim];
        let mut v = vec![0f32; n * kv_dim];
        matmul(&self.wq, x, n, &mut q_raw);
        matmul(&self.wk, x, n, &mut k);
        matmul(&self.wv, x, n, &mut v);
        for (buf, bias) in [
            (&mut q_raw, &self.bq),
            (&mut k, &self.bk),
            (&mut v, &self.bv),
        ] {
            if let Some(b) = bias {
                for row in buf.chunks_exact_mut(b.len()) {
                    row.iter_mut().zip(b).for_each(|(y, b)| *y += b);
                }
            }
        }
        // Qwen3.5: per head, the first hd values are the query, the next hd the gate.
        let (mut q, gate) = if self.gated {
            let mut q = vec![0f32; n * q_dim];
            let mut g = vec![0f32; n * q_dim];
            for (i, pair) in q_raw.chunks_exact(2 * hd).enumerate() {
                q[i * hd..(i + 1) * hd].copy_from_slice(&pair[..hd]);
                g[i * hd..(i + 1) * hd].copy_from_slice(&pair[hd..]);
            }
            (q, Some(g))
        } else {
            (q_raw, None)
        };
        if let Some(norm) = &self.q_norm {
            norm.forward_inplace(&mut q);
        }
        if let Some(norm) = &self.k_norm {
            norm.forward_inplace(&mut k);
        }
        let positions: Vec<usize> = (past..past + n).collect();
        self.rope.apply(&mut q, n_heads, &positions);
        self.rope.apply(&mut k, n_kv_heads, &positions);
        cache.append(&k, &v);

        let mut att = vec![0f32; n * q_dim];
        attention(
            self.geo,
            &q,
            cache.keys(),
            cache.values(),
            past,
            self.scale,
            &mut att,
        );
        if let Some(g) = &gate {
            sigmoid_gate(&mut att, g);
        }
        matmul(&self.wo, &att, n, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_cache_append_truncate_commit() {
        let mut c = KvCache::new(2);
        assert!(c.is_empty());
        c.append(&[0., 0., 1., 1., 2., 2.], &[10., 10., 11., 11., 12., 12.]);
        assert_eq!(c.len(), 3);
        // A batch of 4 at base 3; keep rows 1 and 3.
        c.append(
            &[3., 3., 4., 4., 5., 5., 6., 6.],
            &[13., 13., 14., 14., 15., 15., 16., 16.],
        );
        c.commit(3, &[1, 3]);
        assert_eq!(c.len(), 5);
        assert_eq!(c.keys(), &[0., 0., 1., 1., 2., 2., 4., 4., 6., 6.]);
        assert_eq!(
            c.values(),
            &[10., 10., 11., 11., 12., 12., 14., 14., 16., 16.]
        );
        c.truncate(1);
        assert_eq!(c.keys(), &[0., 0.]);
    }
}
