//! Launchers of the prefill products on f16 tensor cores (`gemm.cu`): the weights of one to
//! three matrices of one width are expanded to f16 in a scratch buffer, the f32 activations
//! converted beside them, and one tiled `mma.sync` product writes every segment's output
//! (products too small to fill the GPU split K and add the parts in a second kernel).
//! For passes of many rows only (prefill): the bits differ from [`Kernels::matvec`]'s.

use kasoku::quant::DType;

use super::{matvec_supports, p, Acts, Kernels, MatSeg};
use crate::runtime::{Error, Result};

/// One segment's output in `struct GemmOut` (gemm.cu).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GemmOut {
    pub y: u64,
    pub bias: u64,
    pub rows: i32,
    pub ldy: i32,
    pub accumulate: i32,
    pub pad: i32,
}

/// The parameter block of the `gemm_<BM>x<BN>` kernels (`struct GemmArgs`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GemmArgs {
    pub out: [GemmOut; 3],
    pub w: u64,
    pub x: u64,
    pub part: u64,
    pub nseg: i32,
    pub rows: i32,
    pub cols: i32,
    pub n: i32,
    pub splits: i32,
    pub kper: i32,
}

/// One matrix to expand (`struct DequantSeg`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DequantSeg {
    pub w: u64,
    pub row_bytes: i64,
    pub fmt: i32,
    pub rows: i32,
}

/// The parameter block of `gemm_prepare` (`struct PrepArgs`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrepArgs {
    pub seg: [DequantSeg; 3],
    pub w16: u64,
    pub x: u64,
    pub x16: u64,
    pub w_units: i64,
    pub x_units: i64,
    pub nseg: i32,
    pub cols: i32,
    pub ldx: i32,
    pub w_blocks: i32,
}

/// Threads per block of `gemm_prepare` and `gemm_reduce`.
const PREPARE_THREADS: usize = 256;
/// Values of K per shared-memory slice (GEMM_BK in gemm.cu).
pub const GEMM_BK: usize = 32;
/// Most blocks one tile's K is split over.
pub const GEMM_MAX_SPLITS: usize = 4;
/// Fewest K slices a split takes (shorter ones pay the pipeline's start for little work).
const MIN_SLICES_PER_SPLIT: usize = 16;

/// Device room the prefill products work in: f16 weights (`[Σ rows][cols]` of the largest
/// product), f16 activations (`[n][cols]`) and the f32 partial sums of split products
/// (`[splits][n][rows]`; products whose parts do not fit split less).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GemmScratch {
    pub w16: u64,
    pub w16_bytes: usize,
    pub x16: u64,
    pub x16_bytes: usize,
    pub part: u64,
    pub part_bytes: usize,
}

/// The tile shapes of the product kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmTile {
    /// 128 activation rows × 128 weight rows per block of 8 warps.
    Large,
    /// 64 × 64 per block of 4 warps, for products too small to fill the GPU otherwise.
    Small,
}

impl GemmTile {
    pub const ALL: [GemmTile; 2] = [GemmTile::Large, GemmTile::Small];

    /// The kernel's name.
    pub fn kernel(self) -> &'static str {
        match self {
            GemmTile::Large => "gemm_128x128",
            GemmTile::Small => "gemm_64x64",
        }
    }

    /// (activation rows, weight rows) per block.
    pub fn dims(self) -> (usize, usize) {
        match self {
            GemmTile::Large => (128, 128),
            GemmTile::Small => (64, 64),
        }
    }

    pub fn threads(self) -> u32 {
        match self {
            GemmTile::Large => 256,
            GemmTile::Small => 128,
        }
    }

    /// The grid of blocks for `n` activation rows and `rows` weight rows.
    pub fn grid(self, n: usize, rows: usize) -> (usize, usize) {
        let (bm, bn) = self.dims();
        (n.div_ceil(bm), rows.div_ceil(bn))
    }
}

/// The tile for a product of `n` activation rows and `rows` weight rows on a GPU of `sms`
/// multiprocessors: 128×128 when that makes at least a block per multiprocessor, else 64×64
/// (four times the blocks: a 1536-row product at 512 activation rows makes 48 large tiles,
/// 192 small ones).
pub fn gemm_tile(n: usize, rows: usize, sms: usize) -> GemmTile {
    let (a, b) = GemmTile::Large.grid(n, rows);
    if a * b >= sms {
        GemmTile::Large
    } else {
        GemmTile::Small
    }
}

/// How a product of `n` activation rows, `rows` weight rows and `cols` columns runs on a GPU
/// of `sms` multiprocessors: the tile ([`gemm_tile`]) and the blocks each tile's K is split
/// over. Splits (at most `max_splits`, each at least 16 K slices, their partial sums within
/// `part_bytes`) are added while the blocks number fewer than 4 per multiprocessor: at 512
/// rows, 1.5B's down product (1536 × 8960) takes 192 small tiles × 3 splits, gate|up none.
pub fn gemm_plan(
    n: usize,
    rows: usize,
    cols: usize,
    sms: usize,
    part_bytes: usize,
    max_splits: usize,
) -> (GemmTile, usize) {
    let tile = gemm_tile(n, rows, sms);
    let (gx, gy) = tile.grid(n, rows);
    let slices = cols.div_ceil(GEMM_BK);
    let mut splits = 1;
    while splits < max_splits.min(GEMM_MAX_SPLITS)
        && gx * gy * splits < 4 * sms
        && slices / (splits + 1) >= MIN_SLICES_PER_SPLIT
        && (splits + 1) * n * rows * 4 <= part_bytes
    {
        splits += 1;
    }
    (tile, splits)
}

/// Values per `gemm_prepare` unit of a row of GGML type `fmt`: 8 for float formats, 32 for
/// block formats (a block, or a sub-block of a K-quant super-block).
pub fn prepare_unit(fmt: i32) -> usize {
    if super::is_block_format(fmt) {
        32
    } else {
        8
    }
}

/// The f16 scratch bytes a product of `rows` weight rows (all segments) and `n` activation
/// rows of `cols` columns needs: (weights, activations).
pub fn gemm_scratch_bytes(rows: usize, n: usize, cols: usize) -> (usize, usize) {
    (rows * cols * 2, n * cols * 2)
}

/// The f32 workspace bytes of a product of `rows` weight rows at `n` activation rows split
/// `splits` ways (none unsplit).
pub fn gemm_part_bytes(rows: usize, n: usize, splits: usize) -> usize {
    if splits > 1 {
        splits * n * rows * 4
    } else {
        0
    }
}

/// Checks a prefill product's segments, activations and scratch; returns Σ rows.
fn check_product(
    segs: &[MatSeg],
    x: Acts,
    n: usize,
    cols: usize,
    scratch: &GemmScratch,
) -> Result<usize> {
    if segs.is_empty() || segs.len() > 3 {
        return Err(Error::Invalid(format!(
            "prefill product of {} matrices (1 to 3)",
            segs.len()
        )));
    }
    for s in segs {
        let dtype = DType::from_ggml_id(s.fmt as u32)
            .filter(|_| s.fmt >= 0)
            .ok_or_else(|| Error::Invalid(format!("prefill product of GGML type {}", s.fmt)))?;
        if !matvec_supports(dtype, cols) {
            return Err(Error::Invalid(format!(
                "prefill product of {dtype} with {cols} columns (whole blocks; floats: multiples of 8)"
            )));
        }
        if dtype.bytes_for(cols) != Some(s.row_bytes as usize) || s.rows < 0 {
            return Err(Error::Invalid(format!(
                "prefill product of {dtype}: {} rows of {} bytes for {cols} columns",
                s.rows, s.row_bytes
            )));
        }
        if s.best != 0 {
            return Err(Error::Invalid(
                "prefill product with a fused argmax (matvec only)".into(),
            ));
        }
        if (s.ldy as usize) < s.rows as usize || s.ldy < 0 {
            return Err(Error::Invalid(format!(
                "prefill product: output stride {} for {} rows",
                s.ldy, s.rows
            )));
        }
    }
    if cols == 0 || x.ld < cols || !x.ld.is_multiple_of(4) {
        return Err(Error::Invalid(format!(
            "prefill product: activation stride {} for {cols} columns (must be ≥ and a multiple \
             of 4)",
            x.ld
        )));
    }
    let rows: usize = segs.iter().map(|s| s.rows as usize).sum();
    let (w_bytes, x_bytes) = gemm_scratch_bytes(rows, n, cols);
    if w_bytes > scratch.w16_bytes || x_bytes > scratch.x16_bytes {
        return Err(Error::Invalid(format!(
            "prefill product of {rows}x{cols} at {n} rows: needs {w_bytes} + {x_bytes} bytes \
             of f16 scratch, has {} + {}",
            scratch.w16_bytes, scratch.x16_bytes
        )));
    }
    let (_, tiles_y) = GemmTile::Small.grid(n, rows);
    if i32::try_from(rows).is_err()
        || i32::try_from(n).is_err()
        || i32::try_from(cols).is_err()
        || tiles_y > 65535
    {
        return Err(Error::Invalid(format!(
            "prefill product {rows}x{cols} at {n} rows too large"
        )));
    }
    Ok(rows)
}

/// `gemm_prepare`'s parameters for `segs` and `n` activation rows `x`, with its grid size.
pub fn prepare_args(
    segs: &[MatSeg],
    x: Acts,
    n: usize,
    cols: usize,
    scratch: &GemmScratch,
) -> Result<(PrepArgs, u32)> {
    check_product(segs, x, n, cols, scratch)?;
    let mut a = PrepArgs {
        w16: scratch.w16,
        x: x.x,
        x16: scratch.x16,
        nseg: segs.len() as i32,
        cols: cols as i32,
        ldx: x.ld as i32,
        ..PrepArgs::default()
    };
    for (d, s) in a.seg.iter_mut().zip(segs) {
        *d = DequantSeg {
            w: s.w,
            row_bytes: s.row_bytes,
            fmt: s.fmt,
            rows: s.rows,
        };
        a.w_units += s.rows as i64 * (cols / prepare_unit(s.fmt)) as i64;
    }
    a.x_units = (n * cols / 8) as i64;
    let w_blocks = (a.w_units as usize).div_ceil(PREPARE_THREADS);
    let x_blocks = (a.x_units as usize).div_ceil(PREPARE_THREADS);
    let grid = u32::try_from(w_blocks + x_blocks)
        .ok()
        .filter(|&g| g < i32::MAX as u32)
        .ok_or_else(|| Error::Invalid(format!("prefill product of {} units", a.w_units)))?;
    a.w_blocks = w_blocks as i32;
    Ok((a, grid))
}

/// The product kernel's parameters for `segs` over `n` activation rows (already in the
/// scratch, as `gemm_prepare` leaves them), K split over `splits` blocks per tile (fewer
/// where the slices run out: no split is empty).
pub fn product_args(
    segs: &[MatSeg],
    x: Acts,
    n: usize,
    cols: usize,
    scratch: &GemmScratch,
    splits: usize,
) -> Result<GemmArgs> {
    let rows = check_product(segs, x, n, cols, scratch)?;
    let slices = cols.div_ceil(GEMM_BK);
    if splits == 0 || splits > GEMM_MAX_SPLITS {
        return Err(Error::Invalid(format!(
            "prefill product split {splits} ways (1 to {GEMM_MAX_SPLITS})"
        )));
    }
    let kper = slices.div_ceil(splits);
    let splits = slices.div_ceil(kper);
    let part = gemm_part_bytes(rows, n, splits);
    if part > scratch.part_bytes {
        return Err(Error::Invalid(format!(
            "prefill product {rows}x{cols} at {n} rows split {splits} ways: needs {part} bytes \
             of partial sums, has {}",
            scratch.part_bytes
        )));
    }
    let mut a = GemmArgs {
        w: scratch.w16,
        x: scratch.x16,
        part: scratch.part,
        nseg: segs.len() as i32,
        rows: rows as i32,
        cols: cols as i32,
        n: n as i32,
        splits: splits as i32,
        kper: kper as i32,
        ..GemmArgs::default()
    };
    for (o, s) in a.out.iter_mut().zip(segs) {
        *o = GemmOut {
            y: s.y,
            bias: s.bias,
            rows: s.rows,
            ldy: s.ldy,
            accumulate: s.accumulate,
            pad: 0,
        };
    }
    Ok(a)
}

/// Most K splits per tile in this process: `KASOKU_CUDA_GEMM_SPLITS` (1 to 4, for measuring;
/// 1 turns splitting off), else 4.
fn gemm_max_splits() -> usize {
    std::env::var("KASOKU_CUDA_GEMM_SPLITS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|v| (1..=GEMM_MAX_SPLITS).contains(v))
        .unwrap_or(GEMM_MAX_SPLITS)
}

impl Kernels {
    /// `seg.y[r][j] (+)= Σ_c x[r][c] · W[j][c] (+ bias[j])` for every segment, on f16 tensor
    /// cores through `scratch` (compute capability 8.0 or later): [`Kernels::gemm_prepare`]
    /// then [`Kernels::gemm_product`] as [`gemm_plan`] says (at most `KASOKU_CUDA_GEMM_SPLITS`
    /// splits, for measuring; 4 by default). For prefill passes; results are not
    /// batch-invariant with [`Kernels::matvec`].
    pub fn gemm(
        &self,
        segs: &[MatSeg],
        x: Acts,
        n: usize,
        cols: usize,
        scratch: &GemmScratch,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        self.gemm_prepare(segs, x, n, cols, scratch)?;
        let rows = segs.iter().map(|s| s.rows.max(0) as usize).sum();
        let (tile, splits) = gemm_plan(
            n,
            rows,
            cols,
            self.gpu.multiprocessors,
            scratch.part_bytes,
            gemm_max_splits(),
        );
        self.gemm_product(segs, x, n, cols, scratch, tile, splits)
    }

    /// Expands the segments' weights to f16 into `scratch.w16` (one after another) and the
    /// activations `x` into `scratch.x16`.
    pub fn gemm_prepare(
        &self,
        segs: &[MatSeg],
        x: Acts,
        n: usize,
        cols: usize,
        scratch: &GemmScratch,
    ) -> Result<()> {
        self.check_tensor_cores()?;
        let (args, grid) = prepare_args(segs, x, n, cols, scratch)?;
        self.launch(
            "gemm_prepare",
            (grid, 1, 1),
            PREPARE_THREADS as u32,
            &mut [p(&args)],
        )
    }

    /// The product of what [`Kernels::gemm_prepare`] left in `scratch`, into the segments'
    /// outputs, with the given tile shape and K split `splits` ways (then `gemm_reduce` adds
    /// the parts).
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_product(
        &self,
        segs: &[MatSeg],
        x: Acts,
        n: usize,
        cols: usize,
        scratch: &GemmScratch,
        tile: GemmTile,
        splits: usize,
    ) -> Result<()> {
        self.check_tensor_cores()?;
        let args = product_args(segs, x, n, cols, scratch, splits)?;
        let (gx, gy) = tile.grid(n, args.rows as usize);
        self.launch(
            tile.kernel(),
            (gx as u32, gy as u32, args.splits as u32),
            tile.threads(),
            &mut [p(&args)],
        )?;
        if args.splits > 1 {
            let outputs = n * args.rows as usize;
            self.launch(
                "gemm_reduce",
                (outputs.div_ceil(PREPARE_THREADS) as u32, 1, 1),
                PREPARE_THREADS as u32,
                &mut [p(&args)],
            )?;
        }
        Ok(())
    }

    /// Whether this device runs the prefill products (f16 `mma.sync`: 8.0 or later).
    pub fn has_gemm(&self) -> bool {
        self.gpu.capability.0 >= 8
    }

    fn check_tensor_cores(&self) -> Result<()> {
        if self.has_gemm() {
            Ok(())
        } else {
            Err(Error::Invalid(format!(
                "prefill products need compute capability 8.0 (this GPU: {}.{})",
                self.gpu.capability.0, self.gpu.capability.1
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameter_blocks_have_the_cuda_layout() {
        // GemmOut: 2 pointers + 4 ints = 32 bytes; GemmArgs: 3 outs, 3 pointers, 6 ints.
        assert_eq!(std::mem::size_of::<GemmOut>(), 32);
        assert_eq!(std::mem::size_of::<GemmArgs>(), 144);
        assert_eq!(std::mem::offset_of!(GemmArgs, w), 96);
        assert_eq!(std::mem::offset_of!(GemmArgs, part), 112);
        assert_eq!(std::mem::offset_of!(GemmArgs, n), 132);
        assert_eq!(std::mem::offset_of!(GemmArgs, kper), 140);
        // DequantSeg: pointer, long long, 2 ints = 24; PrepArgs: 3 segs, 3 pointers,
        // 2 long longs, 4 ints = 128. (gemm.cu asserts the same sizes and offsets.)
        assert_eq!(std::mem::size_of::<DequantSeg>(), 24);
        assert_eq!(std::mem::size_of::<PrepArgs>(), 128);
        assert_eq!(std::mem::offset_of!(PrepArgs, w16), 72);
        assert_eq!(std::mem::offset_of!(PrepArgs, w_units), 96);
        assert_eq!(std::mem::offset_of!(PrepArgs, nseg), 112);
        assert_eq!(std::mem::offset_of!(PrepArgs, w_blocks), 124);
    }

    fn seg(dtype: DType, rows: usize, cols: usize) -> MatSeg {
        MatSeg {
            w: 0x1000,
            y: 0x2000,
            row_bytes: dtype.bytes_for(cols).unwrap() as i64,
            fmt: dtype.ggml_id() as i32,
            rows: rows as i32,
            ldy: rows as i32,
            ..MatSeg::default()
        }
    }

    fn acts(ld: usize) -> Acts {
        Acts {
            x: 0x3000,
            ld,
            ..Acts::default()
        }
    }

    fn scratch(w: usize, x: usize) -> GemmScratch {
        GemmScratch {
            w16: 0x4000,
            w16_bytes: w,
            x16: 0x5000,
            x16_bytes: x,
            part: 0x6000,
            part_bytes: 1 << 30,
        }
    }

    #[test]
    fn small_products_take_small_tiles() {
        // 1.5B at 512 rows on 132 SMs: gate|up fills the GPU with large tiles, the rest not.
        assert_eq!(gemm_tile(512, 2 * 8960, 132), GemmTile::Large);
        assert_eq!(gemm_tile(512, 1536 + 2 * 256, 132), GemmTile::Small);
        assert_eq!(gemm_tile(512, 1536, 132), GemmTile::Small);
        assert_eq!(GemmTile::Large.grid(65, 300), (1, 3));
        assert_eq!(GemmTile::Small.grid(65, 300), (2, 5));
        assert_eq!(GemmTile::Small.grid(512, 1536), (8, 24));
    }

    #[test]
    fn products_too_small_for_the_gpu_split_k() {
        let part = 4 * 512 * 2048 * 4;
        // 1.5B at 512 rows on 132 SMs: gate|up fills the GPU unsplit (560 large tiles); down,
        // o (192 small tiles) and q|k|v (256) take 3 splits (576 and 768 blocks).
        assert_eq!(
            gemm_plan(512, 17920, 1536, 132, part, 4),
            (GemmTile::Large, 1)
        );
        assert_eq!(
            gemm_plan(512, 1536, 8960, 132, part, 4),
            (GemmTile::Small, 3)
        );
        assert_eq!(
            gemm_plan(512, 1536, 1536, 132, part, 4),
            (GemmTile::Small, 3)
        );
        assert_eq!(
            gemm_plan(512, 2048, 1536, 132, part, 4),
            (GemmTile::Small, 3)
        );
        // Off by the process's limit, and where the parts do not fit.
        assert_eq!(
            gemm_plan(512, 1536, 8960, 132, part, 1),
            (GemmTile::Small, 1)
        );
        assert_eq!(
            gemm_plan(512, 1536, 8960, 132, 2 * 512 * 1536 * 4, 4),
            (GemmTile::Small, 2)
        );
        // Short rows: at least 16 slices a split.
        assert_eq!(gemm_plan(100, 64, 1024, 132, part, 4), (GemmTile::Small, 2));
        assert_eq!(gemm_plan(100, 64, 512, 132, part, 4), (GemmTile::Small, 1));
    }

    #[test]
    fn splits_cover_k_without_empty_ones() {
        let segs = [seg(DType::Q4K, 1536, 8960)];
        let s = scratch(1 << 30, 1 << 30);
        // 280 slices over 4 splits: 70 each.
        let a = product_args(&segs, acts(8960), 512, 8960, &s, 4).unwrap();
        assert_eq!((a.splits, a.kper, a.part), (4, 70, 0x6000));
        // 9 slices (264 columns) over 4: 3 per split, so 3 splits.
        let f = [seg(DType::F32, 8, 264)];
        let a = product_args(&f, acts(264), 100, 264, &s, 4).unwrap();
        assert_eq!((a.splits, a.kper), (3, 3));
        let a = product_args(&f, acts(264), 100, 264, &s, 1).unwrap();
        assert_eq!((a.splits, a.kper), (1, 9));
        assert!(product_args(&f, acts(264), 100, 264, &s, 0).is_err());
        assert!(product_args(&f, acts(264), 100, 264, &s, 5).is_err());
        let tight = GemmScratch {
            part_bytes: 2 * 100 * 8 * 4,
            ..s
        };
        assert!(product_args(&f, acts(264), 100, 264, &tight, 2).is_ok());
        let e = product_args(&f, acts(264), 100, 264, &tight, 3)
            .unwrap_err()
            .to_string();
        assert!(e.contains("partial sums"), "{e}");
        assert_eq!(gemm_part_bytes(8, 100, 1), 0);
    }

    #[test]
    fn prepare_covers_every_unit_of_weights_and_activations() {
        let segs = [
            seg(DType::Q4K, 100, 512),
            seg(DType::F16, 20, 512),
            seg(DType::Q6K, 7, 512),
        ];
        let (a, grid) =
            prepare_args(&segs, acts(512), 65, 512, &scratch(1 << 20, 1 << 20)).unwrap();
        // Block formats: 16 units of 32 per row; F16: 64 of 8.
        assert_eq!(a.w_units, 100 * 16 + 20 * 64 + 7 * 16);
        assert_eq!(a.x_units, 65 * 512 / 8);
        assert_eq!(a.w_blocks, 2992usize.div_ceil(256) as i32);
        assert_eq!(grid as usize, 12 + (65 * 64usize).div_ceil(256));
        assert_eq!((a.nseg, a.cols, a.ldx), (3, 512, 512));
        assert_eq!(a.seg[2].fmt, 14);
    }

    #[test]
    fn product_outputs_follow_the_segments() {
        let mut segs = [seg(DType::Q4K, 1536, 1536), seg(DType::Q4K, 256, 1536)];
        segs[1].bias = 0x77;
        segs[1].accumulate = 1;
        let a = product_args(&segs, acts(1536), 300, 1536, &scratch(1 << 30, 1 << 30), 1).unwrap();
        assert_eq!((a.nseg, a.rows, a.cols, a.n), (2, 1792, 1536, 300));
        assert_eq!((a.w, a.x), (0x4000, 0x5000));
        assert_eq!(a.out[1].bias, 0x77);
        assert_eq!(a.out[1].accumulate, 1);
        assert_eq!(a.out[2], GemmOut::default());
    }

    #[test]
    fn bad_products_are_refused_with_the_reason() {
        let s = scratch(1 << 30, 1 << 30);
        let err = |segs: &[MatSeg], ld: usize, n: usize, cols: usize, sc: &GemmScratch| {
            product_args(segs, acts(ld), n, cols, sc, 1)
                .unwrap_err()
                .to_string()
        };
        assert!(err(&[], 512, 100, 512, &s).contains("0 matrices"));
        let four = [seg(DType::F16, 8, 512); 4];
        assert!(err(&four, 512, 100, 512, &s).contains("4 matrices"));
        // Q4_K rows are whole super-blocks.
        let mut q = seg(DType::Q4K, 8, 512);
        assert!(err(&[q], 512, 100, 256 + 32, &s).contains("whole blocks"));
        q.best = 1;
        assert!(err(&[q], 512, 100, 512, &s).contains("argmax"));
        let f = seg(DType::F32, 8, 264);
        assert!(product_args(&[f], acts(264), 100, 264, &s, 1).is_ok());
        assert!(err(&[f], 260, 100, 264, &s).contains("activation stride"));
        let mut bad = seg(DType::Q8_0, 8, 64);
        bad.fmt = 5;
        assert!(err(&[bad], 64, 100, 64, &s).contains("GGML type 5"));
        let small = scratch(8 * 512 * 2, 100 * 512 * 2);
        assert!(product_args(&[seg(DType::Q8_0, 8, 512)], acts(512), 100, 512, &small, 1).is_ok());
        assert!(err(&[seg(DType::Q8_0, 9, 512)], 512, 100, 512, &small).contains("scratch"));
        assert!(err(&[seg(DType::Q8_0, 8, 512)], 512, 101, 512, &small).contains("scratch"));
    }

    #[test]
    fn units_are_blocks_or_eight_floats() {
        for d in DType::ALL {
            let want = if d.is_quantized() { 32 } else { 8 };
            assert_eq!(prepare_unit(d.ggml_id() as i32), want, "{d}");
        }
        assert_eq!(
            gemm_scratch_bytes(17920, 512, 1536),
            (17920 * 1536 * 2, 512 * 1536 * 2)
        );
    }
}
