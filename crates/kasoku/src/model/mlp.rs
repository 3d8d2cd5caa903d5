//! The dense SwiGLU MLP of every supported family: `down(silu(gate(x)) · up(x))`, no biases.

use crate::backend::{
    Activation, Backend, Cpu, Epilogue, Fused, MatMul, MatMulMany, MatMulPrepared, WeightInfo,
};
use crate::format::Claims;

use super::scratch::carve;
use super::trace::{Op, Trace};
use super::{weights, ModelError};

pub struct Mlp<B: Backend = Cpu> {
    pub gate: B::Weight,
    pub up: B::Weight,
    pub down: B::Weight,
}

impl<B: Backend> Mlp<B> {
    /// Loads `blk.{layer}.ffn_{gate,up,down}.weight`, packed by `b`.
    pub fn load(
        b: &B,
        claims: &Claims,
        layer: usize,
        hidden: usize,
        ffn: usize,
    ) -> Result<Mlp<B>, ModelError> {
        let name = |part: &str| format!("blk.{layer}.ffn_{part}.weight");
        Ok(Mlp {
            gate: weights::matrix(b, claims, &name("gate"), ffn, hidden)?,
            up: weights::matrix(b, claims, &name("up"), ffn, hidden)?,
            down: weights::matrix(b, claims, &name("down"), hidden, ffn)?,
        })
    }

    /// The matrix whose prepared rows [`Mlp::run`] reads instead of f32 ones, when one
    /// fused norm can write them for gate and up on `b`; `None` for f32 rows.
    pub(crate) fn prepared_input(&self, b: &B) -> Option<&B::Weight> {
        b.can_prepare(&[&self.gate, &self.up]).then_some(&self.gate)
    }

    /// `out = down(silu(gate(x)) · up(x))` for `n` rows of `x` (or of `prepared`, as
    /// [`Mlp::prepared_input`] says; intermediates carved from `work`, SwiGLU's product
    /// prepared for down in `prepared` where it can be), the steps of layer `layer` seen by
    /// `tr`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn run<T: Trace>(
        &self,
        b: &B,
        x: &B::Buffer,
        n: usize,
        out: &mut B::Buffer,
        work: &mut B::Vec,
        prepared: &mut B::Prepared,
        layer: usize,
        tr: &mut T,
    ) {
        let ffn = self.gate.rows();
        let [g, u] = carve(work, [n * ffn, n * ffn]);
        let op = |name| Op::new(name, Some(layer), n);
        let gate_up = op("ffn_gate_up")
            .matmul(self.gate.format())
            .reading(self.gate.size_bytes() + self.up.size_bytes());
        // Gate and up in one job: the pool synchronises once for both.
        let ws = [&self.gate, &self.up];
        tr.op(gate_up, || match self.prepared_input(b) {
            Some(_) => b.matmul_prepared(MatMulPrepared {
                ws: &ws,
                x: prepared,
                n,
                ys: &mut [&mut *g, &mut *u],
            }),
            None => b.matmul_many(MatMulMany {
                ws: &ws,
                x,
                n,
                ys: &mut [&mut *g, &mut *u],
            }),
        });
        let down = op("ffn_down")
            .matmul(self.down.format())
            .reading(self.down.size_bytes());
        if b.can_prepare(&[&self.down]) {
            // SwiGLU writes its product prepared for down.
            tr.op(op("swiglu"), || {
                b.fused(Fused {
                    w: &self.down,
                    epilogue: Epilogue::SwiGlu { gate: g, up: u },
                    out: prepared,
                })
            });
            tr.op(down, || {
                b.matmul_prepared(MatMulPrepared {
                    ws: &[&self.down],
                    x: prepared,
                    n,
                    ys: &mut [out],
                })
            });
            return;
        }
        tr.op(op("swiglu"), || {
            b.activation(Activation::SwiGlu { gate: g, up: u })
        });
        tr.op(down, || {
            b.matmul(MatMul {
                w: &self.down,
                x: g,
                n,
                y: out,
            })
        });
    }
}
