//! The CPU backend: `crate::kernels` behind the [`Backend`] interface, each method a direct
//! call of today's kernel (same arithmetic, same bits). Buffers are host slices (`Vec<f32>`
//! owned), weights `MatMulWeight` (packed 8 rows interleaved per format family), KV caches the
//! host [`KvCache`] and their views `KvHeads`; the copies to and from "the host" are copies
//! between slices, and the LM head writes straight into the caller's logits.

use super::{
    Activation, Attend, Backend, Conv, CopyRows, DeltaInputs, DeltaNet, Epilogue, Fused, Gather,
    KvCache, KvType, Logits, MatMul, MatMulMany, MatMulPrepared, Norm, NormInPlace, RopeArgs,
    Table, WeightInfo,
};
use crate::kernels::activation::{sigmoid_gate, silu, swiglu_inplace};
use crate::kernels::attention::{attend, AttnArgs, KvHeads};
use crate::kernels::conv1d::{causal_conv1d_silu, tree_conv1d_silu, tree_conv_commit};
use crate::kernels::fused;
use crate::kernels::gated_delta::tree::{replay, tree_recurrent};
use crate::kernels::gated_delta::{gated_delta, gates, l2norm_heads, GdnInputs};
use crate::kernels::matmul::{
    matmul, matmul_many, matmul_prepared, shares_prepared, MatMulError, MatMulWeight, Prepared,
    WeightFormat,
};
use crate::kernels::norm::{rmsnorm, rmsnorm_inplace};
use crate::quant::kasoku::QuantizedView;
use crate::quant::{dequantize, DType};

impl super::PreparedRows for Prepared {
    fn bytes(&self) -> usize {
        Prepared::bytes(self)
    }
}

/// The CPU backend (the worker pool and the instruction set are process-wide).
#[derive(Clone, Copy, Debug, Default)]
pub struct Cpu;

impl Backend for Cpu {
    type Buffer = [f32];
    type Vec = Vec<f32>;
    type Weight = MatMulWeight;
    type Kv<'a> = KvHeads<'a>;
    type Prepared = Prepared;
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
    ) -> Result<MatMulWeight, MatMulError> {
        MatMulWeight::new(dtype, rows, cols, bytes)
    }

    fn upload(&self, values: &[f32]) -> Vec<f32> {
        values.to_vec()
    }

    fn pack_kasoku(&self, q: QuantizedView<'_>) -> MatMulWeight {
        MatMulWeight::kasoku(q)
    }

    #[inline]
    fn matmul(&self, a: MatMul<'_, Self>) {
        matmul(a.w, a.x, a.n, a.y)
    }

    #[inline]
    fn matmul_many(&self, a: MatMulMany<'_, '_, Self>) {
        matmul_many(a.ws, a.x, a.n, a.ys)
    }

    #[inline]
    fn can_prepare(&self, ws: &[&MatMulWeight]) -> bool {
        fused::enabled() && shares_prepared(ws)
    }

    fn fused(&self, a: Fused<'_, '_, '_, Self>) {
        match a.epilogue {
            Epilogue::RmsNorm { x, weight, eps } => fused::rmsnorm(x, weight, eps, a.w, a.out),
            Epilogue::SwiGlu { gate, up } => fused::swiglu(gate, up, a.w, a.out),
            Epilogue::Attention {
                geo,
                q,
                keys,
                values,
                past,
                scale,
                tree,
            } => {
                let args = AttnArgs {
                    geo,
                    q,
                    keys,
                    values,
                    past,
                    scale,
                    tree,
                };
                fused::attend(&args, a.w, a.out)
            }
        }
    }

    #[inline]
    fn matmul_prepared(&self, a: MatMulPrepared<'_, '_, Self>) {
        matmul_prepared(a.ws, a.x, a.n, a.ys)
    }

    #[inline]
    fn logits(&self, a: Logits<'_, Self>) {
        matmul(a.w, a.x, a.n, a.y)
    }

    #[inline]
    fn copy(&self, a: CopyRows<'_, [f32], [f32]>) {
        copy_rows(a)
    }

    #[inline]
    fn read(&self, a: CopyRows<'_, [f32], [f32]>) {
        copy_rows(a)
    }

    #[inline]
    fn write(&self, a: CopyRows<'_, [f32], [f32]>) {
        copy_rows(a)
    }

    fn gather(&self, a: Gather<'_, Self>) {
        gather_rows(a.table, a.dim, a.tokens, a.out)
    }

    #[inline]
    fn rmsnorm(&self, a: Norm<'_, Self>) {
        rmsnorm(a.x, a.weight, a.eps, a.out)
    }

    #[inline]
    fn rmsnorm_inplace(&self, a: NormInPlace<'_, Self>) {
        rmsnorm_inplace(a.x, a.weight, a.eps)
    }

    #[inline]
    fn rope(&self, a: RopeArgs<'_, Self>) {
        a.rope.apply(a.x, a.heads, a.positions)
    }

    #[inline]
    fn activation(&self, a: Activation<'_, Self>) {
        match a {
            Activation::SwiGlu { gate, up } => swiglu_inplace(gate, up),
            Activation::SigmoidGate { x, gate } => sigmoid_gate(x, gate),
            Activation::SiluGate { x, gate } => {
                for (v, &g) in x.iter_mut().zip(gate) {
                    *v *= silu(g);
                }
            }
            Activation::Add { x, d } => x.iter_mut().zip(d).for_each(|(a, d)| *a += d),
            Activation::AddBias { x, bias } => {
                for row in x.chunks_exact_mut(bias.len()) {
                    row.iter_mut().zip(bias).for_each(|(y, b)| *y += b);
                }
            }
            Activation::L2Norm { x, dim, scale } => l2norm_heads(x, dim, scale),
        }
    }

    #[inline]
    fn attention(&self, a: Attend<'_, '_, Self>) {
        let args = AttnArgs {
            geo: a.geo,
            q: a.q,
            keys: a.keys,
            values: a.values,
            past: a.past,
            scale: a.scale,
            tree: a.tree,
        };
        attend(&args, a.out)
    }

    #[inline]
    fn gated_delta(&self, a: DeltaNet<'_, Self>) {
        match a {
            DeltaNet::Chain {
                dims,
                inputs: i,
                n,
                state,
                out,
            } => gated_delta(&dims, &inputs(&i), n, state, out),
            DeltaNet::Tree {
                dims,
                inputs: i,
                parents,
                state,
                out,
                deltas,
            } => tree_recurrent(&dims, &inputs(&i), parents, state, out, deltas),
            DeltaNet::Gates {
                a,
                b,
                ssm_a,
                dt_bias,
                g,
                beta,
            } => gates(a, b, ssm_a, dt_bias, g, beta),
            DeltaNet::Replay {
                dims,
                state,
                k,
                g,
                delta,
            } => replay(&dims, state, k, g, delta),
        }
    }

    #[inline]
    fn conv1d(&self, a: Conv<'_, Self>) {
        match a {
            Conv::Chain {
                taps,
                state,
                x,
                n,
                y,
            } => causal_conv1d_silu(taps, state, x, n, y),
            Conv::Tree {
                taps,
                state,
                x,
                parents,
                y,
            } => tree_conv1d_silu(taps, state, x, parents, y),
            Conv::Commit {
                taps,
                state,
                x,
                parents,
                node,
            } => tree_conv_commit(taps, state, x, parents, node),
        }
    }
}

/// The kernels' form of the inputs.
fn inputs<'a>(i: &DeltaInputs<'a, Cpu>) -> GdnInputs<'a> {
    GdnInputs {
        q: i.q,
        k: i.k,
        v: i.v,
        g: i.g,
        beta: i.beta,
    }
}

impl WeightInfo for MatMulWeight {
    #[inline]
    fn rows(&self) -> usize {
        self.rows
    }
    #[inline]
    fn cols(&self) -> usize {
        self.cols
    }
    #[inline]
    fn format(&self) -> WeightFormat {
        MatMulWeight::format(self)
    }
    #[inline]
    fn size_bytes(&self) -> usize {
        MatMulWeight::size_bytes(self)
    }
}

/// Copies rows between host slices (see [`CopyRows`]).
#[inline]
pub(super) fn copy_rows(a: CopyRows<'_, [f32], [f32]>) {
    let w = a.width;
    for r in 0..a.rows {
        let (s, d) = (a.src_at + r * a.src_stride, a.dst_at + r * a.dst_stride);
        a.dst[d..d + w].copy_from_slice(&a.src[s..s + w]);
    }
}

/// Rows `tokens` of `table` (`dim` values each) into `out`, as f32 in the original basis.
pub(super) fn gather_rows(table: Table<'_>, dim: usize, tokens: &[u32], out: &mut [f32]) {
    match table {
        Table::Raw { dtype, bytes } => {
            let row_bytes = dtype.bytes_for(dim).expect("gather: rows of whole blocks");
            for (&t, row) in tokens.iter().zip(out.chunks_exact_mut(dim)) {
                let at = t as usize * row_bytes;
                dequantize(dtype, &bytes[at..at + row_bytes], row);
            }
        }
        Table::Kasoku { view, signs } => {
            for (&t, row) in tokens.iter().zip(out.chunks_exact_mut(dim)) {
                view.dequantize_row_rotated(t as usize, row);
                if let Some(s) = signs {
                    s.unrotate(row);
                }
            }
        }
    }
}
