//! The tracing hook: every step of a pass is a named [`Op`] (`attn_norm`, `qkv`, `attention`,
//! `ffn_down`, ...), and [`Model::run_traced`](super::Model::run_traced) hands each one to a
//! [`Trace`] around its work, as llama.cpp's eval callback sees every named intermediate. A
//! profiler times them (`kasoku bench --profile`); [`NoTrace`], what
//! [`Model::run`](super::Model::run) uses, compiles to nothing.

use crate::kernels::matmul::WeightFormat;

/// One named step of a pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Op {
    /// What the step does (`embed`, `attn_norm`, `qkv`, `rope`, `attention`, `attn_out`,
    /// `ffn_gate_up`, `head`, ...).
    pub name: &'static str,
    /// The decoder layer it belongs to (`None`: before or after the layers).
    pub layer: Option<usize>,
    /// Rows in the pass.
    pub rows: usize,
    /// The weight format of a matrix product (the first matrix's, when several run as one).
    pub format: Option<WeightFormat>,
    /// Bytes of weights and state the step reads (0 where not counted).
    pub bytes: u64,
}

impl Op {
    /// A step with no matrix.
    pub fn new(name: &'static str, layer: Option<usize>, rows: usize) -> Op {
        Op {
            name,
            layer,
            rows,
            format: None,
            bytes: 0,
        }
    }

    /// The same step reading `bytes` bytes.
    pub fn reading(mut self, bytes: usize) -> Op {
        self.bytes = bytes as u64;
        self
    }

    /// The same step as a matrix product on weights stored as `format`.
    pub fn matmul(mut self, format: WeightFormat) -> Op {
        self.format = Some(format);
        self
    }
}

/// Sees every step of a pass, around its work.
pub trait Trace {
    /// Runs `work`, the step `op`. The default runs it and nothing else.
    #[inline(always)]
    fn op<R>(&mut self, op: Op, work: impl FnOnce() -> R) -> R {
        let _ = op;
        work()
    }
}

/// No tracing: every step just runs.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoTrace;

impl Trace for NoTrace {}
