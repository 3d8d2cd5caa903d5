//! `RmsNorm`: a norm weight with its epsilon. The `(1 + w)` convention of HF Qwen3.5 is
//! resolved at load (the stored `w` gets +1), so one kernel serves every family.

use crate::backend::{Backend, BufVec, Cpu, Epilogue, Fused, Norm, NormInPlace};
use crate::format::Claims;

use super::{weights, ModelError};

#[derive(Clone, Debug)]
pub struct RmsNorm<B: Backend = Cpu> {
    /// Effective weight (already `1 + w` where the checkpoint stores `w`), in `B`'s memory.
    pub weight: B::Vec,
    pub eps: f32,
}

impl<B: Backend> RmsNorm<B> {
    /// Loads `name` (`dim` values) into `b`'s memory; `offset_one` adds 1 to every weight.
    pub fn load(
        b: &B,
        claims: &Claims,
        name: &str,
        dim: usize,
        eps: f32,
        offset_one: bool,
    ) -> Result<RmsNorm<B>, ModelError> {
        let mut weight = weights::vector(claims, name, dim)?;
        if offset_one {
            weight.iter_mut().for_each(|w| *w += 1.0);
        }
        Ok(RmsNorm {
            weight: b.upload(&weight),
            eps,
        })
    }

    pub fn dim(&self) -> usize {
        self.weight.len()
    }

    /// Normalises each `dim`-value row of `x` into `out` on `b`.
    #[inline]
    pub fn forward(&self, b: &B, x: &B::Buffer, out: &mut B::Buffer) {
        b.rmsnorm(Norm {
            x,
            weight: self.weight.all(),
            eps: self.eps,
            out,
        });
    }

    /// [`RmsNorm::forward`], or, when `into` names a matrix, the rows written into
    /// `prepared` for products with it (and the matrices that share its input) instead of
    /// into `out`.
    #[inline]
    pub(crate) fn forward_for(
        &self,
        b: &B,
        x: &B::Buffer,
        out: &mut B::Buffer,
        into: Option<&B::Weight>,
        prepared: &mut B::Prepared,
    ) {
        match into {
            None => self.forward(b, x, out),
            Some(w) => b.fused(Fused {
                w,
                epilogue: Epilogue::RmsNorm {
                    x,
                    weight: self.weight.all(),
                    eps: self.eps,
                },
                out: prepared,
            }),
        }
    }

    /// Normalises each `dim`-value row of `x` in place on `b` (per-head q/k norms).
    #[inline]
    pub fn forward_inplace(&self, b: &B, x: &mut B::Buffer) {
        b.rmsnorm_inplace(NormInPlace {
            x,
            weight: self.weight.all(),
            eps: self.eps,
        });
    }
}
