//! Weight formats: the tensor element types kasoku reads (GGUF block quantizations and floats),
//! their block layouts, and reference dequantizers that every fast kernel is checked against.

pub mod dtype;

pub use dtype::DType;

/// Dequantizes `out.len()` consecutive values stored as `dtype` in `bytes`
/// (`bytes.len()` must equal `dtype.bytes_for(out.len())`).
pub fn dequantize(dtype: DType, bytes: &[u8], out: &mut [f32]) {
    assert_eq!(Some(bytes.len()), dtype.bytes_for(out.len()), "dequantize: size mismatch");
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
        // Filled in by the block-format modules (legacy.rs, k_quants.rs).
        _ => unimplemented!("dequantize {dtype}"),
    }
}
