//! A decoder on the GPU (llama, qwen2, qwen3, and Qwen3.5's hybrid of Gated DeltaNet and
//! gated attention layers): weights uploaded once from the GGUF's memory map, a KV cache of
//! f16 for the attention layers (recurrent and conv states in f32 for the Gated DeltaNet ones,
//! `model/delta_net.rs`), and forward passes that run as one CUDA graph per batch size, so a
//! decode step or a whole draft tree costs one launch and one synchronisation.
//!
//! ```text
//! x = embed(tokens)
//! per layer: h = norm(x)
//!            attention: q,k,v = h·[Wq|Wk|Wv]ᵀ (+bias); per-head norm, RoPE, cache write;
//!                       a = attention(q) (· sigmoid(h·Wgᵀ), Qwen3.5's gate); x += a·Woᵀ
//!            Gated DeltaNet (Qwen3.5): x += delta_net(h)
//!            h = norm(x);  x += (silu(h·Wgᵀ) · h·Wuᵀ)·Wdᵀ
//! logits = norm(x)·Headᵀ;  ids = argmax(logits)
//! ```
//! A pass describes its rows on the device (`BatchDesc`, tokens, positions, tree paths), filled
//! by a copy from pinned memory captured into the graph; the ids come back the same way.
//! Verification places tree node `i` at `len + depth(i)` and writes its keys and values at
//! slot `len + i`; [`CudaState::commit`] moves the accepted path's slots into place and
//! replays its recurrent updates.
//!
//! Here: loading, the per-sequence state and its entry points (prefill, step, verify,
//! commit). `pass.rs` records and runs a pass, `taps.rs` holds what a pass leaves for
//! drafters (tapped layers, a cheaper head), `delta_net.rs` Qwen3.5's recurrent layers,
//! `profile.rs` per-part timings and `generate.rs` whole generations for the checks.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use kasoku::format::gguf::GgufFile;
use kasoku::format::RawTensor;
use kasoku::kernels::rope::Rope;
use kasoku::model::{Arch, LayerKind, ModelConfig, TokenTree};
use kasoku::quant::dequantize;

use crate::kernels::{
    argmax_id, attention_chunks, gemm_part_bytes, gemm_scratch_bytes, Acts, AttnCall, BatchDesc,
    DeviceMatrix, GemmScratch, GemmTile, GluTail, Kernels, KvCommit, MatSeg, NormTail, PostArgs,
    QkvPost, GEMM_MAX_SPLITS, MAX_TOP_K,
};
use crate::runtime::{DeviceBuffer, Error, Gpu, Graph, PinnedBuffer, Result};

/// Rows of one prefill pass (longer prompts run in passes of this many). 512: the prefill
/// GEMM expands each weight matrix to f16 once per pass, so longer passes pay it less often
/// (the attention partials, sized rows × heads × chunks, grow with it).
pub const PREFILL_ROWS: usize = 512;
/// Nodes of a verified tree at most (and rows of a graph-captured pass).
pub const MAX_TREE: usize = 64;
/// Rows of a pass up to which each RMSNorm runs in the residual product before it (its last
/// block normalizes the rows one after another; more rows take the rmsnorm kernel).
pub const NORM_FUSE_ROWS: usize = 4;

mod delta_net;
mod generate;
mod pass;
mod profile;
mod taps;
pub use delta_net::shape_of as gdn_shape;
use delta_net::{DeltaNetLayer, DeltaNetState};
pub use generate::{generate_greedy, generate_plain, generate_speculative, Drafting, SpecRun};

/// One layer: its norm, token mixer, and MLP.
struct Layer {
    attn_norm: DeviceBuffer,
    mixer: Mixer,
    /// The norm before the MLP (`ffn_norm`; Qwen3.5's `post_attention_norm`).
    ffn_norm: DeviceBuffer,
    gate: DeviceMatrix,
    up: DeviceMatrix,
    down: DeviceMatrix,
}

/// A layer's token mixer.
enum Mixer {
    Attention(Attention),
    /// Qwen3.5's linear-attention layers (`model/delta_net.rs`); the index among them.
    DeltaNet(DeltaNetLayer, usize),
}

/// An attention layer's weights.
struct Attention {
    /// The query rows of `attn_q` (Qwen3.5: without its gate rows).
    wq: DeviceMatrix,
    wk: DeviceMatrix,
    wv: DeviceMatrix,
    bq: Option<DeviceBuffer>,
    bk: Option<DeviceBuffer>,
    bv: Option<DeviceBuffer>,
    q_norm: Option<DeviceBuffer>,
    k_norm: Option<DeviceBuffer>,
    wo: DeviceMatrix,
    /// Qwen3.5's output gate: the gate rows of `attn_q` (per head, the `head_dim` rows after
    /// its query rows), applied as `sigmoid(h·Wgᵀ)` to the attention output.
    wg: Option<DeviceMatrix>,
    /// Its KV cache among the attention layers'.
    cache: usize,
}

impl Layer {
    /// The attention weights (none for other mixers).
    fn attention(&self) -> Option<&Attention> {
        match &self.mixer {
            Mixer::Attention(a) => Some(a),
            Mixer::DeltaNet(..) => None,
        }
    }

    /// The matrices of the layer's first product (what the product before prefetches).
    fn first_matrices(&self) -> Vec<&DeviceMatrix> {
        match &self.mixer {
            Mixer::Attention(a) => vec![&a.wq, &a.wk, &a.wv],
            Mixer::DeltaNet(d, _) => d.first_matrices(),
        }
    }

    /// The attention and MLP matrices, to give them their packed copies at load (a Gated
    /// DeltaNet layer's in-projections keep their GGUF layout).
    fn matrices_mut(&mut self) -> Vec<&mut DeviceMatrix> {
        let mut v = match &mut self.mixer {
            Mixer::Attention(a) => {
                let mut v = vec![&mut a.wq, &mut a.wk, &mut a.wv, &mut a.wo];
                v.extend(a.wg.as_mut());
                v
            }
            Mixer::DeltaNet(..) => Vec::new(),
        };
        v.extend([&mut self.gate, &mut self.up, &mut self.down]);
        v
    }

    /// Every matrix a decode step reads.
    fn matrices(&self) -> Vec<&DeviceMatrix> {
        let mut v = match &self.mixer {
            Mixer::Attention(a) => {
                let mut v = vec![&a.wq, &a.wk, &a.wv, &a.wo];
                v.extend(&a.wg);
                v
            }
            Mixer::DeltaNet(d, _) => d.matrices(),
        };
        v.extend([&self.gate, &self.up, &self.down]);
        v
    }
}

/// A model's weights on one GPU.
pub struct CudaModel {
    pub config: ModelConfig,
    pub kernels: Kernels,
    embed: DeviceMatrix,
    layers: Vec<Layer>,
    output_norm: DeviceBuffer,
    /// `output.weight`, or the embedding table itself when tied (not a second copy).
    head: Option<DeviceMatrix>,
    inv_freq: DeviceBuffer,
    /// Bytes of weights a decode step reads (every matrix once, the embedding row aside).
    pub weight_bytes: usize,
    /// Device bytes of the packed copies made at load (`Kernels::pack_planned`), beside the
    /// GGUF bytes.
    pub packed_bytes: usize,
    /// Attention layers (each with a KV cache) and Gated DeltaNet layers (each with a
    /// recurrent and a conv state).
    pub attn_layers: usize,
    pub gdn_layers: usize,
}

fn tensor(file: &GgufFile, name: &str) -> Result<RawTensor> {
    file.tensor(name)
        .ok_or_else(|| Error::Invalid(format!("{}: no tensor {name}", file.path().display())))
}

fn matrix(
    gpu: &Arc<Gpu>,
    file: &GgufFile,
    name: &str,
    rows: usize,
    cols: usize,
) -> Result<DeviceMatrix> {
    let t = tensor(file, name)?;
    if t.shape != [rows, cols] {
        return Err(Error::Invalid(format!(
            "{name}: shape {:?}, expected [{rows}, {cols}]",
            t.shape
        )));
    }
    DeviceMatrix::upload(gpu, t.dtype, rows, cols, t.data.as_slice())
        .map_err(|e| Error::Invalid(format!("{name}: {e}")))
}

fn vector_f32(file: &GgufFile, name: &str, len: usize) -> Result<Vec<f32>> {
    let t = tensor(file, name)?;
    if t.numel() != len {
        return Err(Error::Invalid(format!(
            "{name}: {} values, expected {len}",
            t.numel()
        )));
    }
    let mut v = vec![0f32; len];
    if t.dtype.bytes_for(len) != Some(t.data.len()) {
        return Err(Error::Invalid(format!("{name}: bad size")));
    }
    dequantize(t.dtype, t.data.as_slice(), &mut v);
    Ok(v)
}

fn vector(gpu: &Arc<Gpu>, file: &GgufFile, name: &str, len: usize) -> Result<DeviceBuffer> {
    gpu.upload_f32(&vector_f32(file, name, len)?)
}

/// An RMSNorm weight vector: `w`, or `1 + w` where the checkpoint stores Qwen3.5's
/// zero-centred norms unfolded (`norm_offset_one`; GGUF converters fold the 1 in).
fn norm_vector(
    gpu: &Arc<Gpu>,
    file: &GgufFile,
    name: &str,
    len: usize,
    offset_one: bool,
) -> Result<DeviceBuffer> {
    let mut v = vector_f32(file, name, len)?;
    if offset_one {
        v.iter_mut().for_each(|w| *w += 1.0);
    }
    gpu.upload_f32(&v)
}

/// The rows of a matrix stored as, per head, `head_dim` query rows then `head_dim` gate rows
/// (`row_bytes` each): (every query row, every gate row), in order.
pub fn query_and_gate_rows(bytes: &[u8], row_bytes: usize, head_dim: usize) -> (Vec<u8>, Vec<u8>) {
    let (mut query, mut gate) = (Vec::new(), Vec::new());
    for (r, row) in bytes.chunks_exact(row_bytes).enumerate() {
        if (r / head_dim).is_multiple_of(2) {
            query.extend_from_slice(row);
        } else {
            gate.extend_from_slice(row);
        }
    }
    (query, gate)
}

/// Qwen3.5's `attn_q`: per head `head_dim` query rows then `head_dim` gate rows. Returns the
/// query rows and the gate rows as two matrices (each `n_heads·head_dim × hidden`).
fn split_query_gate(
    gpu: &Arc<Gpu>,
    file: &GgufFile,
    name: &str,
    c: &ModelConfig,
) -> Result<(DeviceMatrix, DeviceMatrix)> {
    let (hd, q_dim) = (c.head_dim, c.n_heads * c.head_dim);
    let t = tensor(file, name)?;
    if t.shape != [2 * q_dim, c.hidden] {
        return Err(Error::Invalid(format!(
            "{name}: shape {:?}, expected [{}, {}] (query and gate rows)",
            t.shape,
            2 * q_dim,
            c.hidden
        )));
    }
    let row_bytes = crate::kernels::check_matrix(t.dtype, 2 * q_dim, c.hidden, t.data.len())?;
    let (query, gate) = query_and_gate_rows(t.data.as_slice(), row_bytes, hd);
    let up = |b: &[u8]| {
        DeviceMatrix::upload(gpu, t.dtype, q_dim, c.hidden, b)
            .map_err(|e| Error::Invalid(format!("{name}: {e}")))
    };
    Ok((up(&query)?, up(&gate)?))
}

impl CudaModel {
    /// Loads a GGUF file onto `gpu`: dense attention models (llama, qwen2, qwen3) and Qwen3.5
    /// hybrids (Gated DeltaNet and gated attention layers; its MTP head is not loaded); others
    /// are an `Invalid` error naming what is missing.
    pub fn load(gpu: &Arc<Gpu>, path: impl AsRef<Path>) -> Result<CudaModel> {
        let path = path.as_ref();
        let file = GgufFile::open(path).map_err(|e| Error::Invalid(e.to_string()))?;
        let config = ModelConfig::from_gguf(&file).map_err(|e| Error::Invalid(e.to_string()))?;
        check_config(&config)?;
        let kernels = Kernels::new(gpu)?;
        let c = &config;
        let (h, hd) = (c.hidden, c.head_dim);
        let (q_dim, kv_dim) = (c.n_heads * hd, c.n_kv_heads * hd);
        let mut embed = matrix(gpu, &file, "token_embd.weight", c.vocab, h)?;
        let mut layers = Vec::with_capacity(c.n_layers);
        let (mut attn_layers, mut gdn_layers) = (0, 0);
        let one = c.norm_offset_one;
        for i in 0..c.n_layers {
            let n = |s: &str| format!("blk.{i}.{s}");
            let bias = |s: &str, len| -> Result<Option<DeviceBuffer>> {
                if c.qkv_bias {
                    vector(gpu, &file, &n(s), len).map(Some)
                } else {
                    Ok(None)
                }
            };
            let qk = |s: &str| -> Result<Option<DeviceBuffer>> {
                if c.qk_norm {
                    norm_vector(gpu, &file, &n(s), hd, one).map(Some)
                } else {
                    Ok(None)
                }
            };
            let mixer = match c.layer_kinds[i] {
                LayerKind::GatedDeltaNet => {
                    gdn_layers += 1;
                    Mixer::DeltaNet(DeltaNetLayer::load(gpu, &file, c, i)?, gdn_layers - 1)
                }
                LayerKind::Attention => {
                    let (wq, wg) = if c.attn_output_gate {
                        let (q, g) = split_query_gate(gpu, &file, &n("attn_q.weight"), c)?;
                        (q, Some(g))
                    } else {
                        (matrix(gpu, &file, &n("attn_q.weight"), q_dim, h)?, None)
                    };
                    attn_layers += 1;
                    Mixer::Attention(Attention {
                        wq,
                        wk: matrix(gpu, &file, &n("attn_k.weight"), kv_dim, h)?,
                        wv: matrix(gpu, &file, &n("attn_v.weight"), kv_dim, h)?,
                        bq: bias("attn_q.bias", q_dim)?,
                        bk: bias("attn_k.bias", kv_dim)?,
                        bv: bias("attn_v.bias", kv_dim)?,
                        q_norm: qk("attn_q_norm.weight")?,
                        k_norm: qk("attn_k_norm.weight")?,
                        wo: matrix(gpu, &file, &n("attn_output.weight"), h, q_dim)?,
                        wg,
                        cache: attn_layers - 1,
                    })
                }
            };
            let ffn_norm = if c.arch == Arch::Qwen35 {
                "post_attention_norm.weight"
            } else {
                "ffn_norm.weight"
            };
            layers.push(Layer {
                attn_norm: norm_vector(gpu, &file, &n("attn_norm.weight"), h, one)?,
                mixer,
                ffn_norm: norm_vector(gpu, &file, &n(ffn_norm), h, one)?,
                gate: matrix(gpu, &file, &n("ffn_gate.weight"), c.ffn, h)?,
                up: matrix(gpu, &file, &n("ffn_up.weight"), c.ffn, h)?,
                down: matrix(gpu, &file, &n("ffn_down.weight"), h, c.ffn)?,
            });
        }
        let output_norm = norm_vector(gpu, &file, "output_norm.weight", h, one)?;
        let mut head = if file.tensor_info("output.weight").is_some() {
            Some(matrix(gpu, &file, "output.weight", c.vocab, h)?)
        } else {
            None
        };
        // The fragment-order copies of the matrices the tensor-core plan takes, if this
        // process packs them (kernels::packed_asked).
        let mut packed_bytes = 0;
        for l in &mut layers {
            for m in l.matrices_mut() {
                kernels.pack_planned(m)?;
                packed_bytes += m.packed.as_ref().map_or(0, |p| p.len());
            }
        }
        let head_matrix = head.as_mut().unwrap_or(&mut embed);
        kernels.pack_planned(head_matrix)?;
        packed_bytes += head_matrix.packed.as_ref().map_or(0, |p| p.len());
        let freq_factors = if file.tensor_info("rope_freqs.weight").is_some() {
            Some(vector_f32(&file, "rope_freqs.weight", c.rope_dim / 2)?)
        } else {
            None
        };
        let rope = Rope::new(
            hd,
            c.rope_dim,
            c.rope_theta,
            c.rope_layout,
            &c.rope_scaling,
            freq_factors.as_deref(),
        );
        let inv: Vec<f32> = rope.inv_freq().iter().map(|&f| f as f32).collect();
        let inv_freq = gpu.upload_f32(&inv)?;
        let mut weight_bytes = head.as_ref().unwrap_or(&embed).buf.len();
        for l in &layers {
            for m in l.matrices() {
                weight_bytes += m.buf.len();
            }
        }
        gpu.synchronize()?;
        Ok(CudaModel {
            config,
            kernels,
            embed,
            layers,
            output_norm,
            head,
            inv_freq,
            weight_bytes,
            packed_bytes,
            attn_layers,
            gdn_layers,
        })
    }

    /// The LM head (`output.weight`, or the embedding table when tied).
    pub(crate) fn head(&self) -> &DeviceMatrix {
        self.head.as_ref().unwrap_or(&self.embed)
    }

    /// The token embedding table.
    pub(crate) fn embed_table(&self) -> &DeviceMatrix {
        &self.embed
    }

    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.kernels.gpu
    }

    /// A state holding up to `max_len` committed positions.
    pub fn new_state(&self, max_len: usize) -> Result<CudaState> {
        CudaState::new(self, max_len)
    }
}

/// What this backend runs: attention layers (plain, or Qwen3.5's gated ones) and Qwen3.5's
/// Gated DeltaNet layers, at widths the kernels take.
pub fn check_config(c: &ModelConfig) -> Result<()> {
    if c.arch != Arch::Qwen35 && c.layer_kinds.iter().any(|k| *k != LayerKind::Attention) {
        return Err(Error::Invalid(format!(
            "{:?}: Gated DeltaNet layers run on the GPU only in Qwen3.5 models",
            c.arch
        )));
    }
    if c.attn_output_gate && c.qkv_bias {
        return Err(Error::Invalid(
            "gated attention with q/k/v biases is not implemented on the GPU".into(),
        ));
    }
    if c.layer_kinds.contains(&LayerKind::GatedDeltaNet) {
        let s = gdn_shape(c);
        s.check()?;
        if !s.value_dim().is_multiple_of(32) {
            return Err(Error::Invalid(format!(
                "Gated DeltaNet value width {} (nv·dv): the GPU kernels need a multiple of 32",
                s.value_dim()
            )));
        }
    }
    let widths = [c.hidden, c.n_heads * c.head_dim, c.ffn];
    if widths.iter().any(|w| !w.is_multiple_of(32)) || !c.head_dim.is_multiple_of(8) {
        return Err(Error::Invalid(format!(
            "hidden {}, attention width {}, FFN {}, head {}: the GPU kernels need multiples of 32 \
             (heads: of 8)",
            c.hidden,
            c.n_heads * c.head_dim,
            c.ffn,
            c.head_dim
        )));
    }
    if c.head_dim > crate::kernels::MAX_HEAD_DIM
        || c.n_kv_heads == 0
        || !c.n_heads.is_multiple_of(c.n_kv_heads)
    {
        return Err(Error::Invalid(format!(
            "attention geometry {} heads / {} kv heads of {}",
            c.n_heads, c.n_kv_heads, c.head_dim
        )));
    }
    Ok(())
}

/// Checks a list of decoder layers to record: each below `n_layers` (a layer may come twice:
/// its rows are then copied twice).
pub fn check_tap_layers(layers: &[usize], n_layers: usize) -> Result<()> {
    if let Some(l) = layers.iter().find(|&&l| l >= n_layers) {
        return Err(Error::Invalid(format!(
            "tapped layer {l} of a model of {n_layers} layers"
        )));
    }
    Ok(())
}

/// Whether committing root path `path` leaves every node in the slot it was verified in
/// (node `i` of a tree sits at position `len + i`, so a path `0, 1, 2, ...` does): `kv_commit`
/// would copy nothing.
pub fn stays_in_place(path: &[usize]) -> bool {
    path.iter().enumerate().all(|(i, &node)| i == node)
}

/// `rows` as runs of consecutive values: (index in `rows` of the run's first, the run's range
/// of values), so each run is one copy.
pub fn consecutive_runs(rows: &[usize]) -> Vec<(usize, std::ops::Range<usize>)> {
    let mut runs: Vec<(usize, std::ops::Range<usize>)> = Vec::new();
    for (i, &r) in rows.iter().enumerate() {
        match runs.last_mut() {
            Some((_, run)) if run.end == r => run.end += 1,
            _ => runs.push((i, r..r + 1)),
        }
    }
    runs
}

/// Offsets (in 4-byte words) of the batch description's parts in the meta buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MetaLayout {
    pub tokens: usize,
    pub pos: usize,
    pub path: usize,
    pub words: usize,
}

impl MetaLayout {
    /// For passes of up to `rows` rows and trees of up to [`MAX_TREE`] nodes.
    pub fn new(rows: usize) -> MetaLayout {
        let tokens = 4; // after the 4-word BatchDesc
        let pos = tokens + rows;
        let path = pos + rows;
        let words = path + MAX_TREE * MAX_TREE;
        MetaLayout {
            tokens,
            pos,
            path,
            words,
        }
    }
}

/// Fills the batch description of a pass: rows at positions `past + depth`, chain or tree.
/// Returns the words to copy (the whole layout).
pub fn fill_meta(
    layout: &MetaLayout,
    past: usize,
    tokens: &[u32],
    tree: Option<&TokenTree>,
    out: &mut [u32],
) {
    let n = tokens.len();
    out[..layout.words].iter_mut().for_each(|w| *w = 0);
    let max_depth = tree.map_or(0, |t| t.max_depth());
    let desc = BatchDesc {
        past: past as i32,
        n: n as i32,
        is_chain: tree.is_none() as i32,
        max_depth: max_depth as i32,
    };
    out[0] = desc.past as u32;
    out[1] = desc.n as u32;
    out[2] = desc.is_chain as u32;
    out[3] = desc.max_depth as u32;
    out[layout.tokens..layout.tokens + n].copy_from_slice(tokens);
    for i in 0..n {
        let depth = tree.map_or(i, |t| t.depth(i));
        out[layout.pos + i] = (past + depth) as u32;
    }
    if let Some(t) = tree {
        for i in 0..n {
            for (d, node) in t.path(i).into_iter().enumerate() {
                out[layout.path + i * (max_depth + 1) + d] = node as u32;
            }
        }
    }
}

/// Words of a top-k selection's device buffer: the (id, logit bits) pairs, then the gathered
/// logits, then the ids to gather (the pinned buffer stages the ids and receives the rest).
struct TopLayout;

impl TopLayout {
    const GATHERED: usize = 2 * MAX_TOP_K;
    const IDS: usize = 3 * MAX_TOP_K;
    const WORDS: usize = 4 * MAX_TOP_K;
}

/// Which logits a pass computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Head {
    /// Every row's (verification, decode).
    All,
    /// The last row's (prefill).
    Last,
}

/// One sequence's state on the GPU: its KV cache, the pass buffers, and the graphs captured
/// for it.
pub struct CudaState {
    gpu: Arc<Gpu>,
    /// Committed positions.
    pub len: usize,
    pub max_len: usize,
    max_slots: usize,
    rows: usize,
    chunks: usize,
    kv: DeviceBuffer,
    x: DeviceBuffer,
    normed: DeviceBuffer,
    q: DeviceBuffer,
    k: DeviceBuffer,
    v: DeviceBuffer,
    att: DeviceBuffer,
    g: DeviceBuffer,
    u: DeviceBuffer,
    part_ml: DeviceBuffer,
    part_o: DeviceBuffer,
    arrivals: DeviceBuffer,
    logits: DeviceBuffer,
    /// The int8 blocks of the activations the next product reads (one set, reused).
    xq: DeviceBuffer,
    xs: DeviceBuffer,
    /// The int8 blocks of a fused SwiGLU's result (`fuse_glu`): apart from `xq`/`xs`, which
    /// the gate|up product is still reading while its first groups complete.
    glu_xq: DeviceBuffer,
    glu_xs: DeviceBuffer,
    /// Per head row, its argmax as an ordered key (`kernels::argmax_id`).
    best: DeviceBuffer,
    meta: DeviceBuffer,
    layout: MetaLayout,
    meta_host: PinnedBuffer,
    best_host: PinnedBuffer,
    path_dev: DeviceBuffer,
    path_host: PinnedBuffer,
    /// A top-k selection's buffers ([`TopLayout`]), on the device and pinned on the host.
    top_dev: DeviceBuffer,
    top_host: PinnedBuffer,
    /// One row of logits, pinned: the copy a host-sampled token waits for.
    row_host: PinnedBuffer,
    graphs: HashMap<(usize, Head), Graph>,
    /// The tree of the last verification (until commit).
    pending: Option<TokenTree>,
    /// Whether passes are captured and replayed as graphs (on by default).
    pub use_graphs: bool,
    /// Whether each product prefetches the next product's weights into L2 (off by default:
    /// on the H200 it measured 680 vs 675 and 695 vs 577 t/s without and with it;
    /// `KASOKU_CUDA_PREFETCH=1` turns it on). Results do not change.
    pub prefetch: bool,
    /// Whether a one-row pass runs the q/k/v epilogue inside attention (one kernel less per
    /// layer, the same bits; on by default since an H100 decoded the 1.5B shape at 672
    /// tokens/s with it against 664, `KASOKU_CUDA_FUSE_POST=0` turns it off).
    pub fuse_post: bool,
    /// Whether SwiGLU runs inside the gate|up product (one kernel less per layer, the same
    /// bits; opt-in with `KASOKU_CUDA_FUSE_GLU=1`: on an H100 it decoded the 1.5B shape at
    /// 616 tokens/s against 664 without). Its int8 result goes to `glu_xq`/`glu_xs`, not the
    /// scratch its own input is read from.
    pub fuse_glu: bool,
    /// The fused SwiGLU's per-32-row counts (zero between passes).
    glu_count: DeviceBuffer,
    /// Whether passes of up to [`NORM_FUSE_ROWS`] rows run each RMSNorm inside the residual
    /// product before it (the same bits; opt-in with `KASOKU_CUDA_FUSE_NORM=1`: on an H100 it
    /// decoded the 1.5B shape at 560 tokens/s against 664 without).
    pub fuse_norm: bool,
    /// The fused RMSNorm's block count (zero between passes).
    norm_count: DeviceBuffer,
    /// For measuring only: kernel classes left out of every pass ([`Skip`] bits), so a
    /// benchmark can tell what each class costs inside a captured graph. Results are wrong
    /// while any bit is set.
    pub skip: u32,
    /// Passes of at least this many rows run the layers' products on f16 tensor cores
    /// (`Kernels::gemm`, kernels/gemm.cu) instead of matvec: prefill passes, above
    /// [`MAX_TREE`] by default, so decode and verification keep their batch-invariant bits.
    /// `None` (with `KASOKU_CUDA_GEMM=0`, or on a GPU before compute capability 8.0): never.
    pub gemm_rows: Option<usize>,
    /// The prefill products' f16 scratch (compute capability 8.0 or later).
    gemm_bufs: Option<GemmBufs>,
    /// The Gated DeltaNet layers' states and pass buffers (Qwen3.5).
    delta: Option<DeltaNetState>,
    /// Qwen3.5's attention output gates of a pass (`rows × n_heads·head_dim`).
    attn_gate: Option<DeviceBuffer>,
    /// Token ids whose logits the head computes: `0..head_rows` (the whole vocabulary unless
    /// [`CudaState::set_head_rows`] narrowed it, as a draft model's state does).
    head_rows: usize,
    /// Layer outputs recorded for a drafter ([`CudaState::set_tap_layers`]; none: nothing is
    /// recorded and passes cost what they did).
    taps: Option<TapBufs>,
    /// Rows of the last pass (what `taps` holds).
    last_rows: usize,
}

/// The outputs of chosen decoder layers (before the final norm) for every row of a pass: a
/// DFlash drafter's features. Each pass copies each tapped layer's residual rows device to
/// device right after that layer (a memcpy node in a captured graph); a read compacts the rows
/// asked for on the device and copies them to the host once.
struct TapBufs {
    /// The tapped layers, in the order their outputs are concatenated.
    layers: Vec<usize>,
    /// `[row][tap][hidden]` f32 of the last pass.
    rows: DeviceBuffer,
    /// The rows a read asked for, compacted (same layout), and their host copy.
    picked: DeviceBuffer,
    host: PinnedBuffer,
    /// Where `rows` is, for a drafter on this GPU that reads them in place.
    view: TapView,
}

/// The recorded layer outputs of a state's last pass, as a drafter on the same GPU reads them
/// in place ([`CudaState::device_taps`]; the engine hands it on as `Features::device_taps`):
/// `rows` rows of `layers.len() × hidden` f32 at `ptr`, each row's taps in `layers`' order.
/// Valid until the state's next pass, on the GPU's one stream (work queued before that pass
/// reads the rows of this one).
pub struct TapView {
    pub gpu: Arc<Gpu>,
    pub ptr: u64,
    pub layers: Vec<usize>,
    pub hidden: usize,
    /// Rows of the last pass.
    pub rows: usize,
}

/// The f16 scratch of the prefill products: the largest layer product's weights (q|k|v,
/// o, gate|up or down), and the activations of a pass.
struct GemmBufs {
    w16: DeviceBuffer,
    x16: DeviceBuffer,
    part: DeviceBuffer,
}

impl GemmBufs {
    fn scratch(&self) -> GemmScratch {
        GemmScratch {
            w16: self.w16.ptr(),
            w16_bytes: self.w16.len(),
            x16: self.x16.ptr(),
            x16_bytes: self.x16.len(),
            part: self.part.ptr(),
            part_bytes: self.part.len(),
        }
    }
}

/// The passes that run on the prefill GEMM: more rows than any verified tree, unless
/// `gemm_env` (the value of `KASOKU_CUDA_GEMM`) is "0" (for measuring matvec prefill). On an
/// H100 it prefills 512 tokens of the 1.5B Q4_K_M shape 2.4× as fast as matvec
/// (bench/results/gpu/README.md).
pub fn default_gemm_rows(gemm_env: Option<&str>) -> Option<usize> {
    match gemm_env {
        Some("0") => None,
        _ => Some(MAX_TREE + 1),
    }
}

/// Bytes of scratch the prefill products of a model of `hidden` width, attention widths
/// `q_dim` and `kv_dim` and FFN `ffn` need for passes of `rows` rows: (f16 weights of the
/// largest product: q|k|v, o, gate|up or down; f16 activations; the f32 partial sums of the
/// products that split K, sized for the narrow ones — q|k|v, o, down — at
/// [`crate::kernels::GEMM_MAX_SPLITS`]: wider ones split less or not at all).
pub fn gemm_scratch_size(
    h: usize,
    q_dim: usize,
    kv_dim: usize,
    ffn: usize,
    rows: usize,
) -> (usize, usize, usize) {
    let products = [(q_dim + 2 * kv_dim, h), (h, q_dim), (2 * ffn, h), (h, ffn)];
    let w = products
        .iter()
        .map(|&(r, cols)| gemm_scratch_bytes(r, 0, cols).0)
        .max()
        .unwrap_or(0);
    let max_width = h.max(q_dim).max(ffn);
    let part = gemm_part_bytes(h.max(q_dim + 2 * kv_dim), rows, GEMM_MAX_SPLITS);
    (w, gemm_scratch_bytes(0, rows, max_width).1, part)
}

/// Kernel classes [`CudaState::skip`] can leave out of a pass (for measuring only).
pub struct Skip;

impl Skip {
    /// The q/k/v epilogue and attention.
    pub const ATTENTION: u32 = 1;
    /// RMSNorm and SwiGLU.
    pub const ELEMENTWISE: u32 = 2;
    /// The layers' matrix products.
    pub const PRODUCTS: u32 = 4;
    /// The head's norm and product.
    pub const HEAD: u32 = 8;
    /// The q/k/v epilogue alone (per-head norm, RoPE, cache write).
    pub const QKV_EPILOGUE: u32 = 16;
}

impl CudaState {
    fn new(m: &CudaModel, max_len: usize) -> Result<CudaState> {
        let gpu = m.gpu().clone();
        let c = &m.config;
        let rows = PREFILL_ROWS.max(MAX_TREE);
        let max_slots = max_len + MAX_TREE;
        let chunks = attention_chunks(max_slots);
        let (h, hd) = (c.hidden, c.head_dim);
        let (q_dim, kv_dim) = (c.n_heads * hd, c.n_kv_heads * hd);
        let f = |n: usize| gpu.alloc(n * 4);
        let gdn = (m.gdn_layers > 0).then(|| gdn_shape(c));
        let value_dim = gdn.map_or(0, |s| s.value_dim());
        let max_width = h.max(q_dim).max(c.ffn).max(value_dim).next_multiple_of(32);
        let kv = gpu.alloc(m.attn_layers.max(1) * 2 * kv_dim * max_slots * 2)?;
        kv.fill(0)?;
        let layout = MetaLayout::new(rows);
        let gemm_rows = default_gemm_rows(std::env::var("KASOKU_CUDA_GEMM").ok().as_deref());
        // The GEMM's scratch only where it can run.
        let gemm_bufs = if m.kernels.has_gemm() && gemm_rows.is_some() {
            let (w, x, part) = gemm_scratch_size(h, q_dim, kv_dim, c.ffn, rows);
            // Qwen3.5's products: the q|k|v|z|β|α in-projection of a Gated DeltaNet layer and
            // its output projection.
            let (w, x, part) = match gdn {
                Some(s) => {
                    let rows_in = s.conv_dim() + s.value_dim() + 2 * s.nv as usize;
                    (
                        w.max(gemm_scratch_bytes(rows_in, 0, h).0)
                            .max(gemm_scratch_bytes(h, 0, s.value_dim()).0),
                        x.max(gemm_scratch_bytes(0, rows, s.value_dim()).1),
                        part.max(gemm_part_bytes(rows_in, rows, GEMM_MAX_SPLITS)),
                    )
                }
                None => (w, x, part),
            };
            Some(GemmBufs {
                w16: gpu.alloc(w)?,
                x16: gpu.alloc(x)?,
                part: gpu.alloc(part)?,
            })
        } else {
            None
        };
        let st = CudaState {
            len: 0,
            max_len,
            max_slots,
            rows,
            chunks,
            kv,
            x: f(rows * h)?,
            normed: f(rows * h)?,
            q: f(rows * q_dim)?,
            k: f(rows * kv_dim)?,
            v: f(rows * kv_dim)?,
            att: f(rows * q_dim)?,
            g: f(rows * c.ffn)?,
            u: f(rows * c.ffn)?,
            part_ml: f(rows * c.n_heads * chunks * 2)?,
            part_o: f(rows * c.n_heads * chunks * hd)?,
            arrivals: {
                let b = f(rows * c.n_heads)?;
                b.fill(0)?;
                b
            },
            logits: f(MAX_TREE * c.vocab)?,
            xq: gpu.alloc(rows * max_width)?,
            xs: gpu.alloc(rows * max_width / 32 * 16)?,
            glu_xq: gpu.alloc(rows * c.ffn)?,
            glu_xs: gpu.alloc(rows * c.ffn / 32 * 16)?,
            best: gpu.alloc(MAX_TREE * 8)?,
            meta: gpu.alloc(layout.words * 4)?,
            layout,
            meta_host: gpu.pinned(layout.words * 4)?,
            best_host: gpu.pinned(MAX_TREE * 8)?,
            path_dev: gpu.alloc((MAX_TREE + 1) * 4)?,
            path_host: gpu.pinned((MAX_TREE + 1) * 4)?,
            top_dev: gpu.alloc(TopLayout::WORDS * 4)?,
            top_host: gpu.pinned(TopLayout::WORDS * 4)?,
            row_host: gpu.pinned(c.vocab * 4)?,
            graphs: HashMap::new(),
            pending: None,
            use_graphs: true,
            prefetch: std::env::var("KASOKU_CUDA_PREFETCH").is_ok_and(|v| v == "1"),
            fuse_post: !std::env::var("KASOKU_CUDA_FUSE_POST").is_ok_and(|v| v == "0"),
            fuse_glu: std::env::var("KASOKU_CUDA_FUSE_GLU").is_ok_and(|v| v == "1"),
            fuse_norm: std::env::var("KASOKU_CUDA_FUSE_NORM").is_ok_and(|v| v == "1"),
            norm_count: {
                let b = gpu.alloc(4)?;
                b.fill(0)?;
                b
            },
            glu_count: {
                let b = gpu.alloc(c.ffn.div_ceil(32) * 4)?;
                b.fill(0)?;
                b
            },
            skip: 0,
            gemm_rows,
            gemm_bufs,
            delta: match gdn {
                Some(s) => Some(DeltaNetState::new(&gpu, s, m.gdn_layers, rows)?),
                None => None,
            },
            attn_gate: if c.attn_output_gate {
                Some(f(rows * q_dim)?)
            } else {
                None
            },
            head_rows: c.vocab,
            taps: None,
            last_rows: 0,
            gpu,
        };
        Ok(st)
    }

    /// Drops the captured graphs (after a change of launch settings).
    pub fn drop_graphs(&mut self) {
        self.graphs.clear();
    }

    /// Forgets everything (the cache is overwritten by later passes; recurrent states start
    /// from zero again at the next pass).
    pub fn reset(&mut self) {
        self.len = 0;
        self.pending = None;
    }

    /// Keeps the first `len` committed positions (attention caches: later slots are simply
    /// overwritten by the next passes); a pending tree is dropped. A model with recurrent
    /// (Gated DeltaNet) layers cannot rewind them: keeping fewer positions than it holds
    /// forgets everything, as [`CudaState::reset`] (see [`CudaState::len`] after).
    pub fn truncate(&mut self, len: usize) {
        if len < self.len && self.delta.is_some() {
            self.reset();
            return;
        }
        self.len = self.len.min(len);
        self.pending = None;
    }

    /// Whether [`CudaState::truncate`] keeps a prefix (no recurrent layers).
    pub fn is_rewindable(&self) -> bool {
        self.delta.is_none()
    }

    /// Queues the zeroing of the recurrent states before a pass over an empty state.
    fn start_if_empty(&self) -> Result<()> {
        match &self.delta {
            Some(d) if self.len == 0 => d.zero(),
            _ => Ok(()),
        }
    }

    /// Gated DeltaNet layer `gi`'s recurrent state (`nv × dv × dk`, each value head's state
    /// column by column) and conv state (`(K−1) × conv_dim`), for checks; `None` without such
    /// layers.
    pub fn delta_net_state(&self, gi: usize) -> Result<Option<(Vec<f32>, Vec<f32>)>> {
        match &self.delta {
            Some(d) => d.read_layer(gi).map(Some),
            None => Ok(None),
        }
    }

    fn check_tokens(&self, m: &CudaModel, tokens: &[u32], extra: usize) -> Result<()> {
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= m.config.vocab) {
            return Err(Error::Invalid(format!(
                "token {t} out of range (vocab {})",
                m.config.vocab
            )));
        }
        if self.len + extra > self.max_len {
            return Err(Error::Invalid(format!(
                "context full: {} + {extra} > {}",
                self.len, self.max_len
            )));
        }
        Ok(())
    }

    /// Whether a pass of `n` rows runs its layer products on the prefill GEMM.
    pub fn uses_gemm(&self, n: usize) -> bool {
        self.gemm_bufs.is_some() && self.gemm_rows.is_some_and(|r| n >= r)
    }

    /// The logits after the last token of the last `prefill` or `step` (the head's row of
    /// that pass), copied to the host: for sampling on the host.
    pub fn last_logits(&self, m: &CudaModel) -> Result<Vec<f32>> {
        self.logits.read_f32(m.config.vocab)
    }

    /// Row `row` of the last pass's head, copied into `out` (`vocab` values): row 0 after a
    /// `prefill` or `step`, node `row` after a `verify`. For sampling on the host. The copy
    /// goes through pinned memory (a DMA straight from the device, not a staged one).
    pub fn row_logits(&self, m: &CudaModel, row: usize, out: &mut Vec<f32>) -> Result<()> {
        if row >= MAX_TREE {
            return Err(Error::Invalid(format!("logits row {row} of {MAX_TREE}")));
        }
        let vocab = m.config.vocab;
        self.gpu.bind()?;
        self.logits
            .read_async(row * vocab * 4, &self.row_host, vocab * 4)?;
        self.gpu.synchronize()?;
        self.row_host.get_f32s_into(0, vocab, out);
        Ok(())
    }

    /// The `count` largest logits of row `row` of the last pass's head (row 0 after a
    /// `prefill` or `step`, node `row` after a `verify`) as (id, logit) pairs in no particular
    /// order into `top` (which: the host sampler's order, logit by total order then the
    /// smaller id), and the logits of tokens `ids` into `gathered`: what a top-k draw needs
    /// without the row. `count` in 1..vocab and at most [`MAX_TOP_K`], as many `ids`.
    pub fn top_logits(
        &mut self,
        m: &CudaModel,
        row: usize,
        count: usize,
        ids: &[u32],
        top: &mut Vec<(u32, f32)>,
        gathered: &mut Vec<f32>,
    ) -> Result<()> {
        let vocab = m.config.vocab;
        if row >= MAX_TREE || count > MAX_TOP_K || ids.len() > MAX_TOP_K {
            return Err(Error::Invalid(format!(
                "a top-{count} selection of row {row} gathering {} ids (rows below {MAX_TREE}, \
                 at most {MAX_TOP_K} of each)",
                ids.len()
            )));
        }
        if let Some(id) = ids.iter().find(|&&id| id as usize >= vocab) {
            return Err(Error::Invalid(format!(
                "token {id} out of range (vocab {vocab})"
            )));
        }
        self.gpu.bind()?;
        // The ids go up from the start of the pinned buffer (a queued copy reads from there),
        // which the results overwrite only after that copy, in stream order.
        if !ids.is_empty() {
            self.top_host.put_u32s(0, ids);
            self.top_dev
                .write_async(TopLayout::IDS * 4, &self.top_host, ids.len() * 4)?;
        }
        m.kernels.top_k_select(
            self.logits.at(row * vocab * 4),
            vocab,
            count,
            self.top_dev.at(TopLayout::IDS * 4),
            ids.len(),
            self.top_dev.ptr(),
            self.top_dev.at(TopLayout::GATHERED * 4),
        )?;
        // One copy back: the pairs, and the gathered logits after them when there are any.
        let words = if ids.is_empty() {
            2 * count
        } else {
            TopLayout::GATHERED + ids.len()
        };
        self.top_dev.read_async(0, &self.top_host, words * 4)?;
        self.gpu.synchronize()?;
        let pairs = self.top_host.get_u32s(0, 2 * count);
        top.clear();
        top.extend(pairs.chunks_exact(2).map(|p| (p[0], f32::from_bits(p[1]))));
        self.top_host
            .get_f32s_into(TopLayout::GATHERED, ids.len(), gathered);
        Ok(())
    }

    /// Appends `tokens` (any number; passes of [`PREFILL_ROWS`]) and returns the greedy next
    /// token after them.
    pub fn prefill(&mut self, m: &CudaModel, tokens: &[u32]) -> Result<u32> {
        self.check_tokens(m, tokens, tokens.len())?;
        self.pending = None;
        let mut last = 0;
        for chunk in tokens.chunks(PREFILL_ROWS) {
            last = self.pass(m, chunk, None, Head::Last)?[0];
            self.len += chunk.len();
        }
        Ok(last)
    }

    /// Appends one token and returns the greedy next one (one graph launch, one sync).
    pub fn step(&mut self, m: &CudaModel, token: u32) -> Result<u32> {
        self.check_tokens(m, &[token], 1)?;
        self.pending = None;
        let id = self.pass(m, &[token], None, Head::All)?[0];
        self.len += 1;
        Ok(id)
    }

    /// Runs every node of `tree` (root = the last sampled token, not yet in the state) and
    /// returns each node's greedy next token; the tree stays pending until [`commit`].
    ///
    /// [`commit`]: CudaState::commit
    pub fn verify(&mut self, m: &CudaModel, tree: &TokenTree) -> Result<Vec<u32>> {
        if tree.is_empty() || tree.len() > MAX_TREE {
            return Err(Error::Invalid(format!(
                "a tree of {} nodes (1..={MAX_TREE})",
                tree.len()
            )));
        }
        self.check_tokens(m, tree.tokens(), tree.max_depth() + 1)?;
        let ids = self.pass(m, tree.tokens(), Some(tree), Head::All)?;
        self.pending = Some(tree.clone());
        Ok(ids)
    }

    /// Keeps the root-to-node `path` of the pending tree: its keys and values move into
    /// place, Gated DeltaNet layers replay its updates (queued; no synchronisation) and the
    /// state grows by its length.
    pub fn commit(&mut self, m: &CudaModel, path: &[usize]) -> Result<()> {
        let tree = self
            .pending
            .take()
            .ok_or_else(|| Error::Invalid("commit without a verified tree".into()))?;
        if !tree.is_root_path(path) {
            return Err(Error::Invalid(format!(
                "{path:?} is not a root path of the pending tree"
            )));
        }
        // A path of nodes already in their places (a chain's accepted prefix, a plain step)
        // moves no keys or values; without Gated DeltaNet layers it needs no device work.
        let moves = !stays_in_place(path);
        if moves || self.delta.is_some() {
            let words: Vec<u32> = path.iter().map(|&i| i as u32).collect();
            self.path_host.put_u32s(0, &words);
            self.path_dev
                .write_async(0, &self.path_host, words.len() * 4)?;
        }
        if moves {
            let c = &m.config;
            m.kernels.kv_commit(&KvCommit {
                cache: self.kv.ptr(),
                head_elems: self.max_slots * c.head_dim,
                layers: m.attn_layers,
                n_kv_heads: c.n_kv_heads,
                head_dim: c.head_dim,
                past: self.len,
                path: self.path_dev.ptr(),
                len: path.len(),
            })?;
        }
        // Gated DeltaNet layers replay the path's updates (Qwen3.5).
        self.commit_delta_net(m, self.path_dev.ptr(), path.len())?;
        self.len += path.len();
        Ok(())
    }

    /// Appends `tokens` and returns every row's logits (`tokens.len() × vocab`), for checks
    /// against references (no graphs; logits copied back).
    pub fn logits(&mut self, m: &CudaModel, tokens: &[u32]) -> Result<Vec<f32>> {
        self.check_tokens(m, tokens, tokens.len())?;
        self.pending = None;
        let vocab = m.config.vocab;
        let mut out = Vec::with_capacity(tokens.len() * vocab);
        for chunk in tokens.chunks(MAX_TREE) {
            self.start_if_empty()?;
            let n = chunk.len();
            let mut words = vec![0u32; self.layout.words];
            fill_meta(&self.layout, self.len, chunk, None, &mut words);
            self.meta_host.put_u32s(0, &words);
            self.record(m, n, Head::All)?;
            self.last_rows = n;
            if let Some(t) = &mut self.taps {
                t.view.rows = n;
            }
            out.extend(self.logits.read_f32(n * vocab)?);
            self.len += n;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefill_passes_take_the_gemm_unless_switched_off() {
        assert_eq!(default_gemm_rows(None), Some(MAX_TREE + 1));
        assert_eq!(default_gemm_rows(Some("1")), Some(MAX_TREE + 1));
        assert_eq!(default_gemm_rows(Some("0")), None);
        // Verification and decode passes never reach it: their bits stay batch-invariant.
        assert!(default_gemm_rows(None).unwrap() > MAX_TREE);
        const { assert!(PREFILL_ROWS > MAX_TREE) };
    }

    #[test]
    fn qwen3_5_runs_on_the_gpu_and_unsupported_shapes_say_why() {
        use kasoku::format::gguf::GgufFile;
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/fixtures/qwen3_5/tiny/model-f32.gguf");
        let c = ModelConfig::from_gguf(&GgufFile::open(&path).unwrap()).unwrap();
        check_config(&c).unwrap();
        let s = gdn_shape(&c);
        assert_eq!(
            (s.nk, s.nv, s.dk, s.dv, s.kernel, s.grouped),
            (2, 4, 16, 16, 4, 0)
        );
        // Key heads past what the recurrence holds in registers.
        let mut big = c.clone();
        big.linear_key_head_dim = 256;
        let e = check_config(&big).unwrap_err().to_string();
        assert!(e.contains("key heads of at most 128"), "{e}");
        // Value widths the output's int8 blocks cannot cover.
        let mut odd = c.clone();
        odd.linear_value_head_dim = 12;
        assert!(check_config(&odd)
            .unwrap_err()
            .to_string()
            .contains("multiple of 32"));
        // Gated DeltaNet layers in another family.
        let mut llama = c.clone();
        llama.arch = Arch::Llama;
        assert!(check_config(&llama).is_err());
    }

    #[test]
    fn qwen3_5_query_rows_and_gate_rows_are_split_per_head() {
        // 2 heads of head_dim 2: rows q0 q0 g0 g0 q1 q1 g1 g1 (one byte each).
        let rows = [10u8, 11, 20, 21, 12, 13, 22, 23];
        let (q, g) = query_and_gate_rows(&rows, 1, 2);
        assert_eq!(q, [10, 11, 12, 13]);
        assert_eq!(g, [20, 21, 22, 23]);
    }

    #[test]
    fn only_paths_off_the_chain_move_keys_and_values() {
        assert!(stays_in_place(&[0]));
        assert!(stays_in_place(&[0, 1, 2]));
        assert!(!stays_in_place(&[0, 2]));
        assert!(!stays_in_place(&[0, 1, 3, 5]));
    }

    #[test]
    fn tapped_rows_are_copied_in_runs_and_layers_are_checked() {
        assert_eq!(consecutive_runs(&[]), vec![]);
        assert_eq!(
            consecutive_runs(&[0, 1, 2, 5, 6, 9]),
            vec![(0, 0..3), (3, 5..7), (5, 9..10)]
        );
        assert_eq!(consecutive_runs(&[3, 2]), vec![(0, 3..4), (1, 2..3)]);
        assert!(check_tap_layers(&[1, 0, 1], 2).is_ok());
        let e = check_tap_layers(&[0, 2], 2).unwrap_err().to_string();
        assert!(e.contains("tapped layer 2 of a model of 2 layers"), "{e}");
    }

    #[test]
    fn the_gemm_scratch_holds_the_largest_product() {
        // Qwen2.5 1.5B: gate|up (2 × 8960 rows of 1536) is the largest; activations up to
        // the FFN's width.
        let (w, x, part) = gemm_scratch_size(1536, 1536, 256, 8960, 512);
        assert_eq!(w, 2 * 8960 * 1536 * 2);
        assert_eq!(x, 512 * 8960 * 2);
        // q|k|v's 2048 rows split 4 ways at most.
        assert_eq!(part, 4 * 512 * 2048 * 4);
        // A wide attention (q|k|v larger than gate|up).
        let (w, _, _) = gemm_scratch_size(64, 4096, 4096, 32, 1);
        assert_eq!(w, (4096 + 2 * 4096) * 64 * 2);
    }
}
