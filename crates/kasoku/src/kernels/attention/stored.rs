//! The formats a KV cache keeps its rows in, as attention reads them: f32, f16 (IEEE half)
//! and q8_0 (GGML's Q8_0, as llama.cpp stores its `-ctk q8_0` caches: blocks of 32 values,
//! each an f16 scale `d` and 32 int8 `q`, value `d·q`).
//!
//! Attention reads the stored rows directly: each value it uses is the row's value converted
//! to f32 (exactly for f16; for q8_0 the f32 product `d·q`, one rounding) by the same rule on
//! every path, so attention over a stored cache gives the bits of attention over that cache
//! dequantized to f32 first.

use half::f16;

/// Values per q8_0 block.
pub const Q8_0_BLOCK: usize = 32;

/// One q8_0 block: the scale and 32 codes (34 bytes, GGML's layout).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[repr(C)]
pub struct BlockQ8_0 {
    pub d: f16,
    pub qs: [i8; Q8_0_BLOCK],
}

/// An element type of stored KV rows.
pub trait Stored: Copy + Default + Send + Sync + 'static {
    /// Values per element: a row of `head_dim` values is `head_dim / VALUES` elements (rows
    /// whose size is not a multiple cannot be stored).
    const VALUES: usize;
    /// Stores `x` (one row) into `out` (`x.len() / VALUES` elements).
    fn store(x: &[f32], out: &mut [Self]);
    /// The row's values as f32 into `out` (`out.len()` values).
    fn load(row: &[Self], out: &mut [f32]);
    /// The row itself when it is already f32 (nothing to convert).
    fn as_f32(row: &[Self]) -> Option<&[f32]>;
    /// Heads of rows in this format, as attention takes them.
    fn heads<'a>(heads: &'a [&'a [Self]]) -> KvHeads<'a>;
    /// The eight values `d..d + 8` of the row at `row` (`d % 8 == 0`), converted as
    /// [`Stored::load`] converts them.
    ///
    /// # Safety
    /// AVX2, FMA and F16C must be available; the row must hold the values `d..d + 8`.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(row: *const Self, d: usize) -> std::arch::x86_64::__m256;
}

impl Stored for f32 {
    const VALUES: usize = 1;

    fn store(x: &[f32], out: &mut [f32]) {
        out.copy_from_slice(x);
    }

    fn load(row: &[f32], out: &mut [f32]) {
        out.copy_from_slice(&row[..out.len()]);
    }

    fn as_f32(row: &[f32]) -> Option<&[f32]> {
        Some(row)
    }

    fn heads<'a>(heads: &'a [&'a [f32]]) -> KvHeads<'a> {
        KvHeads::F32(heads)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(row: *const f32, d: usize) -> std::arch::x86_64::__m256 {
        // SAFETY: the caller promises AVX and the values `d..d + 8`.
        unsafe { std::arch::x86_64::_mm256_loadu_ps(row.add(d)) }
    }
}

impl Stored for f16 {
    const VALUES: usize = 1;

    fn store(x: &[f32], out: &mut [f16]) {
        for (o, &v) in out.iter_mut().zip(x) {
            *o = f16::from_f32(v);
        }
    }

    fn load(row: &[f16], out: &mut [f32]) {
        for (o, v) in out.iter_mut().zip(row) {
            *o = v.to_f32();
        }
    }

    fn as_f32(_: &[f16]) -> Option<&[f32]> {
        None
    }

    fn heads<'a>(heads: &'a [&'a [f16]]) -> KvHeads<'a> {
        KvHeads::F16(heads)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(row: *const f16, d: usize) -> std::arch::x86_64::__m256 {
        // SAFETY: the caller promises F16C and the values `d..d + 8`.
        unsafe { super::avx2::load8_f16(row.add(d)) }
    }
}

impl Stored for BlockQ8_0 {
    const VALUES: usize = Q8_0_BLOCK;

    /// GGML's reference rule (`quantize_row_q8_0_ref`): `d = max|x| / 127`, codes
    /// `round(x / d)` with ties away from zero, computed with the f32 `d`, which is then
    /// stored as f16.
    fn store(x: &[f32], out: &mut [BlockQ8_0]) {
        for (xb, o) in x.chunks_exact(Q8_0_BLOCK).zip(out) {
            let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
            let d = amax / 127.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            o.d = f16::from_f32(d);
            for (q, v) in o.qs.iter_mut().zip(xb) {
                *q = (v * id).round() as i8;
            }
        }
    }

    fn load(row: &[BlockQ8_0], out: &mut [f32]) {
        for (b, o) in row.iter().zip(out.chunks_mut(Q8_0_BLOCK)) {
            let d = b.d.to_f32();
            for (o, &q) in o.iter_mut().zip(&b.qs) {
                *o = d * q as f32;
            }
        }
    }

    fn as_f32(_: &[BlockQ8_0]) -> Option<&[f32]> {
        None
    }

    fn heads<'a>(heads: &'a [&'a [BlockQ8_0]]) -> KvHeads<'a> {
        KvHeads::Q8_0(heads)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(row: *const BlockQ8_0, d: usize) -> std::arch::x86_64::__m256 {
        // SAFETY: the caller promises AVX2/F16C and the values `d..d + 8`, which lie in
        // block `d / 32` (8 divides 32).
        unsafe { super::avx2::load8_q8_0(row.add(d / Q8_0_BLOCK), d % Q8_0_BLOCK) }
    }
}

/// Every KV head's rows of one layer's keys (or values), `[position][head_dim]` per head, in
/// one stored format.
#[derive(Clone, Copy, Debug)]
pub enum KvHeads<'a> {
    F32(&'a [&'a [f32]]),
    F16(&'a [&'a [f16]]),
    Q8_0(&'a [&'a [BlockQ8_0]]),
}

impl<'a> From<&'a [&'a [f32]]> for KvHeads<'a> {
    fn from(heads: &'a [&'a [f32]]) -> Self {
        KvHeads::F32(heads)
    }
}

impl KvHeads<'_> {
    /// Heads held.
    pub fn len(&self) -> usize {
        match self {
            KvHeads::F32(h) => h.len(),
            KvHeads::F16(h) => h.len(),
            KvHeads::Q8_0(h) => h.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
