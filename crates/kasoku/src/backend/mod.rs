//! The backend interface: what a device must compute for the model, one method per kernel
//! family, each taking a parameter struct. A backend chooses its own types for activation
//! buffers ([`Backend::Buffer`]), packed weight matrices ([`Backend::Weight`], packed from a
//! checkpoint's bytes by [`Backend::pack`], so each backend picks its layout), views of a
//! KV cache ([`Backend::Kv`]) and rows prepared for products ([`Backend::Prepared`]: an
//! epilogue such as RMSNorm may write the next product's activations in the form its matrices
//! read, [`Backend::fused`]); callers are generic over the backend and dispatch statically.
//!
//! - [`cpu::Cpu`]: today's kernels (`crate::kernels`), unchanged: its buffers are host
//!   slices, its weights `MatMulWeight`, each method a direct call of the kernel.
//! - [`reference::Reference`]: the oracle. Every family written out in f64 from its
//!   definition (weights dequantized once at packing), one token and one head at a time; slow
//!   and obviously right. Its Gated DeltaNet steps the recurrence in the reference order
//!   (decay, read, delta, update, read).
//!
//! `tests.rs` runs every kernel family of every backend against the reference on random
//! shapes (llama.cpp's `test-backend-ops` in spirit): matmul on every weight format at several
//! row counts (and several matrices in one job), RMSNorm (and in place), RoPE in both
//! layouts, the activations (SwiGLU, the sigmoid and SiLU gates, adds, biases, l2 norms),
//! attention over f32 / f16 / q8_0 caches as a chain and as a tree, Gated DeltaNet gates /
//! recurrent / chunked / tree / replay, conv1d plain / tree / commit, the embedding gather,
//! the fused epilogues into products on kasoku's formats.
//!
//! Model code (`crate::model`) is generic over `B: Backend` (`Model<B = Cpu>`): its weight
//! matrices are `B::Weight`, its weight vectors (norms, biases) `B::Vec`
//! ([`Backend::upload`]), its activations and recurrent states `B::Buffer` / `B::Vec`
//! ([`buffer`]), its KV caches `B::KvCache` ([`KvStore`]), and it never reads an activation on
//! the host: it moves values with [`Backend::copy`], and results reach the host only through
//! [`Backend::logits`] and [`Backend::read`] (inputs through [`Backend::write`]).

pub mod buffer;
pub mod cpu;
pub mod kv_cache;
pub mod reference;

pub use buffer::{Buf, BufVec};
pub use cpu::Cpu;
pub use kv_cache::{KvCache, KvType};
pub use reference::Reference;
#[cfg(test)]
mod tests;

use crate::kernels::attention::{AttnGeometry, TreeRows};
use crate::kernels::gated_delta::GdnDims;
use crate::kernels::matmul::{MatMulError, WeightFormat};
use crate::kernels::rope::Rope;
use crate::quant::kasoku::{QuantizedView, Signs};
use crate::quant::DType;

/// A device that runs the model's kernels: see the module doc.
pub trait Backend: Send + Sync + Clone + std::fmt::Debug + 'static {
    /// A buffer of f32 activations (`[f32]` on the host).
    type Buffer: ?Sized + Buf + 'static;
    /// An owned, growable buffer (`Vec<f32>` on the host): scratch and recurrent states.
    type Vec: BufVec<Self::Buffer>;
    /// A weight matrix packed for [`Backend::matmul`].
    type Weight: Send + Sync + WeightInfo;
    /// A view of one layer's KV cache, as attention reads it.
    type Kv<'a>: Copy
    where
        Self: 'a;
    /// Rows an epilogue wrote already prepared for the products of some matrices
    /// ([`Backend::fused`]; the CPU: rotated int8 blocks for kasoku's formats). The caller
    /// keeps one from pass to pass.
    type Prepared: PreparedRows;
    /// One attention layer's KV cache.
    type KvCache: KvStore<Self>;

    /// An empty KV cache for `n_kv_heads` heads of `head_dim` values stored as `kv_type`
    /// (which can store such rows: `KvType::row_bytes`).
    fn new_kv_cache(&self, n_kv_heads: usize, head_dim: usize, kv_type: KvType) -> Self::KvCache;

    /// Packs a `rows × cols` matrix stored as `dtype` (GGUF block layout, row by row).
    fn pack(
        &self,
        dtype: DType,
        rows: usize,
        cols: usize,
        bytes: &[u8],
    ) -> Result<Self::Weight, MatMulError>;

    /// A vector of weights (norm weights, biases, gate constants) in the backend's memory.
    fn upload(&self, values: &[f32]) -> Self::Vec;

    /// Packs a matrix stored in one of kasoku's formats (`quant::kasoku`; its parts already
    /// checked against its spec by the view).
    fn pack_kasoku(&self, q: QuantizedView<'_>) -> Self::Weight;

    /// `y[r][j] = Σ_c x[r][c] · W[j][c]` for every row `r < n` ([`MatMul`]).
    fn matmul(&self, args: MatMul<'_, Self>);

    /// Several products over the same rows in one job ([`MatMulMany`]); each output as
    /// [`Backend::matmul`] of its matrix alone gives it.
    fn matmul_many(&self, args: MatMulMany<'_, '_, Self>);

    /// Whether one fused epilogue can prepare its rows for every matrix of `ws` at once
    /// ([`Backend::fused`], then [`Backend::matmul_prepared`]); when not, callers write f32
    /// rows and call [`Backend::matmul`]. The answer depends only on the matrices and the
    /// process's settings (the CPU: all in kasoku's formats with one rotation and width, and
    /// `KASOKU_UNFUSED` unset).
    fn can_prepare(&self, ws: &[&Self::Weight]) -> bool;

    /// An epilogue (RMSNorm, SwiGLU, attention) that writes its rows prepared for the
    /// products of [`Fused::w`] instead of as f32 rows ([`Fused`]).
    fn fused(&self, args: Fused<'_, '_, '_, Self>);

    /// Products of rows a fused epilogue prepared ([`MatMulPrepared`]): each output as
    /// [`Backend::matmul`] of the epilogue's f32 rows gives it (on the CPU, bit for bit).
    fn matmul_prepared(&self, args: MatMulPrepared<'_, '_, Self>);

    /// [`Backend::matmul`] whose result comes back to the host ([`Logits`]): the LM head.
    fn logits(&self, args: Logits<'_, Self>);

    /// Rows of `width` values from one buffer into another ([`CopyRows`]).
    fn copy(&self, args: CopyRows<'_, Self::Buffer, Self::Buffer>);

    /// Rows of a buffer to the host (results a caller asked for: hidden states, layer taps).
    fn read(&self, args: CopyRows<'_, Self::Buffer, [f32]>);

    /// Rows from the host into a buffer (inputs: a drafter's hidden states).
    fn write(&self, args: CopyRows<'_, [f32], Self::Buffer>);

    /// Rows of an embedding table ([`Gather`]), as f32.
    fn gather(&self, args: Gather<'_, Self>);

    /// RMSNorm of each row ([`Norm`]).
    fn rmsnorm(&self, args: Norm<'_, Self>);

    /// RMSNorm of each row in place ([`NormInPlace`]; per-head q/k norms, Gated DeltaNet's
    /// output norm).
    fn rmsnorm_inplace(&self, args: NormInPlace<'_, Self>);

    /// Rotary embedding of each head of each row at its position ([`RopeArgs`]), in place.
    fn rope(&self, args: RopeArgs<'_, Self>);

    /// The element-wise activations ([`Activation`]).
    fn activation(&self, args: Activation<'_, Self>);

    /// Causal grouped-query attention of new rows over a KV cache, as a chain or as the nodes
    /// of a token tree ([`Attend`]).
    fn attention(&self, args: Attend<'_, '_, Self>);

    /// Gated DeltaNet's recurrence over a chain (advancing the state), over the nodes of a
    /// tree (the state read only), or the replay of one accepted node ([`DeltaNet`]).
    fn gated_delta(&self, args: DeltaNet<'_, Self>);

    /// The causal depthwise conv + SiLU of Gated DeltaNet over a chain (advancing the state),
    /// over a tree (the state read only), or the commit of a tree path ([`Conv`]).
    fn conv1d(&self, args: Conv<'_, Self>);
}

/// A matrix product: `y = x · Wᵀ` for `n` rows.
pub struct MatMul<'a, B: Backend> {
    /// `rows × cols`.
    pub w: &'a B::Weight,
    /// `n × cols`.
    pub x: &'a B::Buffer,
    /// Rows of `x`.
    pub n: usize,
    /// `n × rows`, overwritten.
    pub y: &'a mut B::Buffer,
}

/// What model code reads of a packed matrix (shapes, and for traces its format and size).
pub trait WeightInfo {
    /// Output rows.
    fn rows(&self) -> usize;
    /// Values per row.
    fn cols(&self) -> usize;
    /// The format it was packed from.
    fn format(&self) -> WeightFormat;
    /// Bytes one product reads.
    fn size_bytes(&self) -> usize;
}

/// One attention layer's KV cache on backend `B`: rows of keys and values per position,
/// appended by a pass, cut back, or compacted to a verified tree path.
pub trait KvStore<B: Backend>: Clone + std::fmt::Debug + Send + Sync {
    /// Positions held.
    fn len(&self) -> usize;
    /// Whether it holds no position.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Values per position over all heads.
    fn kv_dim(&self) -> usize;
    /// Bytes the stored rows take.
    fn bytes(&self) -> usize;
    /// Room for `positions` rows in all, so that appending up to there allocates nothing.
    fn reserve(&mut self, positions: usize);
    /// Appends rows given position-major (`[position][kv_head][head_dim]`).
    fn append(&mut self, keys: &B::Buffer, values: &B::Buffer);
    /// Keeps the first `len` positions.
    fn truncate(&mut self, len: usize);
    /// After rows appended at `base`, keeps only rows `base + accepted[i]` at `base + i`.
    fn commit(&mut self, base: usize, accepted: &[usize]);
    /// Runs `f` over the stored keys and values, as [`Backend::attention`] reads them.
    fn with_heads<R>(&self, f: impl for<'k> FnOnce(B::Kv<'k>, B::Kv<'k>) -> R) -> R;
}

/// `y = x · Wᵀ` for `n` rows, `y` on the host.
pub struct Logits<'a, B: Backend> {
    /// `rows × cols`.
    pub w: &'a B::Weight,
    /// `n × cols`.
    pub x: &'a B::Buffer,
    /// Rows of `x`.
    pub n: usize,
    /// `n × rows`, overwritten.
    pub y: &'a mut [f32],
}

/// `rows` rows of `width` values: row `r` of `src` starts at `src_at + r · src_stride`, of
/// `dst` at `dst_at + r · dst_stride`.
pub struct CopyRows<'a, S: ?Sized, D: ?Sized> {
    /// Read.
    pub src: &'a S,
    /// First value read.
    pub src_at: usize,
    /// Values from one source row to the next.
    pub src_stride: usize,
    /// Written.
    pub dst: &'a mut D,
    /// First value written.
    pub dst_at: usize,
    /// Values from one destination row to the next.
    pub dst_stride: usize,
    /// Rows.
    pub rows: usize,
    /// Values per row.
    pub width: usize,
}

impl<'a, S: ?Sized + Buf, D: ?Sized> CopyRows<'a, S, D> {
    /// All of `src` into the start of `dst`.
    pub fn whole(src: &'a S, dst: &'a mut D) -> Self {
        CopyRows {
            src,
            src_at: 0,
            src_stride: 0,
            dst,
            dst_at: 0,
            dst_stride: 0,
            rows: 1,
            width: src.len(),
        }
    }
}

/// Products of several matrices (of equal `cols`) with the same `n` rows.
pub struct MatMulMany<'a, 'b, B: Backend> {
    /// The matrices.
    pub ws: &'a [&'a B::Weight],
    /// `n × cols`.
    pub x: &'a B::Buffer,
    /// Rows of `x`.
    pub n: usize,
    /// One output per matrix, `n × rows` each, overwritten.
    pub ys: &'a mut [&'b mut B::Buffer],
}

/// What a backend's [`Backend::Prepared`] rows must offer.
pub trait PreparedRows: Default + Send + Sync + std::fmt::Debug {
    /// Bytes held.
    fn bytes(&self) -> usize;
}

/// Products of several matrices with the same `n` rows, prepared for them by a fused epilogue
/// (every matrix accepted together by [`Backend::can_prepare`] with the epilogue's).
pub struct MatMulPrepared<'a, 'b, B: Backend> {
    /// The matrices.
    pub ws: &'a [&'a B::Weight],
    /// The prepared rows.
    pub x: &'a B::Prepared,
    /// Rows of `x`.
    pub n: usize,
    /// One output per matrix, `n × rows` each, overwritten.
    pub ys: &'a mut [&'b mut B::Buffer],
}

/// An epilogue writing its rows prepared for products ([`Backend::fused`]).
pub struct Fused<'a, 'b, 'k, B: Backend + 'k> {
    /// A matrix the rows are for (its columns are the rows' width); they serve every matrix
    /// that [`Backend::can_prepare`] accepts together with it.
    pub w: &'a B::Weight,
    /// What computes the rows.
    pub epilogue: Epilogue<'a, 'k, B>,
    /// Overwritten.
    pub out: &'b mut B::Prepared,
}

/// The computations a [`Fused`] call can end with.
pub enum Epilogue<'a, 'k, B: Backend + 'k> {
    /// RMSNorm of the rows of `x` (as [`Norm`]).
    RmsNorm {
        /// The rows.
        x: &'a B::Buffer,
        /// One weight per value of a row.
        weight: &'a B::Buffer,
        /// Added to the mean square.
        eps: f32,
    },
    /// `silu(gate) · up` (as [`Activation::SwiGlu`]); `gate` is left as it is.
    SwiGlu {
        /// The gate projection.
        gate: &'a B::Buffer,
        /// The up projection.
        up: &'a B::Buffer,
    },
    /// Attention's output rows (as [`Attend`], without its `out`).
    Attention {
        /// Head counts and size.
        geo: AttnGeometry,
        /// `n × n_heads × head_dim` queries.
        q: &'a B::Buffer,
        /// The cache's keys, the new rows' included.
        keys: B::Kv<'k>,
        /// The cache's values, as the keys.
        values: B::Kv<'k>,
        /// Committed positions before the new rows.
        past: usize,
        /// The scores' factor.
        scale: f32,
        /// `None`: a chain; else the rows are nodes of a token tree.
        tree: Option<TreeRows<'a>>,
    },
}

/// RMSNorm of the rows of `x` (rows of `weight.len()` values) in place.
pub struct NormInPlace<'a, B: Backend> {
    /// The rows, normalised in place.
    pub x: &'a mut B::Buffer,
    /// One weight per value of a row.
    pub weight: &'a B::Buffer,
    /// Added to the mean square.
    pub eps: f32,
}

/// An embedding table as stored.
#[derive(Clone, Copy)]
pub enum Table<'a> {
    /// A GGUF element type (or float safetensors), row by row.
    Raw {
        /// The element type.
        dtype: DType,
        /// The rows.
        bytes: &'a [u8],
    },
    /// One of kasoku's formats; a row is dequantized and, when rotated, rotated back.
    Kasoku {
        /// The quantized rows.
        view: QuantizedView<'a>,
        /// The rotation's signs, when the table is rotated.
        signs: Option<&'a Signs>,
    },
}

/// An embedding gather: row `tokens[i]` of a `vocab × dim` table into row `i` of `out`.
pub struct Gather<'a, B: Backend> {
    /// The stored table.
    pub table: Table<'a>,
    /// Values per row.
    pub dim: usize,
    /// Row ids (each below the table's row count).
    pub tokens: &'a [u32],
    /// `tokens.len() × dim`, overwritten.
    pub out: &'a mut B::Buffer,
}

/// RMSNorm: `out[r] = x[r] / sqrt(mean(x[r]²) + eps) · weight`, rows of `weight.len()`.
pub struct Norm<'a, B: Backend> {
    /// The rows.
    pub x: &'a B::Buffer,
    /// One weight per value of a row.
    pub weight: &'a B::Buffer,
    /// Added to the mean square.
    pub eps: f32,
    /// Same length as `x`, overwritten.
    pub out: &'a mut B::Buffer,
}

/// RoPE of `x` (`positions.len()` rows of `heads × rope.head_dim`) in place.
pub struct RopeArgs<'a, B: Backend> {
    /// Frequencies, layout and rotated dims.
    pub rope: &'a Rope,
    /// Heads per row.
    pub heads: usize,
    /// Each row's position.
    pub positions: &'a [usize],
    /// The rows.
    pub x: &'a mut B::Buffer,
}

/// An element-wise activation.
pub enum Activation<'a, B: Backend> {
    /// `gate[i] = silu(gate[i]) · up[i]`.
    SwiGlu {
        /// In: the gate projection; out: the product.
        gate: &'a mut B::Buffer,
        /// The up projection.
        up: &'a B::Buffer,
    },
    /// `x[i] = x[i] · sigmoid(gate[i])`.
    SigmoidGate {
        /// The values gated in place.
        x: &'a mut B::Buffer,
        /// The gate.
        gate: &'a B::Buffer,
    },
    /// `x[i] = x[i] · silu(gate[i])` (Gated DeltaNet's output gate).
    SiluGate {
        /// The values gated in place.
        x: &'a mut B::Buffer,
        /// The gate.
        gate: &'a B::Buffer,
    },
    /// `x[i] += d[i]` (the residual stream).
    Add {
        /// The sum, in place.
        x: &'a mut B::Buffer,
        /// What is added.
        d: &'a B::Buffer,
    },
    /// `x[r][j] += bias[j]` for every row `r` (projection biases).
    AddBias {
        /// Rows of `bias.len()` values, in place.
        x: &'a mut B::Buffer,
        /// One value per column.
        bias: &'a B::Buffer,
    },
    /// Each `dim`-vector of `x` scaled to unit l2 norm (`x · rsqrt(Σx² + 1e-6)`), times
    /// `scale` (Gated DeltaNet's q and k).
    L2Norm {
        /// The vectors, in place.
        x: &'a mut B::Buffer,
        /// Values per vector.
        dim: usize,
        /// The factor after normalising.
        scale: f32,
    },
}

/// One attention call (see `kernels::attention::attend`).
pub struct Attend<'a, 'k, B: Backend + 'k> {
    /// Head counts and size.
    pub geo: AttnGeometry,
    /// `n × n_heads × head_dim` queries.
    pub q: &'a B::Buffer,
    /// The cache's keys, the new rows' included.
    pub keys: B::Kv<'k>,
    /// The cache's values, as the keys.
    pub values: B::Kv<'k>,
    /// Committed positions before the new rows.
    pub past: usize,
    /// The scores' factor.
    pub scale: f32,
    /// `None`: a chain (row `i` at `past + i`); else the rows are nodes of a token tree.
    pub tree: Option<TreeRows<'a>>,
    /// `n × n_heads × head_dim`, overwritten.
    pub out: &'a mut B::Buffer,
}

/// The prepared inputs of Gated DeltaNet for `n` rows (see `kernels::gated_delta`).
pub struct DeltaInputs<'a, B: Backend> {
    /// `n × nk × dk`, l2-normalised and scaled.
    pub q: &'a B::Buffer,
    /// `n × nk × dk`, l2-normalised.
    pub k: &'a B::Buffer,
    /// `n × nv × dv`.
    pub v: &'a B::Buffer,
    /// `n × nv` log-decays.
    pub g: &'a B::Buffer,
    /// `n × nv` update strengths.
    pub beta: &'a B::Buffer,
}

/// A Gated DeltaNet call.
pub enum DeltaNet<'a, B: Backend> {
    /// `n` rows in order: `state` (`nv × dk × dv`) advances, `out` gets every row's output.
    Chain {
        /// Head counts and sizes.
        dims: GdnDims,
        /// The rows' inputs.
        inputs: DeltaInputs<'a, B>,
        /// Rows.
        n: usize,
        /// The recurrent state, advanced.
        state: &'a mut B::Buffer,
        /// `n × nv × dv`, overwritten.
        out: &'a mut B::Buffer,
    },
    /// The nodes of a tree, each from the committed `state` along its own path.
    Tree {
        /// Head counts and sizes.
        dims: GdnDims,
        /// The nodes' inputs.
        inputs: DeltaInputs<'a, B>,
        /// Each node's parent (earlier), `usize::MAX` for a root.
        parents: &'a [usize],
        /// The committed state, read only.
        state: &'a B::Buffer,
        /// `n × nv × dv` outputs, overwritten.
        out: &'a mut B::Buffer,
        /// `n × nv × dv` deltas for [`DeltaNet::Replay`], overwritten.
        deltas: &'a mut B::Buffer,
    },
    /// The gates of `n` rows from the projections `a`, `b` (`n × nv` each):
    /// `g = ssm_a · softplus(a + dt_bias)` and `β = sigmoid(b)`, per value head.
    Gates {
        /// `n × nv` alpha projections.
        a: &'a B::Buffer,
        /// `n × nv` beta projections.
        b: &'a B::Buffer,
        /// `−exp(A_log)` per value head.
        ssm_a: &'a B::Buffer,
        /// Per value head.
        dt_bias: &'a B::Buffer,
        /// `n × nv` log-decays, overwritten.
        g: &'a mut B::Buffer,
        /// `n × nv` strengths, overwritten.
        beta: &'a mut B::Buffer,
    },
    /// `S ← e^g · S + k ⊗ δ` for one accepted node.
    Replay {
        /// Head counts and sizes.
        dims: GdnDims,
        /// The state, advanced.
        state: &'a mut B::Buffer,
        /// The node's key (`nk × dk`).
        k: &'a B::Buffer,
        /// The node's log-decays (`nv`).
        g: &'a B::Buffer,
        /// The node's deltas (`nv × dv`).
        delta: &'a B::Buffer,
    },
}

/// A Gated DeltaNet conv call (`K` taps per channel, tap-major; the state holds the last
/// `K − 1` inputs, oldest first).
pub enum Conv<'a, B: Backend> {
    /// `n` rows in order; the state advances.
    Chain {
        /// The taps.
        taps: &'a crate::kernels::conv1d::ConvTaps,
        /// `(K − 1) × channels`, advanced.
        state: &'a mut B::Buffer,
        /// `n × channels` inputs.
        x: &'a B::Buffer,
        /// Rows.
        n: usize,
        /// `n × channels`, overwritten.
        y: &'a mut B::Buffer,
    },
    /// The nodes of a tree, each over its own path; the state is read only.
    Tree {
        /// The taps.
        taps: &'a crate::kernels::conv1d::ConvTaps,
        /// `(K − 1) × channels`.
        state: &'a B::Buffer,
        /// `n × channels` inputs.
        x: &'a B::Buffer,
        /// Each node's parent (earlier), `usize::MAX` for a root.
        parents: &'a [usize],
        /// `n × channels`, overwritten.
        y: &'a mut B::Buffer,
    },
    /// The state after the tree path ending at `node`: its last `K − 1` inputs.
    Commit {
        /// The taps.
        taps: &'a crate::kernels::conv1d::ConvTaps,
        /// Replaced.
        state: &'a mut B::Buffer,
        /// The tree's `n × channels` inputs.
        x: &'a B::Buffer,
        /// The tree's parents.
        parents: &'a [usize],
        /// The path's last node.
        node: usize,
    },
}
