//! Taking weights out of a checkpoint: matrices packed for `matmul`, and small vectors
//! (norms, biases) dequantized to f32. Every tensor is claimed by name and shape.

use crate::format::Claims;
use crate::kernels::matmul::MatMulWeight;
use crate::quant::DType;

use super::ModelError;

/// A `[rows, cols]` matrix for `y = x · Wᵀ`.
pub fn matrix(
    claims: &Claims,
    name: &str,
    rows: usize,
    cols: usize,
) -> Result<MatMulWeight, ModelError> {
    let t = claims.take(name, &[rows, cols])?;
    MatMulWeight::new(t.dtype, rows, cols, t.data.as_slice()).map_err(|source| ModelError::Weight {
        tensor: name.to_string(),
        source,
    })
}

/// A matrix if the checkpoint has it.
pub fn optional_matrix(
    claims: &Claims,
    name: &str,
    rows: usize,
    cols: usize,
) -> Result<Option<MatMulWeight>, ModelError> {
    if claims.has(name) {
        matrix(claims, name, rows, cols).map(Some)
    } else {
        Ok(None)
    }
}

/// A vector of `len` values as f32.
pub fn vector(claims: &Claims, name: &str, len: usize) -> Result<Vec<f32>, ModelError> {
    let t = claims.take(name, &[len])?;
    to_f32(name, t.dtype, t.data.as_slice(), len)
}

/// A vector if the checkpoint has it.
pub fn optional_vector(
    claims: &Claims,
    name: &str,
    len: usize,
) -> Result<Option<Vec<f32>>, ModelError> {
    match claims.take_optional(name, &[len])? {
        None => Ok(None),
        Some(t) => to_f32(name, t.dtype, t.data.as_slice(), len).map(Some),
    }
}

/// Dequantizes `len` values (any supported type whose block size divides `len`).
pub fn to_f32(name: &str, dtype: DType, bytes: &[u8], len: usize) -> Result<Vec<f32>, ModelError> {
    if dtype.bytes_for(len) != Some(bytes.len()) {
        return Err(ModelError::Tensor {
            tensor: name.to_string(),
            reason: format!("{} bytes cannot hold {len} values of {dtype}", bytes.len()),
        });
    }
    let mut out = vec![0f32; len];
    crate::quant::dequantize(dtype, bytes, &mut out);
    Ok(out)
}
