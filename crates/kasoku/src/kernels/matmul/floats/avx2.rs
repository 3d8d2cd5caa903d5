//! AVX2/FMA kernel for float weights: column `c` of eight packed rows is one vector (F16 via
//! F16C `vcvtph2ps`, BF16 by widening and shifting), multiplied by the broadcast activation and
//! accumulated per column parity, exactly as the portable kernel (`mod.rs`) does.

use std::arch::x86_64::*;

use super::{ACC, GROUP};
use crate::kernels::matmul::legacy::avx2::PREFETCH;
use crate::quant::DType;

/// See `floats::kernel`.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn kernel(
    dtype: DType,
    w: &[u8],
    kn: usize,
    x: &[f32],
    cols: usize,
    c0: usize,
    xr: usize,
    acc: &mut [f32],
) {
    assert!(w.len() >= kn * GROUP * dtype.block_bytes());
    assert!(
        x.len() >= xr * cols && c0 + kn <= cols && acc.len() == xr * ACC && c0.is_multiple_of(2)
    );
    match (dtype, xr) {
        (DType::F32, 1) => run::<1, 0>(w, kn, x, cols, c0, acc),
        (DType::F32, 2) => run::<2, 0>(w, kn, x, cols, c0, acc),
        (DType::F32, 3) => run::<3, 0>(w, kn, x, cols, c0, acc),
        (DType::F32, _) => run::<4, 0>(w, kn, x, cols, c0, acc),
        (DType::F16, 1) => run::<1, 1>(w, kn, x, cols, c0, acc),
        (DType::F16, 2) => run::<2, 1>(w, kn, x, cols, c0, acc),
        (DType::F16, 3) => run::<3, 1>(w, kn, x, cols, c0, acc),
        (DType::F16, _) => run::<4, 1>(w, kn, x, cols, c0, acc),
        (DType::BF16, 1) => run::<1, 2>(w, kn, x, cols, c0, acc),
        (DType::BF16, 2) => run::<2, 2>(w, kn, x, cols, c0, acc),
        (DType::BF16, 3) => run::<3, 2>(w, kn, x, cols, c0, acc),
        (DType::BF16, _) => run::<4, 2>(w, kn, x, cols, c0, acc),
        _ => unreachable!("not a float format: {dtype}"),
    }
}

/// Column `c` of the chunk (eight rows) as f32: `T` = 0 F32, 1 F16, 2 BF16.
#[inline(always)]
unsafe fn load<const T: u8>(w: *const u8, c: usize) -> __m256 {
    match T {
        0 => _mm256_loadu_ps(w.add(c * 32) as *const f32),
        1 => _mm256_cvtph_ps(_mm_loadu_si128(w.add(c * 16) as *const __m128i)),
        _ => _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(
            _mm_loadu_si128(w.add(c * 16) as *const __m128i),
        ))),
    }
}

#[inline(always)]
unsafe fn run<const XR: usize, const T: u8>(
    w: &[u8],
    kn: usize,
    x: &[f32],
    cols: usize,
    c0: usize,
    acc: &mut [f32],
) {
    let ap = acc.as_mut_ptr();
    let mut a0: [__m256; XR] = std::array::from_fn(|r| _mm256_loadu_ps(ap.add(r * ACC)));
    let mut a1: [__m256; XR] = std::array::from_fn(|r| _mm256_loadu_ps(ap.add(r * ACC + GROUP)));
    let xp: [*const f32; XR] = std::array::from_fn(|r| x.as_ptr().add(r * cols + c0));
    let wp = w.as_ptr();
    let es: usize = if T == 0 { 4 } else { 2 };
    let pairs = kn / 2;
    for c in (0..2 * pairs).step_by(2) {
        _mm_prefetch::<_MM_HINT_T0>(wp.wrapping_add(c * GROUP * es + PREFETCH) as *const i8);
        let w0 = load::<T>(wp, c);
        let w1 = load::<T>(wp, c + 1);
        for r in 0..XR {
            a0[r] = _mm256_fmadd_ps(w0, _mm256_broadcast_ss(&*xp[r].add(c)), a0[r]);
            a1[r] = _mm256_fmadd_ps(w1, _mm256_broadcast_ss(&*xp[r].add(c + 1)), a1[r]);
        }
    }
    if kn % 2 == 1 {
        let c = kn - 1;
        let w0 = load::<T>(wp, c);
        for r in 0..XR {
            a0[r] = _mm256_fmadd_ps(w0, _mm256_broadcast_ss(&*xp[r].add(c)), a0[r]);
        }
    }
    for r in 0..XR {
        _mm256_storeu_ps(ap.add(r * ACC), a0[r]);
        _mm256_storeu_ps(ap.add(r * ACC + GROUP), a1[r]);
    }
}
