//! `RmsNorm`: a norm weight with its epsilon. The `(1 + w)` convention of HF Qwen3.5 is
//! resolved at load (the stored `w` gets +1), so one kernel serves every family.

use crate::backend::{Backend, Cpu, Epilogue, Fused, Norm, NormInPlace};
use crate::format::Claims;
use crate::kernels::matmul::{MatMulWeight, Prepared};

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

    /// Normalises each `dim`-value row of `x` into `out`.
    pub fn forward(&self, x: &[f32], out: &mut [f32]) {
        Cpu.rmsnorm(Norm {
            x,
            weight: &self.weight,
            eps: self.eps,
            out,
        });
    }

    /// [`RmsNorm::forward`], or, when `into` names a matrix, the rows written into
    /// `prepared` for products with it (and the matrices that share its input) instead of
    /// into `out`.
    pub(crate) fn forward_for(
        &self,
        x: &[f32],
        out: &mut [f32],
        into: Option<&MatMulWeight>,
        prepared: &mut Prepared,
    ) {
        match into {
            None => self.forward(x, out),
            Some(w) => Cpu.fused(Fused {
                w,
                epilogue: Epilogue::RmsNorm {
                    x,
                    weight: &self.weight,
                    eps: self.eps,
                },
                out: prepared,
            }),
        }
    }

    /// Normalises each `dim`-value row of `x` in place (per-head q/k norms).
    pub fn forward_inplace(&self, x: &mut [f32]) {
        Cpu.rmsnorm_inplace(NormInPlace {
            x,
            weight: &self.weight,
            eps: self.eps,
        });
    }
}
