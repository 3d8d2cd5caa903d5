//! kasoku's GPU kernels: CUDA C sources (this folder's `.cu` files, compiled together by NVRTC
//! at run time) and their typed launchers, which check shapes before anything is queued.
//!
//! - `matvec.cu`: matrix products on every GGUF weight format at any number of activation
//!   rows, batch-invariant ([`Kernels::matvec`]).
//! - `mma.cu`: the same products on the block formats with int8 tensor cores (compute
//!   capability 8.0 and later), so that 16 or 64 rows cost little more than one.
//! - `mma_packed.cu`: mma.cu's products, the same bits, on a load-time copy of a Q4_K or Q6_K
//!   matrix in fragment order ([`Kernels::pack`]; launchers in `mma_packed.rs`).
//! - `ops.cu`: embedding, RMSNorm, the q/k/v epilogue (per-head norm, RoPE, KV-cache write),
//!   SwiGLU, argmax, KV-cache commit.
//! - `attention.cu`: split-K attention over the f16 cache with chain or tree visibility
//!   (`attn_partial`, a block per query head; `KASOKU_CUDA_ATTN=1`: `attn_group`, a block
//!   per KV head's group of query heads; `KASOKU_CUDA_ATTN_ROWS=N`: `attn_rows`, N rows of a
//!   query head a block in passes of several rows, with attn_partial's bits).
//! - `attention_prefill.cu`: attention of long chain passes (prefill) on f16 tensor cores, a
//!   block per 64 rows and query head (`KASOKU_CUDA_ATTN_PREFILL=0`: the decode kernels;
//!   launcher in `attention_prefill.rs`).
//! - `sample.cu`: exact top-K selection of a logits row in the host sampler's order, for
//!   sampling on the host from K candidates ([`Kernels::top_k_select`]).
//! - `gemm.cu`: prefill products on f16 tensor cores, the weights expanded to f16 once per
//!   pass ([`Kernels::gemm`], launchers in `gemm.rs`).
//! - `delta_net.cu`: Qwen3.5's Gated DeltaNet layers (conv, head preparation, the recurrence
//!   over a chain or a tree, the gated output norm, the commit of an accepted path; launchers
//!   in `delta_net.rs`).
//! - `draft_top.cu`: each row's best two logits and softmax mass, for a draft model's trees
//!   ([`Kernels::row_top2`]), and a DFlash block's top-k selections in one launch and its
//!   features gathered in place (launchers in `draft_top.rs`).

use std::ffi::c_void;
use std::sync::Arc;

use kasoku::quant::DType;

use crate::runtime::compile::{arch_of, compile_cached, Module};
use crate::runtime::{Error, Gpu, Result};

mod attention_prefill;
mod delta_net;
mod draft_top;
mod gemm;
mod mma_packed;
use attention_prefill::{prefill_attention_asked, prefill_attention_fits};
pub use delta_net::{GdnCommit, GdnConv, GdnRecurrence, GdnShape, GDN_MAX_DK, GDN_MAX_HEAD};
pub use draft_top::{RowTop2, TOP2_WORDS};
pub use gemm::{
    gemm_part_bytes, gemm_plan, gemm_scratch_bytes, gemm_tile, prepare_args, prepare_unit,
    product_args, DequantSeg, GemmArgs, GemmOut, GemmScratch, GemmTile, PrepArgs, GEMM_MAX_SPLITS,
};
pub use mma_packed::{
    packed_asked, packed_chunk_bytes, packed_kernel, packed_len, packing_reserve,
};

/// The whole kernel source, in compilation order.
pub fn source() -> String {
    [
        include_str!("common.cuh"),
        include_str!("matvec.cu"),
        include_str!("mma.cu"),
        include_str!("mma_packed.cu"),
        include_str!("ops.cu"),
        include_str!("attention.cu"),
        include_str!("sample.cu"),
        include_str!("gemm.cu"),
        include_str!("attention_prefill.cu"),
        include_str!("delta_net.cu"),
        include_str!("draft_top.cu"),
    ]
    .join("\n")
}

/// Every kernel entry point.
pub const NAMES: [&str; 45] = [
    "quantize_acts",
    "matvec_1",
    "matvec_2",
    "matvec_4",
    "matvec_8",
    "mma_1",
    "mma_2",
    "mma_4",
    "mma_8",
    "mma_pack",
    "mmap_q4k_1",
    "mmap_q4k_2",
    "mmap_q4k_4",
    "mmap_q4k_8",
    "mmap_q6k_1",
    "mmap_q6k_2",
    "mmap_q6k_4",
    "mmap_q6k_8",
    "mmap_q4k_2w",
    "mmap_q6k_2w",
    "embed",
    "rmsnorm",
    "qkv_post",
    "swiglu",
    "argmax",
    "kv_commit",
    "attn_partial",
    "attn_group",
    "attn_rows",
    "attn_prefill_64",
    "attn_prefill_128",
    "top_k_select",
    "gemm_prepare",
    "gemm_128x128",
    "gemm_64x64",
    "gemm_reduce",
    "sigmoid_gate",
    "gdn_conv",
    "gdn_recurrence",
    "gdn_out",
    "gdn_commit_state",
    "gdn_commit_conv",
    "row_top2",
    "rows_top_k",
    "gather_rows",
];

/// Most blocks per (row, head) of attention: each takes every ATT_BLOCKS-th chunk of the
/// row's keys, so a pass launches blocks by the cache's length, not its capacity.
pub const ATT_BLOCKS: usize = 32;
/// Key positions per attention chunk (ATT_CHUNK in attention.cu).
pub const ATT_CHUNK: usize = 64;
/// Query heads per block of the grouped attention kernel (ATTG_HEADS in attention.cu): a GQA
/// group of more takes several blocks.
pub const ATTG_HEADS: usize = 8;

/// Whether attention runs the grouped kernel (`attn_group`: one block per row, KV head and
/// split for the group's query heads) rather than `attn_partial` (one block per query head):
/// opt-in with `KASOKU_CUDA_ATTN=1` (on an H100, 2026-12-06, it made the 1.5B's decode step
/// slower: tg128 428 against 463 tokens/s, a 1-row verify 2.11 against 1.62 ms). Read once
/// per process by [`Kernels::new`].
pub fn attention_grouped_asked() -> bool {
    std::env::var("KASOKU_CUDA_ATTN").is_ok_and(|v| v == "1")
}

/// Rows of one query head a block of `attn_rows` takes in a pass of several rows
/// (`KASOKU_CUDA_ATTN_ROWS=N`; 0 or 1, the default: every pass on `attn_partial`, a block per
/// row). Each row keeps attn_partial's bits (see attention.cu), so the choice may differ from
/// pass to pass. Read once per process by [`Kernels::new`].
pub fn attention_rows_asked() -> usize {
    env_usize("KASOKU_CUDA_ATTN_ROWS", 1).clamp(1, MATVEC_MAX_ROWS)
}

/// The grid of `attn_rows` for `a`, `rows` rows a block.
pub fn attention_rows_grid(a: &AttnCall, rows: usize) -> (u32, u32, u32) {
    (
        a.n.div_ceil(rows) as u32,
        a.n_heads as u32,
        a.chunks.min(ATT_BLOCKS) as u32,
    )
}

/// The grid of [`Kernels::attention`]: (rows, blocks per row and split, splits), by the
/// kernel. `grouped`: one block per KV head and ATTG_HEADS query heads of its group;
/// otherwise one per query head. Depends only on the call's shape and `chunks`.
pub fn attention_grid(a: &AttnCall, grouped: bool) -> (u32, u32, u32) {
    let heads = if grouped {
        let group = a.n_heads / a.n_kv_heads.max(1);
        a.n_kv_heads * group.div_ceil(ATTG_HEADS)
    } else {
        a.n_heads
    };
    (a.n as u32, heads as u32, a.chunks.min(ATT_BLOCKS) as u32)
}
/// The matvec kernel for `n` activation rows: tiles of 1, 2, 4 or 8 rows, at most
/// [`matvec_max_tile`] (more rows loop over tiles; a row's bits are the same in every kernel).
pub fn matvec_kernel(n: usize) -> &'static str {
    matvec_kernel_capped(n, matvec_max_tile())
}

/// [`matvec_kernel`] with tiles of at most `max_tile` rows.
pub fn matvec_kernel_capped(n: usize, max_tile: usize) -> &'static str {
    match n.min(max_tile) {
        0 | 1 => "matvec_1",
        2 => "matvec_2",
        3 | 4 => "matvec_4",
        _ => "matvec_8",
    }
}

/// The tallest matvec tile this process uses: 4, or what `KASOKU_CUDA_MATVEC_MAX_TILE` (1, 2
/// or 8) says. Passes of 5 to 8 rows take two 4-row tiles, the second reading the weights the
/// first just brought into L2: on an H100 (2026-12-07b) an 8-row pass of the 1.5B Q4_K_M shape
/// cost 2.30x a 1-row pass this way against 2.64x in the 8-row kernel, whose registers leave
/// fewer warps on a multiprocessor; 16 rows 3.97x against 4.26x, one row the same. Read once.
pub fn matvec_max_tile() -> usize {
    static MAX: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MAX.get_or_init(
        || match std::env::var("KASOKU_CUDA_MATVEC_MAX_TILE").ok().as_deref() {
            Some("1") => 1,
            Some("2") => 2,
            Some("8") => 8,
            _ => 4,
        },
    )
}
/// The tensor-core kernel for `n` activation rows: tiles of 8 rows, 1, 2, 4 or 8 of them per
/// pass over the weights.
pub fn mma_kernel(n: usize) -> &'static str {
    match n {
        0..=8 => "mma_1",
        9..=16 => "mma_2",
        17..=32 => "mma_4",
        _ => "mma_8",
    }
}
/// Most warps per 16-row tile of the tensor-core kernel (MMA_MAX_SPLIT in mma.cu).
pub const MMA_MAX_SPLIT: usize = 16;
/// The largest attention head the kernels take (their shared-memory row).
pub const MAX_HEAD_DIM: usize = 256;
/// Warps (pairs of weight rows) per matvec block.
const MATVEC_WARPS: usize = 4;

/// One matrix of a [`Kernels::matvec`] call: its weights and where its output goes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct MatSeg {
    pub w: u64,
    pub y: u64,
    pub bias: u64,
    pub row_bytes: i64,
    pub fmt: i32,
    pub rows: i32,
    pub ldy: i32,
    pub accumulate: i32,
    /// Per activation row, a u64 that receives the row's largest output as an ordered key
    /// (see [`argmax_id`]); 0 for none.
    pub best: u64,
    /// Its fragment-order copy ([`Kernels::pack`]; Q4_K and Q6_K), or 0: products then run
    /// `mma_packed.cu` on it.
    pub packed: u64,
}

/// The token id in an argmax key that `matvec` left (the low half holds `!id`).
pub fn argmax_id(key: u64) -> u32 {
    u32::MAX - key as u32
}

/// The parameter block of `matvec` (layout of `struct MatArgs` in matvec.cu).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct MatArgs {
    pub seg: [MatSeg; 3],
    pub x: u64,
    pub xq: u64,
    pub xs: u64,
    pub nseg: i32,
    pub cols: i32,
    pub n: i32,
    pub ldx: i32,
    /// Warps per pair of weight rows (1, 2 or 4; [`matvec_split`]).
    pub split: i32,
    /// Weights of later products, prefetched into L2 while this one runs (null: none).
    pub pre: [u64; 3],
    pub pre_len: [i64; 3],
    /// SwiGLU fused into a gate|up product ([`Kernels::matvec_swiglu`]): per 32 rows a u32
    /// count (zero before the first call, left zero by every call), and the int8 blocks of
    /// the result; 0: none.
    pub glu_count: u64,
    pub glu_q: u64,
    pub glu_s: u64,
    /// RMSNorm fused into a residual product ([`Kernels::matvec_norm`]): a u32 count (zero
    /// before the first call, left zero), the norm's weights, its output and int8 blocks.
    pub norm_count: u64,
    pub norm_w: u64,
    pub norm_y: u64,
    pub norm_q: u64,
    pub norm_s: u64,
    pub norm_eps: f32,
    pub norm_pad: i32,
    /// Weights streamed through shared memory ([`stream_layout`]): stages per block (0: the
    /// plain kernel) and the bytes of one.
    pub stream_stages: i32,
    pub stream_stage_bytes: i32,
}

/// Where a gate|up product with SwiGLU fused in ([`Kernels::matvec_swiglu`]) keeps its
/// counts and writes the int8 blocks of its result.
#[derive(Clone, Copy, Debug)]
pub struct GluTail {
    /// A zeroed u32 per 32 rows of the gate (the product leaves them zero).
    pub counts: u64,
    /// The result's int8 blocks (`out.xq`/`out.xs`; row stride: the gate's rows). Never the
    /// input's: a group's result is written while other blocks still read the input.
    pub out: Acts,
}

/// Whether a fused SwiGLU may write its int8 result to `out` while its product reads `x`:
/// not into the input's own int8 blocks, which blocks that start after a group completes
/// would then read overwritten (the race that broke `KASOKU_CUDA_FUSE_GLU=1` on the 1.5B
/// shape on an H100, where 2,240 blocks do not all start at once).
pub fn glu_output_separate(x: Acts, out: Acts) -> Result<()> {
    if out.xq != 0 && (out.xq == x.xq || out.xs == x.xs) {
        return Err(Error::Invalid(
            "fused SwiGLU: its int8 result would overwrite the product's int8 input".into(),
        ));
    }
    Ok(())
}

/// The RMSNorm a residual product applies to its result before it returns
/// ([`Kernels::matvec_norm`]).
#[derive(Clone, Copy, Debug)]
pub struct NormTail {
    /// A device u32, zero (the product leaves it zero).
    pub count: u64,
    /// The norm's weights (as many as the product's rows).
    pub w: u64,
    pub eps: f32,
    /// The normalized rows (row stride: the product's rows) and their int8 blocks.
    pub out: Acts,
}

/// Most rows of a residual stream a fused RMSNorm takes (NORM_MAX_DIM in matvec.cu).
pub const NORM_MAX_DIM: usize = 8192;

/// Most activation rows of a `matvec` call with a fused argmax (MATVEC_MAX_ROWS in
/// matvec.cu).
pub const MATVEC_MAX_ROWS: usize = 64;

/// The batch description the kernels read (`struct Batch` in ops.cu).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BatchDesc {
    pub past: i32,
    pub n: i32,
    pub is_chain: i32,
    pub max_depth: i32,
}

/// Whether the matvec kernel reads `dtype` at `cols` columns (float rows need whole 8-value
/// vectors; block formats whole blocks).
pub fn matvec_supports(dtype: DType, cols: usize) -> bool {
    if dtype.is_quantized() {
        cols.is_multiple_of(dtype.block_size())
    } else {
        cols.is_multiple_of(8)
    }
}

/// A weight matrix on the device, in its GGUF layout.
pub struct DeviceMatrix {
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
    pub row_bytes: usize,
    pub buf: crate::runtime::DeviceBuffer,
    /// Its fragment-order copy for the tensor-core products, when [`Kernels::pack`] made one.
    pub packed: Option<crate::runtime::DeviceBuffer>,
}

impl DeviceMatrix {
    /// Uploads `rows × cols` values of `dtype` stored row after row in `bytes` (straight from
    /// the file's memory map: no host copy).
    pub fn upload(
        gpu: &Arc<Gpu>,
        dtype: DType,
        rows: usize,
        cols: usize,
        bytes: &[u8],
    ) -> Result<DeviceMatrix> {
        let row_bytes = check_matrix(dtype, rows, cols, bytes.len())?;
        Ok(DeviceMatrix {
            dtype,
            rows,
            cols,
            row_bytes,
            buf: gpu.upload(bytes)?,
            packed: None,
        })
    }

    /// The segment computing this matrix into `y` (row stride `ldy`).
    pub fn seg(&self, y: u64, ldy: usize, bias: Option<u64>, accumulate: bool) -> MatSeg {
        MatSeg {
            w: self.buf.ptr(),
            y,
            bias: bias.unwrap_or(0),
            row_bytes: self.row_bytes as i64,
            fmt: self.dtype.ggml_id() as i32,
            rows: self.rows as i32,
            ldy: ldy as i32,
            accumulate: accumulate as i32,
            best: 0,
            packed: self.packed.as_ref().map_or(0, |p| p.ptr()),
        }
    }
}

/// Checks that `len` bytes hold a `rows × cols` matrix of `dtype` the kernels can read;
/// returns the bytes per row.
pub fn check_matrix(dtype: DType, rows: usize, cols: usize, len: usize) -> Result<usize> {
    if !matvec_supports(dtype, cols) {
        return Err(Error::Invalid(format!(
            "{dtype} matrix with {cols} columns: the GPU kernels need whole blocks (floats: \
             multiples of 8)"
        )));
    }
    let row_bytes = dtype
        .bytes_for(cols)
        .ok_or_else(|| Error::Invalid(format!("{dtype}: {cols} columns")))?;
    if row_bytes.checked_mul(rows) != Some(len) {
        return Err(Error::Invalid(format!(
            "{dtype} matrix {rows}x{cols}: {len} bytes, expected {}",
            row_bytes * rows
        )));
    }
    if i32::try_from(rows).is_err() || i32::try_from(cols).is_err() {
        return Err(Error::Invalid(format!("matrix {rows}x{cols} too large")));
    }
    Ok(row_bytes)
}

/// Activation rows for `matvec`: f32 values (read by float-format matrices) and their int8
/// blocks of 32 with scales (read by block formats), both with row stride `ld` values.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Acts {
    pub x: u64,
    pub xq: u64,
    pub xs: u64,
    pub ld: usize,
}

impl Acts {
    /// The same activations from row `r` on.
    pub fn from_row(self, r: usize) -> Acts {
        Acts {
            x: self.x + (r * self.ld * 4) as u64,
            xq: self.xq + (r * self.ld) as u64,
            xs: self.xs + (r * self.ld / 32 * 16) as u64,
            ld: self.ld,
        }
    }
}

/// Warps per pair of weight rows for a `matvec` call: rows of 256 or more units (a unit is
/// what one lane takes at a time: 8 floats, a 32-value block, or half a Q6_K super-block's
/// 128 values) are split over 4 warps, of 128 or more over 2, shorter ones take one. Depends
/// only on the matrices' formats and width, never on the number of activation rows, so a
/// row's arithmetic is the same at every batch size.
pub fn matvec_split(segs: &[MatSeg], cols: usize) -> usize {
    let units = segs
        .iter()
        .map(|s| match s.fmt {
            0 | 1 | 30 => cols / 8,
            14 => cols / 64,
            _ => cols / 32,
        })
        .min()
        .unwrap_or(0);
    match units {
        256.. => 4,
        128.. => 2,
        _ => 1,
    }
}

/// Weight rows one warp of the `n`-row matvec kernel computes: 4 in the 8-row kernel (tree
/// verification: an activation load serves four weight rows), 2 in the others (matvec.cu's
/// entry points say the same). Each row's arithmetic is the same either way.
pub fn matvec_rows_per_warp(n: usize) -> usize {
    if matvec_kernel(n) == "matvec_8" {
        4
    } else {
        2
    }
}

/// Builds the `matvec` parameters for `segs` (at most 3, each the same width `cols`) over
/// `n` activation rows `x`; returns them with the grid size.
pub fn matvec_args(segs: &[MatSeg], x: Acts, n: usize, cols: usize) -> Result<(MatArgs, u32)> {
    let ldx = x.ld;
    if segs.is_empty() || segs.len() > 3 {
        return Err(Error::Invalid(format!("matvec of {} matrices", segs.len())));
    }
    if ldx < cols || !ldx.is_multiple_of(32) {
        return Err(Error::Invalid(format!(
            "matvec: activation stride {ldx} for {cols} columns (must be ≥ and a multiple of 32)"
        )));
    }
    let mut a = MatArgs {
        x: x.x,
        xq: x.xq,
        xs: x.xs,
        nseg: segs.len() as i32,
        cols: cols as i32,
        n: n as i32,
        ldx: ldx as i32,
        ..MatArgs::default()
    };
    a.seg[..segs.len()].copy_from_slice(segs);
    if segs.iter().any(|s| s.best != 0) && (segs.len() != 1 || n > MATVEC_MAX_ROWS) {
        return Err(Error::Invalid(format!(
            "matvec: a fused argmax takes one matrix and at most {MATVEC_MAX_ROWS} rows ({} and {n})",
            segs.len()
        )));
    }
    // `split` warps per group of rows (matvec_rows_per_warp) of one matrix.
    a.split = matvec_split(segs, cols) as i32;
    let per_warp = matvec_rows_per_warp(n);
    let groups: usize = segs
        .iter()
        .map(|s| (s.rows as usize).div_ceil(per_warp))
        .sum();
    Ok((a, (groups * a.split as usize).div_ceil(MATVEC_WARPS) as u32))
}

/// Most stages a streamed product keeps in flight per block (STREAM_MAX_STAGES in matvec.cu).
pub const STREAM_MAX_STAGES: usize = 8;

/// Most dynamic shared memory a streamed product's block takes.
pub const STREAM_SHARED_MAX: usize = 100 * 1024;

/// How a product streams its weights through shared memory (`KASOKU_CUDA_STREAM=1` on
/// compute capability 9.0; matvec_stream in matvec.cu): stages per block, the bytes of one
/// stage (a block's tile of rows widened to 16-byte bounds), and the number of tiles (the
/// launcher's persistent grid takes at most one block per tile). About `budget` bytes of
/// stages per block, at least 2 stages; `None` where two stages would not fit
/// [`STREAM_SHARED_MAX`] (the plain kernel then runs: the same bits).
pub fn stream_layout(args: &MatArgs, budget: usize) -> Option<(i32, i32, usize)> {
    let pairs_per_tile = MATVEC_WARPS / args.split.max(1) as usize;
    let segs = &args.seg[..args.nseg as usize];
    let stage = segs
        .iter()
        .map(|s| (2 * pairs_per_tile * s.row_bytes as usize).next_multiple_of(16) + 32)
        .max()?;
    let stages = (budget / stage).clamp(2, STREAM_MAX_STAGES);
    if stages * stage > STREAM_SHARED_MAX {
        return None;
    }
    let tiles: usize = segs
        .iter()
        .map(|s| (s.rows as usize).div_ceil(2).div_ceil(pairs_per_tile))
        .sum();
    Some((stages as i32, stage as i32, tiles))
}

/// Whether products stream their weights in this process, and how (see [`stream_layout`]).
#[derive(Clone, Copy, Debug)]
struct StreamPlan {
    blocks_per_sm: usize,
    budget: usize,
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Warps per 16-row tile of the tensor-core kernel: one per `units` of the row's super-blocks
/// of 256 values (1 unless `KASOKU_CUDA_MMA_UNITS` says otherwise, for measuring), 1 to
/// [`MMA_MAX_SPLIT`]. Depends only on the width, never on the number of activation rows, so a
/// row's arithmetic is the same at every batch size.
pub fn mma_split(cols: usize, units: usize) -> usize {
    cols.div_ceil(256)
        .div_ceil(units.max(1))
        .clamp(1, MMA_MAX_SPLIT)
}

/// Super-blocks per warp of the tensor-core kernel in this process ([`mma_split`]).
fn mma_units() -> usize {
    std::env::var("KASOKU_CUDA_MMA_UNITS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&v| (1..=64).contains(&v))
        .unwrap_or(1)
}

/// Most dynamic shared memory a tensor-core block takes (its warps' rings of stages; the
/// kernels are allowed it at load). Fits every device of compute capability 8.0 and later.
pub const MMA_SHARED_MAX: usize = 80 * 1024;

/// Bytes of 256 values of a block format (`mma_sup_bytes` in mma.cu).
fn mma_sup_bytes(fmt: i32) -> usize {
    match fmt {
        2 => 8 * 18,
        3 => 8 * 20,
        6 => 8 * 22,
        7 => 8 * 24,
        8 => 8 * 34,
        12 => 144,
        13 => 176,
        _ => 210,
    }
}

/// The row stride of a tensor-core stage (16 rows of one super-block each, widened to 16-byte
/// bounds): the most bytes a row's copy can take, an odd number of 16-byte lines (the 8 rows
/// one shared-memory load touches then start in different banks).
pub fn mma_stride(segs: &[MatSeg]) -> usize {
    let need = segs
        .iter()
        .map(|s| {
            let sup = mma_sup_bytes(s.fmt);
            if s.w.is_multiple_of(16) && s.row_bytes % 16 == 0 && sup.is_multiple_of(16) {
                sup
            } else {
                // At most 15 bytes before the first (its 16-byte line) and to the end of the last.
                (sup + 30).div_ceil(16) * 16
            }
        })
        .max()
        .unwrap_or(16);
    let lines = need.div_ceil(16);
    16 * (lines | 1)
}

/// Stages of each warp's ring: as many of its super-blocks as fit `budget` bytes for the
/// block (`split` warps), 1 to 4 and at most the most super-blocks a warp takes. Changes no
/// result: only how many copies are in flight.
pub fn mma_stages(cols: usize, split: usize, stride: usize, budget: usize) -> usize {
    let most = cols.div_ceil(256).div_ceil(split.max(1));
    (budget / (split.max(1) * 16 * stride)).clamp(1, most.clamp(1, 4))
}

/// Builds the tensor-core kernel's parameters for block-format `segs` (at most 3, each the
/// same width `cols`) over `n` activation rows `x`; returns them with the grid size (one
/// block of `split` warps per 16 weight rows). `stream_stages` / `stream_stage_bytes` carry
/// the ring's stages and stride ([`mma_shared`] bytes of dynamic shared memory a block).
pub fn mma_args(segs: &[MatSeg], x: Acts, n: usize, cols: usize) -> Result<(MatArgs, u32)> {
    let (mut a, _) = matvec_args(segs, x, n, cols)?;
    if let Some(s) = segs.iter().find(|s| !is_block_format(s.fmt)) {
        return Err(Error::Invalid(format!(
            "tensor-core product of format {} (block formats only)",
            s.fmt
        )));
    }
    let split = mma_split(cols, mma_units());
    let stride = mma_stride(segs);
    let budget = env_usize("KASOKU_CUDA_MMA_KB", MMA_SHARED_MAX / 1024) * 1024;
    let stages = mma_stages(cols, split, stride, budget.min(MMA_SHARED_MAX));
    a.split = split as i32;
    a.stream_stages = stages as i32;
    a.stream_stage_bytes = stride as i32;
    if mma_shared(&a) > MMA_SHARED_MAX {
        return Err(Error::Invalid(format!(
            "tensor-core ring of {} bytes (at most {MMA_SHARED_MAX})",
            mma_shared(&a)
        )));
    }
    let tiles: usize = segs.iter().map(|s| (s.rows as usize).div_ceil(16)).sum();
    Ok((a, tiles as u32))
}

/// Dynamic shared memory of a tensor-core block built by [`mma_args`].
pub fn mma_shared(a: &MatArgs) -> usize {
    (a.split * a.stream_stages * 16 * a.stream_stage_bytes) as usize
}

/// Whether GGML type id `fmt` is a block format the tensor-core kernel reads (every format
/// but F32, F16 and BF16).
pub fn is_block_format(fmt: i32) -> bool {
    !matches!(fmt, 0 | 1 | 30)
}

/// The int8 targets of a producer: both or neither set, for a whole number of blocks.
fn quant_targets(y: Acts, len: usize) -> Result<(u64, u64)> {
    if y.xq == 0 || y.xs == 0 {
        return Ok((0, 0));
    }
    if !len.is_multiple_of(32) {
        return Err(Error::Invalid(format!(
            "int8 activations of {len} values (not whole blocks of 32)"
        )));
    }
    Ok((y.xq, y.xs))
}

/// Attention chunks a row at position `pos` reads.
pub fn attention_chunks(pos: usize) -> usize {
    pos / ATT_CHUNK + 1
}

/// Whether a device of this compute capability runs the tensor-core products (8.0 and later).
pub fn capability_has_mma(capability: (i32, i32)) -> bool {
    capability.0 >= 8
}

/// The default tensor-core plan's smallest matrix, in MiB: on the 1.5B Q4_K_M shape, gate, up,
/// down and the head (the matrices with tiles enough to fill the GPU at one row). Packed, they
/// decode at dp4a's speed and verify 16 rows in 2.70 single passes against 4.03 (H100,
/// bench/results/gpu/2026-12-07d).
pub const MMA_DEFAULT_MIN_MB: usize = 6;

/// Which block-format matrices a process multiplies on the tensor-core kernel (mma.cu) rather
/// than matvec.cu's dp4a kernels. The choice is by matrix (its format and its size), never by
/// the number of activation rows, so each matrix's rows get the same bits in every pass: a
/// tree node's logits are plain decoding's whichever kernel computes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MmaPlan {
    /// Every matrix on dp4a (`KASOKU_CUDA_MMA=0`, and devices before compute capability 8.0).
    Off,
    /// Every block-format matrix on tensor cores (`KASOKU_CUDA_MMA=1`).
    All,
    /// Block-format matrices of at least this many bytes (`KASOKU_CUDA_MMA_MIN_MB=N`, in MiB;
    /// by default [`MMA_DEFAULT_MIN_MB`]): the ones with tiles enough to fill the GPU at one row.
    AtLeast(usize),
}

impl MmaPlan {
    /// The plan the environment asks for on a device of compute capability 8.0 or later
    /// (else `Off`): `KASOKU_CUDA_MMA=1` every block-format matrix, `=0` none,
    /// `KASOKU_CUDA_MMA_MIN_MB=N` those of at least N MiB; by default those of at least
    /// [`MMA_DEFAULT_MIN_MB`].
    pub fn asked(capability: (i32, i32)) -> MmaPlan {
        if !capability_has_mma(capability) {
            return MmaPlan::Off;
        }
        match std::env::var("KASOKU_CUDA_MMA").ok().as_deref() {
            Some("1") => return MmaPlan::All,
            Some("0") => return MmaPlan::Off,
            _ => {}
        }
        let mb = std::env::var("KASOKU_CUDA_MMA_MIN_MB")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(MMA_DEFAULT_MIN_MB);
        MmaPlan::AtLeast(mb << 20)
    }

    /// Whether segment `s` goes through the tensor-core kernel.
    pub fn takes(&self, s: &MatSeg) -> bool {
        let bytes = s.rows.max(0) as usize * s.row_bytes.max(0) as usize;
        is_block_format(s.fmt)
            && match *self {
                MmaPlan::Off => false,
                MmaPlan::All => true,
                MmaPlan::AtLeast(min) => bytes >= min,
            }
    }
}

/// The compiled kernels on one device.
pub struct Kernels {
    pub gpu: Arc<Gpu>,
    module: Module,
    /// Which block-format matrices go through the tensor-core kernel ([`MmaPlan::asked`]); the
    /// choice holds for the process.
    mma: MmaPlan,
    /// The matrices `mma` takes get a fragment-order copy at load ([`Kernels::pack_planned`]),
    /// and only matrices with one run on tensor cores.
    packs: bool,
    /// Products stream their weights through shared memory (`KASOKU_CUDA_STREAM=1`, compute
    /// capability 9.0; until measured on a GPU it is opt-in).
    stream: Option<StreamPlan>,
    /// Attention runs `attn_group` ([`attention_grouped_asked`]); the choice holds for the
    /// process, so every row is always computed the same way.
    attn_grouped: bool,
    /// Long chain passes take `attn_prefill` ([`prefill_attention_asked`]).
    attn_prefill: bool,
    /// Passes of several rows take `attn_rows` with this many rows a block (1: never;
    /// [`attention_rows_asked`]).
    attn_rows: usize,
}

/// A kernel parameter: a pointer to the value, as cuLaunchKernel takes them.
fn p<T>(v: &T) -> *mut c_void {
    v as *const T as *mut c_void
}

impl Kernels {
    /// Compiles (once per process) and loads the kernels for `gpu`.
    pub fn new(gpu: &Arc<Gpu>) -> Result<Kernels> {
        let cubin = compile_cached(&source(), &arch_of(gpu.capability))?;
        let module = Module::load(gpu, &cubin, &NAMES)?;
        let mma = MmaPlan::asked(gpu.capability);
        let stream = (gpu.capability.0 >= 9 && stream_asked()).then(|| StreamPlan {
            blocks_per_sm: env_usize("KASOKU_CUDA_STREAM_BLOCKS", 4),
            budget: env_usize("KASOKU_CUDA_STREAM_KB", 48) * 1024,
        });
        if capability_has_mma(gpu.capability) {
            for name in ["mma_1", "mma_2", "mma_4", "mma_8"] {
                gpu.allow_shared(module.function(name), MMA_SHARED_MAX as u32)?;
            }
        }
        if stream.is_some() {
            for name in ["matvec_1", "matvec_2", "matvec_4", "matvec_8"] {
                gpu.allow_shared(module.function(name), STREAM_SHARED_MAX as u32)?;
            }
        }
        Ok(Kernels {
            gpu: gpu.clone(),
            module,
            mma,
            packs: mma != MmaPlan::Off && mma_packed::packed_asked(),
            stream,
            attn_grouped: attention_grouped_asked(),
            attn_prefill: prefill_attention_asked(),
            attn_rows: attention_rows_asked(),
        })
    }

    fn launch(
        &self,
        name: &str,
        grid: (u32, u32, u32),
        block: u32,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        self.gpu
            .launch(self.module.function(name), grid, block, params)
    }

    /// Launches the `n`-row product kernel on `args` (built by [`matvec_args`] with `grid`),
    /// streamed when this process streams products and the tiles fit.
    fn launch_matvec(&self, n: usize, mut args: MatArgs, grid: u32) -> Result<()> {
        let f = self.module.function(matvec_kernel(n));
        let block = (MATVEC_WARPS * 32) as u32;
        let (mut grid, mut shared) = (grid, 0);
        // Streaming takes pairs of rows only.
        if let Some(plan) = self.stream.filter(|_| matvec_rows_per_warp(n) == 2) {
            if let Some((stages, bytes, tiles)) = stream_layout(&args, plan.budget) {
                args.stream_stages = stages;
                args.stream_stage_bytes = bytes;
                shared = (stages * bytes) as u32;
                // A persistent grid of resident blocks only: a block that waited for another
                // to finish would take its tiles late.
                let per_sm = plan
                    .blocks_per_sm
                    .min(self.gpu.resident_blocks(f, block, shared)?);
                grid = tiles.min(self.gpu.multiprocessors * per_sm) as u32;
            }
        }
        self.gpu
            .launch_shared(f, (grid, 1, 1), block, shared, &mut [p(&args)])
    }

    /// `seg.y[r][j] (+)= Σ_c x[r][c] · W[j][c] (+ bias[j])` for every segment.
    pub fn matvec(&self, segs: &[MatSeg], x: Acts, n: usize, cols: usize) -> Result<()> {
        self.matvec_prefetch(segs, x, n, cols, &[])
    }

    /// [`Kernels::matvec`], and the weights of up to three matrices a later kernel reads are
    /// brought into L2 while it runs (results unchanged; only where the bytes come from).
    pub fn matvec_prefetch(
        &self,
        segs: &[MatSeg],
        x: Acts,
        n: usize,
        cols: usize,
        next: &[&DeviceMatrix],
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        // Packing, the plan chose at load which matrices have copies (memory allowing): only
        // those go to tensor cores. Without it, the plan's matrices run mma.cu on GGUF bytes.
        let (blocks, floats): (Vec<MatSeg>, Vec<MatSeg>) = segs
            .iter()
            .partition(|s| s.packed != 0 || (!self.packs && self.mma.takes(s)));
        let (packed, blocks): (Vec<MatSeg>, Vec<MatSeg>) =
            blocks.into_iter().partition(|s| s.packed != 0);
        if !floats.is_empty() {
            let (mut args, grid) = matvec_args(&floats, x, n, cols)?;
            for (i, m) in next.iter().take(3).enumerate() {
                // The bytes the next product will read: its packed copy where it has one.
                let buf = m.packed.as_ref().unwrap_or(&m.buf);
                args.pre[i] = buf.ptr();
                args.pre_len[i] = buf.len() as i64;
            }
            self.launch_matvec(n, args, grid)?;
        }
        if !blocks.is_empty() {
            self.launch_mma(&blocks, x, n, cols)?;
        }
        if !packed.is_empty() {
            self.launch_packed(&packed, x, n, cols)?;
        }
        Ok(())
    }

    /// mma.cu's product of block-format `segs` read in their GGUF layout (whatever the plan;
    /// the kernel checks compare it with the packed kernels).
    pub fn launch_mma(&self, segs: &[MatSeg], x: Acts, n: usize, cols: usize) -> Result<()> {
        let (args, grid) = mma_args(segs, x, n, cols)?;
        self.gpu.launch_shared(
            self.module.function(mma_kernel(n)),
            (grid, 1, 1),
            (args.split * 32) as u32,
            mma_shared(&args) as u32,
            &mut [p(&args)],
        )
    }

    /// `g = silu(x·Gateᵀ) · (x·Upᵀ)` in one kernel: the gate|up product of [`Kernels::matvec`]
    /// whose warps, as each group of 32 rows completes, apply SwiGLU to it in place in
    /// `gate.y` and write its int8 blocks to `out` (what [`Kernels::swiglu`] computes, the
    /// same bits). Not with the tensor-core kernel (an error).
    pub fn matvec_swiglu(
        &self,
        gate: MatSeg,
        up: MatSeg,
        x: Acts,
        n: usize,
        cols: usize,
        glu: GluTail,
    ) -> Result<()> {
        let GluTail { counts, out } = glu;
        if self.uses_mma() {
            return Err(Error::Invalid(
                "SwiGLU is not fused into tensor-core products".into(),
            ));
        }
        if gate.rows != up.rows || gate.rows % 32 != 0 || gate.ldy != gate.rows || up.ldy != up.rows
        {
            return Err(Error::Invalid(format!(
                "fused SwiGLU of {} gate and {} up rows (equal, whole groups of 32, packed)",
                gate.rows, up.rows
            )));
        }
        glu_output_separate(x, out)?;
        if n == 0 {
            return Ok(());
        }
        let (xq, xs) = quant_targets(out, n * gate.rows as usize)?;
        let (mut args, grid) = matvec_args(&[gate, up], x, n, cols)?;
        args.glu_count = counts;
        args.glu_q = xq;
        args.glu_s = xs;
        self.launch_matvec(n, args, grid)
    }

    /// `seg.y (+)= x·Wᵀ`, then the RMSNorm of every activation row of `seg.y` into
    /// `norm.out`, in one kernel (the last block to finish normalizes, with the bits of
    /// [`Kernels::rmsnorm`]). For few rows: that block takes them one after another. Not with
    /// the tensor-core kernel (an error).
    pub fn matvec_norm(
        &self,
        seg: MatSeg,
        x: Acts,
        n: usize,
        cols: usize,
        norm: NormTail,
    ) -> Result<()> {
        if self.uses_mma() {
            return Err(Error::Invalid(
                "RMSNorm is not fused into tensor-core products".into(),
            ));
        }
        let dim = seg.rows as usize;
        if seg.ldy != seg.rows || !dim.is_multiple_of(32) || dim > NORM_MAX_DIM {
            return Err(Error::Invalid(format!(
                "fused RMSNorm of {dim} values (packed rows, whole blocks of 32, at most {NORM_MAX_DIM})"
            )));
        }
        if n == 0 {
            return Ok(());
        }
        let (xq, xs) = quant_targets(norm.out, dim)?;
        let (mut args, grid) = matvec_args(&[seg], x, n, cols)?;
        args.norm_count = norm.count;
        args.norm_w = norm.w;
        args.norm_y = norm.out.x;
        args.norm_q = xq;
        args.norm_s = xs;
        args.norm_eps = norm.eps;
        self.launch_matvec(n, args, grid)
    }

    /// Whether products stream their weights through shared memory in this process.
    pub fn streams(&self) -> bool {
        self.stream.is_some()
    }

    /// Whether any block-format matrix runs on the tensor-core kernel in this process.
    pub fn uses_mma(&self) -> bool {
        self.mma != MmaPlan::Off
    }

    /// Which block-format matrices run on the tensor-core kernel in this process.
    pub fn mma_plan(&self) -> MmaPlan {
        self.mma
    }

    /// Whether the matrices of the plan get packed copies in this process
    /// ([`Kernels::pack_planned`]).
    pub fn packs(&self) -> bool {
        self.packs
    }

    /// Whether a chain pass of `n` rows of heads of `head_dim` takes the prefill attention
    /// kernel in this process: passes longer than `min_rows` (callers pass the longest
    /// speculative tree, so verification and decoding keep the decode kernels' bits).
    pub fn uses_prefill_attention(&self, n: usize, head_dim: usize, min_rows: usize) -> bool {
        self.attn_prefill && n > min_rows && prefill_attention_fits(head_dim)
    }

    /// Rows `tokens` of the embedding `table` into `y` (`n × dim` f32); also zeroes
    /// `clear_n` u64s at `clear` (0: none).
    pub fn embed(
        &self,
        table: &DeviceMatrix,
        tokens: u64,
        n: usize,
        y: u64,
        clear: u64,
        clear_n: usize,
    ) -> Result<()> {
        let cn = clear_n as i32;
        let (rb, fmt, dim) = (
            table.row_bytes as i64,
            table.dtype.ggml_id() as i32,
            table.cols as i32,
        );
        let t = table.buf.ptr();
        self.launch(
            "embed",
            (n as u32, 1, 1),
            256,
            &mut [
                p(&t),
                p(&rb),
                p(&fmt),
                p(&dim),
                p(&tokens),
                p(&y),
                p(&clear),
                p(&cn),
            ],
        )
    }

    /// RMSNorm of `rows` rows of `dim` values into `y.x`, and their int8 blocks into
    /// `y.xq`/`y.xs` when those are set (`dim` a multiple of 32).
    pub fn rmsnorm(
        &self,
        x: u64,
        w: u64,
        eps: f32,
        dim: usize,
        rows: usize,
        y: Acts,
    ) -> Result<()> {
        let d = dim as i32;
        let (xq, xs) = quant_targets(y, dim)?;
        self.launch(
            "rmsnorm",
            (rows as u32, 1, 1),
            256,
            &mut [p(&x), p(&w), p(&eps), p(&d), p(&y.x), p(&xq), p(&xs)],
        )
    }

    /// `g = silu(g) · u` over `len` values (a multiple of 32; a warp per 32), and the int8 blocks of the
    /// result into `q` when set.
    pub fn swiglu(&self, g: u64, u: u64, len: usize, q: Acts) -> Result<()> {
        if !len.is_multiple_of(32) {
            return Err(Error::Invalid(format!(
                "swiglu of {len} values (whole blocks of 32)"
            )));
        }
        let (xq, xs) = quant_targets(q, len)?;
        let blocks = (len / 32) as i64;
        self.launch(
            "swiglu",
            ((len / 32).div_ceil(4) as u32, 1, 1),
            128,
            &mut [p(&g), p(&u), p(&blocks), p(&xq), p(&xs)],
        )
    }

    /// `x = x · sigmoid(gate)` over `len` values (a multiple of 32; Qwen3.5's attention output
    /// gate), and the int8 blocks of the result into `q` when set.
    pub fn sigmoid_gate(&self, x: u64, gate: u64, len: usize, q: Acts) -> Result<()> {
        if !len.is_multiple_of(32) {
            return Err(Error::Invalid(format!(
                "sigmoid gate of {len} values (whole blocks of 32)"
            )));
        }
        let (xq, xs) = quant_targets(q, len)?;
        let blocks = (len / 32) as i64;
        self.launch(
            "sigmoid_gate",
            ((len / 32).div_ceil(4) as u32, 1, 1),
            128,
            &mut [p(&x), p(&gate), p(&blocks), p(&xq), p(&xs)],
        )
    }

    /// The int8 blocks of `len` f32 values (a multiple of 32) at `x.x`, into `x.xq`/`x.xs`.
    pub fn quantize(&self, x: Acts, len: usize) -> Result<()> {
        let (xq, xs) = quant_targets(x, len)?;
        let blocks = (len / 32) as i64;
        self.launch(
            "quantize_acts",
            ((len / 32).div_ceil(4) as u32, 1, 1),
            128,
            &mut [p(&x.x), p(&blocks), p(&xq), p(&xs)],
        )
    }

    /// The index of each row's largest value.
    pub fn argmax(&self, logits: u64, vocab: usize, rows: usize, ids: u64) -> Result<()> {
        let v = vocab as i32;
        self.launch(
            "argmax",
            (rows as u32, 1, 1),
            1024,
            &mut [p(&logits), p(&v), p(&ids)],
        )
    }

    /// The q/k/v epilogue (see ops.cu `qkv_post`).
    pub fn qkv_post(&self, a: &QkvPost) -> Result<()> {
        if a.head_dim > MAX_HEAD_DIM
            || a.rot_dim > a.head_dim
            || a.n_kv_heads == 0
            || !a.n_heads.is_multiple_of(a.n_kv_heads)
        {
            return Err(Error::Invalid(format!("attention geometry {a:?}")));
        }
        let (q_ld, kv_ld) = (
            (a.n_heads * a.head_dim) as i32,
            (a.n_kv_heads * a.head_dim) as i32,
        );
        let (nh, nkv, hd, rd, il) = (
            a.n_heads as i32,
            a.n_kv_heads as i32,
            a.head_dim as i32,
            a.rot_dim as i32,
            a.interleaved as i32,
        );
        let ms = a.max_slots as i32;
        self.launch(
            "qkv_post",
            (a.n as u32, (a.n_heads + a.n_kv_heads) as u32, 1),
            128,
            &mut [
                p(&a.q),
                p(&a.k),
                p(&a.v),
                p(&q_ld),
                p(&kv_ld),
                p(&nh),
                p(&nkv),
                p(&hd),
                p(&rd),
                p(&il),
                p(&a.inv_freq),
                p(&a.q_norm),
                p(&a.k_norm),
                p(&a.eps),
                p(&a.batch),
                p(&a.pos),
                p(&a.k_cache),
                p(&a.v_cache),
                p(&ms),
            ],
        )
    }

    /// Attention of `n` rows (queries at `q`, `n × n_heads × head_dim`) over one layer's
    /// cache, into `out` (same shape); `chunks` bounds the key chunks of any row. With
    /// `post` on (one chain row only), `q` is the raw projection and the q/k/v epilogue runs
    /// inside (see [`PostArgs`]). By the process's kernel (`KASOKU_CUDA_ATTN`).
    pub fn attention(&self, a: &AttnCall) -> Result<()> {
        self.attention_by(a, self.attn_grouped)
    }

    /// Whether this process's attention is the grouped kernel.
    pub fn attention_grouped(&self) -> bool {
        self.attn_grouped
    }

    /// Rows a block of `attn_rows` takes in this process's passes of several rows (1: those
    /// passes run `attn_partial`).
    pub fn attention_rows(&self) -> usize {
        self.attn_rows
    }

    /// [`Kernels::attention`] by the kernel named: `grouped` `attn_group`, else
    /// `attn_partial` (the checks run both; a model uses the process's one), or `attn_rows`
    /// for a pass of several rows when the process asks for it ([`attention_rows_asked`]).
    pub fn attention_by(&self, a: &AttnCall, grouped: bool) -> Result<()> {
        if grouped
            && (a.n_kv_heads == 0
                || !a.n_heads.is_multiple_of(a.n_kv_heads)
                || a.head_dim > MAX_HEAD_DIM
                || !a.head_dim.is_multiple_of(8))
        {
            return Err(Error::Invalid(format!(
                "attention of {} query heads over {} KV heads of {} (a whole group per KV head, head_dim a multiple of 8 up to {MAX_HEAD_DIM})",
                a.n_heads, a.n_kv_heads, a.head_dim
            )));
        }
        if a.post.on != 0 && a.n != 1 {
            return Err(Error::Invalid(format!(
                "the fused q/k/v epilogue takes one row, not {}",
                a.n
            )));
        }
        let (ms, nh, nkv, hd, ch) = (
            a.max_slots as i32,
            a.n_heads as i32,
            a.n_kv_heads as i32,
            a.head_dim as i32,
            a.chunks as i32,
        );
        let q_ld = (a.n_heads * a.head_dim) as i32;
        let (n, rows) = (a.n as i32, self.attn_rows as i32);
        // The parameters the three kernels share, in their order; then attn_rows' row count
        // and rows a block, or the others' epilogue.
        let mut params = vec![
            p(&a.q),
            p(&q_ld),
            p(&a.k_cache),
            p(&a.v_cache),
            p(&ms),
            p(&nh),
            p(&nkv),
            p(&hd),
            p(&a.scale),
            p(&a.batch),
            p(&a.pos),
            p(&a.path),
            p(&a.part_ml),
            p(&a.part_o),
            p(&ch),
            p(&a.arrivals),
            p(&a.out),
            p(&q_ld),
            p(&a.out_q),
            p(&a.out_s),
        ];
        let (name, grid) = if !grouped && a.n > 1 && self.attn_rows > 1 && a.post.on == 0 {
            params.extend([p(&n), p(&rows)]);
            ("attn_rows", attention_rows_grid(a, self.attn_rows))
        } else {
            params.push(p(&a.post));
            let name = if grouped {
                "attn_group"
            } else {
                "attn_partial"
            };
            (name, attention_grid(a, grouped))
        };
        self.launch(name, grid, 128, &mut params)
    }

    /// Moves slots `past + path[t]` to `past + t` in every layer's keys and values.
    pub fn kv_commit(&self, a: &KvCommit) -> Result<()> {
        let (he, nkv, hd, pa, l) = (
            a.head_elems as i64,
            a.n_kv_heads as i32,
            a.head_dim as i32,
            a.past as i32,
            a.len as i32,
        );
        self.launch(
            "kv_commit",
            ((a.layers * a.n_kv_heads) as u32, 1, 1),
            128,
            &mut [
                p(&a.cache),
                p(&he),
                p(&nkv),
                p(&hd),
                p(&pa),
                p(&a.path),
                p(&l),
            ],
        )
    }
}

/// Most candidates [`Kernels::top_k_select`] is asked for by the model's states (their
/// buffers' size; the kernel itself takes any count below the vocabulary).
pub const MAX_TOP_K: usize = 1024;

/// Bits of the largest id of a `vocab`-token row (at least 1).
pub fn id_bits(vocab: usize) -> u32 {
    (usize::BITS - vocab.saturating_sub(1).leading_zeros()).max(1)
}

impl Kernels {
    /// The `count` largest of the `vocab` logits at `row` in the host sampler's order (logit
    /// descending by total order, ties to the smaller id) as `count` (id, logit bits) pairs
    /// of u32 at `out`, in no particular order; and the logits of the `n_gather` ids at
    /// `gather` (u32, each below `vocab`) into `gathered` (f32). `count` below `vocab`.
    #[allow(clippy::too_many_arguments)]
    pub fn top_k_select(
        &self,
        row: u64,
        vocab: usize,
        count: usize,
        gather: u64,
        n_gather: usize,
        out: u64,
        gathered: u64,
    ) -> Result<()> {
        if count == 0 || count >= vocab || i32::try_from(vocab).is_err() {
            return Err(Error::Invalid(format!(
                "a top-{count} selection of {vocab} logits (1..vocab)"
            )));
        }
        let (v, c, b, g) = (
            vocab as i32,
            count as i32,
            id_bits(vocab) as i32,
            n_gather as i32,
        );
        self.launch(
            "top_k_select",
            (1, 1, 1),
            1024,
            &mut [
                p(&row),
                p(&v),
                p(&c),
                p(&b),
                p(&gather),
                p(&g),
                p(&out),
                p(&gathered),
            ],
        )
    }
}

/// Parameters of [`Kernels::kv_commit`]: every layer's cache (`layers` × {keys, values} ×
/// `n_kv_heads` × `head_elems` f16 values), the committed length and the accepted path.
#[derive(Clone, Copy, Debug)]
pub struct KvCommit {
    pub cache: u64,
    pub head_elems: usize,
    pub layers: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub past: usize,
    /// Device address of the path's node indices (i32).
    pub path: u64,
    pub len: usize,
}

/// Parameters of [`Kernels::qkv_post`] (device addresses as u64; 0 for none).
#[derive(Clone, Copy, Debug)]
pub struct QkvPost {
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub n: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub rot_dim: usize,
    pub interleaved: bool,
    pub inv_freq: u64,
    pub q_norm: u64,
    pub k_norm: u64,
    pub eps: f32,
    pub batch: u64,
    pub pos: u64,
    pub k_cache: u64,
    pub v_cache: u64,
    pub max_slots: usize,
}

/// The q/k/v epilogue fused into a decode step's attention (`struct PostArgs` in
/// attention.cu): one chain row, whose query is rotated by each block and whose new key and
/// value are computed by the block that attends to them and written to the cache by it, with
/// the bits [`Kernels::qkv_post`] gives. `on` 0: off.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PostArgs {
    pub k: u64,
    pub v: u64,
    pub inv_freq: u64,
    pub q_norm: u64,
    pub k_norm: u64,
    pub kv_ld: i32,
    pub rot_dim: i32,
    pub interleaved: i32,
    pub eps: f32,
    pub on: i32,
    pub pad: i32,
}

impl PostArgs {
    /// The fused form of the epilogue `p` (its `q`, caches and positions are the attention's).
    pub fn fused(p: &QkvPost) -> PostArgs {
        PostArgs {
            k: p.k,
            v: p.v,
            inv_freq: p.inv_freq,
            q_norm: p.q_norm,
            k_norm: p.k_norm,
            kv_ld: (p.n_kv_heads * p.head_dim) as i32,
            rot_dim: p.rot_dim as i32,
            interleaved: p.interleaved as i32,
            eps: p.eps,
            on: 1,
            pad: 0,
        }
    }
}

/// Parameters of [`Kernels::attention`].
#[derive(Clone, Copy, Debug)]
pub struct AttnCall {
    pub q: u64,
    pub k_cache: u64,
    pub v_cache: u64,
    pub max_slots: usize,
    pub n: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub scale: f32,
    pub batch: u64,
    pub pos: u64,
    pub path: u64,
    pub part_ml: u64,
    pub part_o: u64,
    pub chunks: usize,
    /// Per (row, head) an i32 count of finished chunks: zero before the first call, and
    /// left zero by every call.
    pub arrivals: u64,
    pub out: u64,
    /// The int8 blocks of `out` (0: none; needs head_dim a multiple of 32).
    pub out_q: u64,
    pub out_s: u64,
    /// The fused q/k/v epilogue (default: off).
    pub post: PostArgs,
}

#[cfg(test)]
mod tests;

/// `KASOKU_CUDA_STREAM=1`: products stream their weights through shared memory (opt-in: on an
/// H100 it decoded the 1.5B Q4_K_M shape at 437 tokens/s against the plain kernels' 458).
pub fn stream_asked() -> bool {
    std::env::var("KASOKU_CUDA_STREAM").is_ok_and(|v| v == "1")
}
