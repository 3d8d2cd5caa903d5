//! Taking weights out of a checkpoint: matrices packed for `matmul`, and small vectors
//! (norms, biases) dequantized to f32. Every tensor is claimed by name and shape.

use crate::backend::{Backend, Cpu};
use crate::format::{Claims, RawTensor};
use crate::kernels::matmul::{MatMulError, MatMulWeight};
use crate::quant::{requantize, DType};

use super::ModelError;

/// A `[rows, cols]` matrix for `y = x · Wᵀ`.
pub fn matrix(
    claims: &Claims,
    name: &str,
    rows: usize,
    cols: usize,
) -> Result<MatMulWeight, ModelError> {
    matrix_rows(claims, name, rows, cols)?.pack()
}

/// The rows of a claimed `[rows, cols]` matrix in the format it will be packed in: the
/// checkpoint's, or the claims' lighter matrix format (requantized here).
pub struct MatrixRows {
    pub name: String,
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
    raw: RawTensor,
    requantized: Option<Vec<u8>>,
}

impl MatrixRows {
    /// Brings the `[rows, cols]` matrix `raw` (tensor `name`) into its packing format: the
    /// claims' matrix format when one is set and lighter than the tensor's, else its own.
    /// Malformed bytes are kept as they are, for the packer to name the problem.
    pub fn new(claims: &Claims, name: &str, raw: RawTensor, rows: usize, cols: usize) -> Self {
        let requantized = claims
            .matrix_format()
            .filter(|&to| requantize::worth_it(raw.dtype, to, cols))
            .and_then(|to| {
                requantize::requantize(raw.dtype, to, rows, cols, raw.data.as_slice())
                    .map(|bytes| (to, bytes))
            });
        MatrixRows {
            name: name.to_string(),
            dtype: requantized.as_ref().map_or(raw.dtype, |(to, _)| *to),
            rows,
            cols,
            raw,
            requantized: requantized.map(|(_, bytes)| bytes),
        }
    }

    /// The rows, contiguous.
    pub fn bytes(&self) -> &[u8] {
        self.requantized
            .as_deref()
            .unwrap_or_else(|| self.raw.data.as_slice())
    }

    /// Packs the matrix for `matmul`, then releases the checkpoint pages it was read from
    /// (the packed copy is what products read; see `TensorBytes::release_pages`).
    pub fn pack(&self) -> Result<MatMulWeight, ModelError> {
        let packed = Cpu
            .pack(self.dtype, self.rows, self.cols, self.bytes())
            .map_err(weight_error(&self.name));
        self.raw.data.release_pages();
        packed
    }

    /// Packs `parts` stacked row-wise as one matrix (their rows in order), so that one product
    /// reads all their weights in one stream; `None` unless they share format and columns.
    /// Each row computes exactly what it computes in its own part.
    pub fn pack_stacked(parts: &[&MatrixRows]) -> Option<Result<MatMulWeight, ModelError>> {
        let first = parts.first()?;
        if parts
            .iter()
            .any(|p| p.dtype != first.dtype || p.cols != first.cols)
        {
            return None;
        }
        let bytes: Vec<u8> = parts.iter().flat_map(|p| p.bytes()).copied().collect();
        let rows = parts.iter().map(|p| p.rows).sum();
        let name = parts
            .iter()
            .map(|p| p.name.as_str())
            .collect::<Vec<_>>()
            .join(" + ");
        let packed = Cpu.pack(first.dtype, rows, first.cols, &bytes);
        parts.iter().for_each(|p| p.raw.data.release_pages());
        Some(packed.map_err(weight_error(&name)))
    }
}

/// Maps a packing error to one that names tensor `name`.
fn weight_error(name: &str) -> impl FnOnce(MatMulError) -> ModelError + '_ {
    move |source| ModelError::Weight {
        tensor: name.to_string(),
        source,
    }
}

/// Claims a `[rows, cols]` matrix and brings it into its packing format (see [`MatrixRows`]).
pub fn matrix_rows(
    claims: &Claims,
    name: &str,
    rows: usize,
    cols: usize,
) -> Result<MatrixRows, ModelError> {
    let raw = claims.take(name, &[rows, cols])?;
    Ok(MatrixRows::new(claims, name, raw, rows, cols))
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
