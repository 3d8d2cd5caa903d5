//! `RmsNorm`: a norm weight with its epsilon. The `(1 + w)` convention of HF Qwen3.5 is
//! resolved at load (the stored `w` gets +1), so one kernel serves every family.

use crate::backend::{Backend, Norm, NormInPlace};
use crate::format::Claims;

use super::{weights, ModelError};

#[derive(Clone, Debug)]
pub struct RmsNorm {
    /// Effective weight (already `1 + w` where the checkpoint stores `w`).
    pub weight: Vec<f32>,
    pub eps: f32,
}

impl RmsNorm {
    /// Loads `name` (`dim` values); `offset_one` adds 1 to every weight.
    pub fn load(
        claims: &Claims,
        name: &str,
        dim: usize,
        eps: f32,
        offset_one: bool,
    ) -> Result<RmsNorm, ModelError> {
        let mut weight = weights::vector(claims, name, dim)?;
        if offset_one {
            weight.iter_mut().for_each(|w| *w += 1.0);
        }
        Ok(RmsNorm { weight, eps })
    }

    pub fn dim(&self) -> usize {
        self.weight.len()
    }

    /// Normalises each `dim`-value row of `x` into `out` on `b`.
    #[inline]
    pub fn forward<B: Backend>(&self, b: &B, x: &B::Buffer, out: &mut B::Buffer) {
        b.rmsnorm(Norm {
            x,
            weight: &self.weight,
            eps: self.eps,
            out,
        });
    }

    /// Normalises each `dim`-value row of `x` in place on `b` (per-head q/k norms).
    #[inline]
    pub fn forward_inplace<B: Backend>(&self, b: &B, x: &mut B::Buffer) {
        b.rmsnorm_inplace(NormInPlace {
            x,
            weight: &self.weight,
            eps: self.eps,
        });
    }
}
