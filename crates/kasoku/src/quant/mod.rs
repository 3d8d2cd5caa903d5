//! Weight formats: the tensor element types kasoku reads (GGUF block quantizations and floats),
//! their block layouts, and reference dequantizers that every fast kernel is checked against.

pub mod dtype;
pub mod k_quants;
pub mod kasoku;
pub mod legacy;
pub mod requantize;

pub use dtype::DType;

/// What a model's heavier matrices are converted to as it loads: a GGUF type (see
/// [`requantize`]; for draft models) or kasoku's formats ([`kasoku::Recipe`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    Gguf(DType),
    Kasoku(kasoku::Recipe),
}

impl From<DType> for Target {
    fn from(d: DType) -> Target {
        Target::Gguf(d)
    }
}

impl Target {
    /// The GGUF type, if that is the target.
    pub fn gguf(self) -> Option<DType> {
        match self {
            Target::Gguf(d) => Some(d),
            Target::Kasoku(_) => None,
        }
    }
}

/// Dequantizes `out.len()` consecutive values stored as `dtype` in `bytes`
/// (`bytes.len()` must equal `dtype.bytes_for(out.len())`).
pub fn dequantize(dtype: DType, bytes: &[u8], out: &mut [f32]) {
    assert_eq!(
        Some(bytes.len()),
        dtype.bytes_for(out.len()),
        "dequantize: size mismatch"
    );
    match dtype {
        DType::F32 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        DType::F16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = half::f16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        DType::BF16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = half::bf16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        DType::Q4_0 => legacy::dequantize_q4_0(bytes, out),
        DType::Q4_1 => legacy::dequantize_q4_1(bytes, out),
        DType::Q5_0 => legacy::dequantize_q5_0(bytes, out),
        DType::Q5_1 => legacy::dequantize_q5_1(bytes, out),
        DType::Q8_0 => legacy::dequantize_q8_0(bytes, out),
        DType::Q4K => k_quants::dequantize_q4_k(bytes, out),
        DType::Q5K => k_quants::dequantize_q5_k(bytes, out),
        DType::Q6K => k_quants::dequantize_q6_k(bytes, out),
    }
}
