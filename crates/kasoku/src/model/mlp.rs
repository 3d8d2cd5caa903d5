//! The dense SwiGLU MLP of every supported family: `down(silu(gate(x)) · up(x))`, no biases.

use crate::backend::{Activation, Backend, Cpu, MatMul, MatMulMany, WeightInfo};
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

    /// `out = down(silu(gate(x)) · up(x))` for `n` rows of `x` (intermediates carved from
    /// `work`), the steps of layer `layer` seen by `tr`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn run<T: Trace>(
        &self,
        b: &B,
        x: &B::Buffer,
        n: usize,
        out: &mut B::Buffer,
        work: &mut B::Vec,
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
        tr.op(gate_up, || {
            b.matmul_many(MatMulMany {
                ws: &[&self.gate, &self.up],
                x,
                n,
                ys: &mut [&mut *g, &mut *u],
            })
        });
        tr.op(op("swiglu"), || {
            b.activation(Activation::SwiGlu { gate: g, up: u })
        });
        let down = op("ffn_down")
            .matmul(self.down.format())
            .reading(self.down.size_bytes());
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
