//! Taking weights out of a checkpoint: matrices packed for `matmul`, and small vectors
//! (norms, biases) dequantized to f32. Every tensor is claimed by name and shape.

use crate::format::Claims;
use crate::kernels::matmul::MatMulWeight;
use crate::quant::{requantize, DType};

use super::ModelError;

/// A `[rows, cols]` matrix for `y = x · Wᵀ`.
pub fn matrix(
    claims: &Claims,
    name: &str,
    rows: usize,
    cols: usize,
) -> Result<MatMulWeight, ModelError> {
    let t = claims.take(name, &[rows, cols])?;
    pack(claims, name, t.dtype, rows, cols, t.data.as_slice())
}

/// Packs the `[rows, cols]` matrix `bytes` of format `dtype` (tensor `name`) for `matmul`, in
/// the claims' matrix format when one is set and lighter than `dtype`.
pub fn pack(
    claims: &Claims,
    name: &str,
    dtype: DType,
    rows: usize,
    cols: usize,
    bytes: &[u8],
) -> Result<MatMulWeight, ModelError> {
    let err = |source| ModelError::Weight {
        tensor: name.to_string(),
        source,
    };
    if let Some(to) = claims.matrix_format() {
        if requantize::worth_it(dtype, to, cols) {
            // Malformed bytes fall through to the packer below, which names the problem.
            if let Some(lighter) = requantize::requantize(dtype, to, rows, cols, bytes) {
                return MatMulWeight::new(to, rows, cols, &lighter).map_err(err);
            }
        }
    }
    MatMulWeight::new(dtype, rows, cols, bytes).map_err(err)
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
