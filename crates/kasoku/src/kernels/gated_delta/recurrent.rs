//! The token-by-token recurrent form: per token one pass over each head's state (with AVX2,
//! the update of a token fused with the next token's projections).

use super::{check, for_each_head, GdnDims, GdnInputs, HeadIo};
use crate::kernels::simd::Isa;
use crate::kernels::threads::parts::BlockMut;

/// The token-by-token recurrent form.
pub fn recurrent(dims: &GdnDims, inp: &GdnInputs, n: usize, state: &mut [f32], out: &mut [f32]) {
    recurrent_with(Isa::detect(), dims, inp, n, state, out);
}

/// Recurrent form with an explicit instruction set (tests compare them).
pub(crate) fn recurrent_with(
    isa: Isa,
    dims: &GdnDims,
    inp: &GdnInputs,
    n: usize,
    state: &mut [f32],
    out: &mut [f32],
) {
    check(dims, inp, n, state, out);
    if n == 0 {
        return;
    }
    let d = *dims;
    for_each_head(dims, n, state, out, 3 * d.dv, |h, s, o, work| {
        let io = HeadIo {
            inp,
            dims: d,
            h,
            kh: d.key_head(h),
        };
        recurrent_head(isa, &io, n, s, o, work);
    });
}

/// One head's recurrent form on the best path `isa` allows, with `work` of at least `3·dv`
/// values.
pub(super) fn recurrent_head(
    isa: Isa,
    io: &HeadIo,
    n: usize,
    s: &mut [f32],
    out: &mut BlockMut<f32>,
    work: &mut [f32],
) {
    let dv = io.dims.dv;
    let (kv, rest) = work.split_at_mut(dv);
    let (sq, rest) = rest.split_at_mut(dv);
    let delta = &mut rest[..dv];
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() && dv.is_multiple_of(8) {
        // SAFETY: an `Isa` with AVX2 exists only on CPUs with AVX2, FMA and F16C
        // (`kernels::simd`); `dv % 8 == 0`, `s` is one head's state (`check`) and the work
        // vectors have `dv` values.
        unsafe { super::avx2::recurrent_head(io, n, s, out, kv, sq, delta) };
        return;
    }
    let _ = (isa, sq);
    recurrent_head_portable(io, n, s, out, kv, delta);
}

/// Per token: `kv = Sᵀk`, `sq = Sᵀq` from the old state, then with `α = e^g`:
/// `δ = β(v − α·kv)`, `o = α·sq + (q·k)·δ` (= the updated state read with q) and
/// `S = α·S + k ⊗ δ`.
fn recurrent_head_portable(
    io: &HeadIo,
    n: usize,
    s: &mut [f32],
    out: &mut BlockMut<f32>,
    kv: &mut [f32],
    delta: &mut [f32],
) {
    let (dk, dv) = (io.dims.dk, io.dims.dv);
    for t in 0..n {
        let (q, k, v) = (io.q(t), io.k(t), io.v(t));
        let alpha = io.g(t).exp();
        let o = out.row(t);
        portable_step(s, dk, dv, (q, k, v), alpha, io.beta(t), kv, o, delta);
        portable_update(s, dk, dv, alpha, k, delta);
    }
}

/// One token's outputs from the state before it, portably: `kv = Sᵀk`, `o = Sᵀq` (one pass
/// over S), then `δ = β(v − α·kv)` and `o = α·o + (q·k)·δ`. The recurrent form and the tree
/// form (`tree`) both step through this, so they agree bit for bit.
#[allow(clippy::too_many_arguments)]
pub(super) fn portable_step(
    s: &[f32],
    dk: usize,
    dv: usize,
    (q, k, v): (&[f32], &[f32], &[f32]),
    alpha: f32,
    beta: f32,
    kv: &mut [f32],
    o: &mut [f32],
    delta: &mut [f32],
) {
    kv.fill(0.0);
    o.fill(0.0);
    for i in 0..dk {
        let row = &s[i * dv..(i + 1) * dv];
        let (ki, qi) = (k[i], q[i]);
        for j in 0..dv {
            kv[j] += row[j] * ki;
            o[j] += row[j] * qi;
        }
    }
    let qk: f32 = q.iter().zip(k).map(|(a, b)| a * b).sum();
    for j in 0..dv {
        delta[j] = beta * (v[j] - alpha * kv[j]);
        o[j] = alpha * o[j] + qk * delta[j];
    }
}

/// `S = α·S + k ⊗ δ`, portably.
pub(super) fn portable_update(
    s: &mut [f32],
    dk: usize,
    dv: usize,
    alpha: f32,
    k: &[f32],
    delta: &[f32],
) {
    for i in 0..dk {
        let row = &mut s[i * dv..(i + 1) * dv];
        let ki = k[i];
        for j in 0..dv {
            row[j] = alpha * row[j] + ki * delta[j];
        }
    }
}
