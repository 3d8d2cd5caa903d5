//! Launchers of `mma_packed.cu`: the tensor-core products on a load-time copy of a Q4_K or
//! Q6_K matrix in fragment order. The copy is made on the device from the uploaded GGUF bytes
//! (`mma_pack`, one warp per chunk of 16 rows × 256 values), and a product of a segment that
//! has one runs `mmap_*` on it with mma.cu's split and order, so its outputs have the bits
//! mma.cu gives from the GGUF bytes.

use std::ffi::c_void;

use kasoku::quant::DType;

use super::{matvec_args, mma_split, mma_units, p, Acts, DeviceMatrix, Kernels, MatSeg};
use crate::runtime::{Error, Result};

/// GGML ids of the formats with a packed layout.
const FMT_Q4_K: i32 = 12;
const FMT_Q6_K: i32 = 14;

/// Bytes of one packed chunk (16 rows × 256 values) of `dtype` (PK_*_CHUNK in
/// mma_packed.cu), or `None` for a format without a packed layout.
pub fn packed_chunk_bytes(dtype: DType) -> Option<usize> {
    match dtype {
        DType::Q4K => Some(2368),
        DType::Q6K => Some(3360),
        _ => None,
    }
}

/// Bytes of the packed copy of a `rows × cols` matrix of `dtype` (every tile of 16 rows whole).
pub fn packed_len(dtype: DType, rows: usize, cols: usize) -> Option<usize> {
    let chunk = packed_chunk_bytes(dtype)?;
    (rows > 0 && cols > 0 && cols.is_multiple_of(256))
        .then(|| rows.div_ceil(16) * (cols / 256) * chunk)
}

/// The packed kernel for GGML format `fmt` and `n` activation rows (tiles of 8 rows, 1, 2, 4
/// or 8 of them per pass over the weights, as [`super::mma_kernel`]).
pub fn packed_kernel(fmt: i32, n: usize) -> Option<&'static str> {
    let q4k = match fmt {
        FMT_Q4_K => true,
        FMT_Q6_K => false,
        _ => return None,
    };
    let wide = packed_wide();
    Some(match (q4k, n) {
        (true, 0..=8) => "mmap_q4k_1",
        (true, 9..=16) if wide => "mmap_q4k_2w",
        (false, 9..=16) if wide => "mmap_q6k_2w",
        (true, 9..=16) => "mmap_q4k_2",
        (true, 17..=32) => "mmap_q4k_4",
        (true, _) => "mmap_q4k_8",
        (false, 0..=8) => "mmap_q6k_1",
        (false, 9..=16) => "mmap_q6k_2",
        (false, 17..=32) => "mmap_q6k_4",
        (false, _) => "mmap_q6k_8",
    })
}

/// Whether passes of 9 to 16 rows take the two-tile kernels compiled without a bound on their
/// registers (the default; `KASOKU_CUDA_PACKED_WIDE=0` takes the bounded ones): no spills,
/// fewer warps a multiprocessor, the same bits. On an H100 a 16-row pass of the 1.5B shape
/// cost 2.50 single passes against 2.68, one row the same (bench/results/gpu/2026-12-07d).
/// Read once.
fn packed_wide() -> bool {
    static WIDE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *WIDE.get_or_init(|| !std::env::var("KASOKU_CUDA_PACKED_WIDE").is_ok_and(|v| v == "0"))
}

/// Whether this process packs the matrices its tensor-core plan takes (the default;
/// `KASOKU_CUDA_MMA_PACKED=0` runs them on mma.cu's GGUF reads instead). Read once per
/// [`Kernels::new`].
pub fn packed_asked() -> bool {
    !std::env::var("KASOKU_CUDA_MMA_PACKED").is_ok_and(|v| v == "0")
}

/// Device memory a packed copy must leave free: an eighth of the device (the KV cache,
/// the states and the scratch are allocated after the weights). A matrix whose copy does not
/// fit stays on dp4a.
pub fn packing_reserve(total: usize) -> usize {
    total / 8
}

impl Kernels {
    /// Makes `m`'s fragment-order copy on the device (kept beside the GGUF bytes, which the
    /// prefill products and the embedding still read). An error for a format or width without
    /// a packed layout.
    pub fn pack(&self, m: &mut DeviceMatrix) -> Result<()> {
        let len = packed_len(m.dtype, m.rows, m.cols).ok_or_else(|| {
            Error::Invalid(format!(
                "no packed layout for a {} matrix of {} columns (Q4_K or Q6_K, whole super-blocks)",
                m.dtype, m.cols
            ))
        })?;
        let chunks = m.rows.div_ceil(16) * (m.cols / 256);
        let out = self.gpu.alloc(len)?;
        let (w, row_bytes) = (m.buf.ptr(), m.row_bytes as i64);
        let (rows, cols, fmt) = (m.rows as i32, m.cols as i32, m.dtype.ggml_id() as i32);
        let dst = out.ptr();
        let mut params: [*mut c_void; 6] =
            [p(&w), p(&row_bytes), p(&rows), p(&cols), p(&fmt), p(&dst)];
        self.launch("mma_pack", (chunks as u32, 1, 1), 32, &mut params)?;
        m.packed = Some(out);
        Ok(())
    }

    /// Packs `m` when this process packs ([`packed_asked`]), its plan puts `m` on tensor
    /// cores and the copy leaves [`packing_reserve`] free; returns whether it did.
    pub fn pack_planned(&self, m: &mut DeviceMatrix) -> Result<bool> {
        let Some(len) = packed_len(m.dtype, m.rows, m.cols) else {
            return Ok(false);
        };
        if !self.packs || !self.mma_plan().takes(&m.seg(0, m.rows, None, false)) {
            return Ok(false);
        }
        let (free, total) = self.gpu.memory()?;
        if free < len + packing_reserve(total) {
            return Ok(false);
        }
        self.pack(m)?;
        Ok(true)
    }

    /// Products of segments that all have a packed copy: one launch per format, each block
    /// of `split` warps (mma.cu's, from the width) on one tile of 16 rows.
    pub(super) fn launch_packed(
        &self,
        segs: &[MatSeg],
        x: Acts,
        n: usize,
        cols: usize,
    ) -> Result<()> {
        // Every segment is checked before anything is queued.
        if let Some(s) = segs.iter().find(|s| s.fmt != FMT_Q4_K && s.fmt != FMT_Q6_K) {
            return Err(Error::Invalid(format!(
                "packed product of format {} (Q4_K and Q6_K only)",
                s.fmt
            )));
        }
        if segs.iter().any(|s| s.packed == 0) || !cols.is_multiple_of(256) {
            return Err(Error::Invalid(format!(
                "packed product of {cols} columns without a packed copy of every segment"
            )));
        }
        for fmt in [FMT_Q4_K, FMT_Q6_K] {
            let group: Vec<MatSeg> = segs.iter().filter(|s| s.fmt == fmt).copied().collect();
            if group.is_empty() {
                continue;
            }
            let (mut args, _) = matvec_args(&group, x, n, cols)?;
            let split = mma_split(cols, mma_units());
            args.split = split as i32;
            let tiles: usize = group.iter().map(|s| (s.rows as usize).div_ceil(16)).sum();
            let kernel = packed_kernel(fmt, n).expect("a packed format");
            self.gpu.launch_shared(
                self.module.function(kernel),
                (tiles as u32, 1, 1),
                (split * 32) as u32,
                0,
                &mut [p(&args)],
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_sizes_cover_whole_tiles_and_refuse_other_formats() {
        assert_eq!(packed_chunk_bytes(DType::Q4K), Some(16 * 148));
        assert_eq!(packed_chunk_bytes(DType::Q6K), Some(16 * 210));
        // 17 rows take two tiles; 1536 columns six super-blocks.
        assert_eq!(packed_len(DType::Q4K, 17, 1536), Some(2 * 6 * 2368));
        assert_eq!(packed_len(DType::Q4K, 16, 1536), Some(6 * 2368));
        assert_eq!(packed_len(DType::Q4_0, 16, 1536), None);
        assert_eq!(packed_len(DType::Q6K, 16, 100), None);
        assert_eq!(packed_len(DType::Q6K, 0, 256), None);
    }

    #[test]
    fn packed_kernels_take_the_tile_counts_of_mma() {
        for n in [1usize, 8, 9, 16, 17, 32, 33, 64] {
            let mma = super::super::mma_kernel(n);
            let q4 = packed_kernel(FMT_Q4_K, n).unwrap();
            let q6 = packed_kernel(FMT_Q6_K, n).unwrap();
            // mma_N and mmap_*_N (or its wide twin Nw): the same N activation tiles a pass.
            let tiles = |k: &str| {
                k.rsplit('_')
                    .next()
                    .unwrap()
                    .trim_end_matches('w')
                    .to_string()
            };
            assert_eq!(tiles(mma), tiles(q4), "n = {n}");
            assert_eq!(tiles(mma), tiles(q6), "n = {n}");
        }
        assert_eq!(packed_kernel(2, 1), None);
        for name in [
            "mma_pack",
            "mmap_q4k_1",
            "mmap_q6k_8",
            "mmap_q4k_2w",
            "mmap_q6k_2w",
        ] {
            assert!(super::super::NAMES.contains(&name), "{name}");
        }
    }
}
