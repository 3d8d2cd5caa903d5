//! The dense SwiGLU MLP of every supported family: `down(silu(gate(x)) · up(x))`, no biases.

use crate::backend::{
    Activation, Backend, Cpu, Epilogue, Fused, MatMul, MatMulMany, MatMulPrepared,
};
use crate::format::Claims;
use crate::kernels::matmul::{MatMulWeight, Prepared};

use super::scratch::carve;
use super::trace::{Op, Trace};
use super::{weights, ModelError};

pub struct Mlp {
    pub gate: MatMulWeight,
    pub up: MatMulWeight,
    pub down: MatMulWeight,
}

impl Mlp {
    /// Loads `blk.{layer}.ffn_{gate,up,down}.weight`.
    pub fn load(
        claims: &Claims,
        layer: usize,
        hidden: usize,
        ffn: usize,
    ) -> Result<Mlp, ModelError> {
        let name = |part: &str| format!("blk.{layer}.ffn_{part}.weight");
        Ok(Mlp {
            gate: weights::matrix(claims, &name("gate"), ffn, hidden)?,
            up: weights::matrix(claims, &name("up"), ffn, hidden)?,
            down: weights::matrix(claims, &name("down"), hidden, ffn)?,
        })
    }

    /// The matrix whose prepared rows [`Mlp::run`] reads instead of f32 ones, when one
    /// fused norm can write them for gate and up; `None` for f32 rows.
    pub(crate) fn prepared_input(&self) -> Option<&MatMulWeight> {
        Cpu.can_prepare(&[&self.gate, &self.up])
            .then_some(&self.gate)
    }

    /// `out = down(silu(gate(x)) · up(x))` for `n` rows of `x` (or of `prepared`, as
    /// [`Mlp::prepared_input`] says; intermediates carved from `work`, SwiGLU's product
    /// prepared for down in `prepared` where it can be), the steps of layer `layer` seen by
    /// `tr`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn run<T: Trace>(
        &self,
        x: &[f32],
        n: usize,
        out: &mut [f32],
        work: &mut Vec<f32>,
        prepared: &mut Prepared,
        layer: usize,
        tr: &mut T,
    ) {
        let ffn = self.gate.rows;
        let [g, u] = carve(work, [n * ffn, n * ffn]);
        let op = |name| Op::new(name, Some(layer), n);
        let gate_up = op("ffn_gate_up")
            .matmul(self.gate.format())
            .reading(self.gate.size_bytes() + self.up.size_bytes());
        // Gate and up in one job: the pool synchronises once for both.
        let ws = [&self.gate, &self.up];
        tr.op(gate_up, || match self.prepared_input() {
            Some(_) => Cpu.matmul_prepared(MatMulPrepared {
                ws: &ws,
                x: prepared,
                n,
                ys: &mut [&mut *g, &mut *u],
            }),
            None => Cpu.matmul_many(MatMulMany {
                ws: &ws,
                x,
                n,
                ys: &mut [&mut *g, &mut *u],
            }),
        });
        let down = op("ffn_down")
            .matmul(self.down.format())
            .reading(self.down.size_bytes());
        if Cpu.can_prepare(&[&self.down]) {
            // SwiGLU writes its product prepared for down.
            tr.op(op("swiglu"), || {
                Cpu.fused(Fused {
                    w: &self.down,
                    epilogue: Epilogue::SwiGlu { gate: g, up: u },
                    out: prepared,
                })
            });
            tr.op(down, || {
                Cpu.matmul_prepared(MatMulPrepared {
                    ws: &[&self.down],
                    x: prepared,
                    n,
                    ys: &mut [out],
                })
            });
            return;
        }
        tr.op(op("swiglu"), || {
            Cpu.activation(Activation::SwiGlu { gate: g, up: u })
        });
        tr.op(down, || {
            Cpu.matmul(MatMul {
                w: &self.down,
                x: g,
                n,
                y: out,
            })
        });
    }
}
