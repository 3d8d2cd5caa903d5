//! Taking weights out of a checkpoint: matrices packed by a backend for its `matmul`, and
//! small vectors (norms, biases) dequantized to f32. Every tensor is claimed by name and
//! shape.

use crate::backend::Backend;
use crate::format::{Claims, QuantizedTensor, RawTensor};
use crate::kernels::matmul::MatMulError;
use crate::quant::kasoku::{self, QuantizedMatrix, QuantizedView, TensorSpec};
use crate::quant::{requantize, DType, Target};

use super::ModelError;

/// A `[rows, cols]` matrix for `y = x · Wᵀ`, packed by `b`.
pub fn matrix<B: Backend>(
    b: &B,
    claims: &Claims,
    name: &str,
    rows: usize,
    cols: usize,
) -> Result<B::Weight, ModelError> {
    matrix_rows(claims, name, rows, cols)?.pack(b)
}

/// The rows of a claimed `[rows, cols]` matrix in the format it will be packed in: the
/// checkpoint's, the claims' lighter GGUF matrix format (requantized here), or one of kasoku's
/// formats (stored so in the checkpoint, or quantized here to the claims' recipe).
pub struct MatrixRows {
    pub name: String,
    pub rows: usize,
    pub cols: usize,
    data: Rows,
}

/// Where a matrix's rows are.
enum Rows {
    /// A GGUF element type: the checkpoint's bytes or their requantization.
    Gguf {
        dtype: DType,
        raw: RawTensor,
        requantized: Option<Vec<u8>>,
    },
    /// kasoku's formats, as stored in the checkpoint.
    Stored(QuantizedTensor),
    /// kasoku's formats, quantized at load from `raw`.
    Quantized { q: QuantizedMatrix, raw: RawTensor },
}

impl MatrixRows {
    /// Brings the `[rows, cols]` matrix `raw` (tensor `name`) into its packing format: the
    /// claims' matrix format when one is set (and, for a GGUF type, lighter than the
    /// tensor's), else its own. Malformed bytes are kept as they are, for the packer to name
    /// the problem; a matrix kasoku's quantizer refuses (non-finite values) is an error.
    pub fn new(
        claims: &Claims,
        name: &str,
        raw: RawTensor,
        rows: usize,
        cols: usize,
    ) -> Result<Self, ModelError> {
        let data = match claims.matrix_format() {
            Some(Target::Kasoku(recipe)) => match recipe.spec_for(name, rows, cols) {
                Some(spec) if raw.dtype.bytes_for(rows * cols) == Some(raw.data.len()) => {
                    let mut values = vec![0f32; rows * cols];
                    crate::quant::dequantize(raw.dtype, raw.data.as_slice(), &mut values);
                    let q = kasoku::quantize(spec, &values).map_err(|e| ModelError::Tensor {
                        tensor: name.to_string(),
                        reason: format!("quantizing to {spec}: {e}"),
                    })?;
                    Rows::Quantized { q, raw }
                }
                _ => Rows::gguf(raw, None, cols),
            },
            target => Rows::gguf(raw, target.and_then(Target::gguf), cols),
        };
        Ok(MatrixRows {
            name: name.to_string(),
            rows,
            cols,
            data,
        })
    }

    /// A matrix the checkpoint stores in one of kasoku's formats.
    pub fn stored(name: &str, q: QuantizedTensor) -> Self {
        MatrixRows {
            name: name.to_string(),
            rows: q.spec.rows,
            cols: q.spec.cols,
            data: Rows::Stored(q),
        }
    }

    /// The rows in one of kasoku's formats.
    fn kasoku_view(&self) -> Option<QuantizedView<'_>> {
        match &self.data {
            Rows::Gguf { .. } => None,
            Rows::Stored(q) => Some(q.view()),
            Rows::Quantized { q, .. } => Some(q.view()),
        }
    }

    /// The GGUF type and the rows, contiguous (`None` for kasoku's formats).
    fn gguf_bytes(&self) -> Option<(DType, &[u8])> {
        match &self.data {
            Rows::Gguf {
                dtype,
                raw,
                requantized,
            } => Some((
                *dtype,
                requantized
                    .as_deref()
                    .unwrap_or_else(|| raw.data.as_slice()),
            )),
            _ => None,
        }
    }

    /// Releases the checkpoint pages the matrix was read from.
    fn release_pages(&self) {
        match &self.data {
            Rows::Gguf { raw, .. } | Rows::Quantized { raw, .. } => raw.data.release_pages(),
            Rows::Stored(q) => q.release_pages(),
        }
    }

    /// Packs the matrix for `b`'s `matmul`, then releases the checkpoint pages it was read
    /// from (the packed copy is what products read; see `TensorBytes::release_pages`).
    pub fn pack<B: Backend>(&self, b: &B) -> Result<B::Weight, ModelError> {
        let packed = match (self.gguf_bytes(), self.kasoku_view()) {
            (Some((dtype, bytes)), _) => b
                .pack(dtype, self.rows, self.cols, bytes)
                .map_err(weight_error(&self.name)),
            (None, Some(view)) => Ok(b.pack_kasoku(view)),
            (None, None) => unreachable!("every matrix is GGUF or kasoku"),
        };
        self.release_pages();
        packed
    }

    /// Packs `parts` stacked row-wise as one matrix (their rows in order), so that one product
    /// reads all their weights in one stream; `None` unless they share format and columns
    /// (for kasoku's formats: the whole spec but the rows, rotation included).
    /// Each row computes exactly what it computes in its own part.
    pub fn pack_stacked<B: Backend>(
        b: &B,
        parts: &[&MatrixRows],
    ) -> Option<Result<B::Weight, ModelError>> {
        let first = parts.first()?;
        let rows = parts.iter().map(|p| p.rows).sum();
        let name = parts
            .iter()
            .map(|p| p.name.as_str())
            .collect::<Vec<_>>()
            .join(" + ");
        if let Some(v0) = first.kasoku_view() {
            let views: Vec<QuantizedView> = parts.iter().filter_map(|p| p.kasoku_view()).collect();
            let same = views.len() == parts.len()
                && views.iter().all(|v| {
                    TensorSpec {
                        rows: v0.spec.rows,
                        ..v.spec
                    } == v0.spec
                });
            if !same {
                return None;
            }
            let codes: Vec<u8> = views.iter().flat_map(|v| v.codes).copied().collect();
            let scales: Vec<u8> = views.iter().flat_map(|v| v.scales).copied().collect();
            let zeros: Vec<u8> = views.iter().flat_map(|v| v.zeros).copied().collect();
            let spec = TensorSpec { rows, ..v0.spec };
            let packed = QuantizedView::new(spec, &codes, &scales, &zeros)
                .map(|v| b.pack_kasoku(v))
                .map_err(|e| ModelError::Tensor {
                    tensor: name.clone(),
                    reason: e.to_string(),
                });
            parts.iter().for_each(|p| p.release_pages());
            return Some(packed);
        }
        let (dtype, _) = first.gguf_bytes()?;
        if parts
            .iter()
            .any(|p| p.gguf_bytes().map(|(d, _)| d) != Some(dtype) || p.cols != first.cols)
        {
            return None;
        }
        let bytes: Vec<u8> = parts
            .iter()
            .filter_map(|p| p.gguf_bytes())
            .flat_map(|(_, b)| b)
            .copied()
            .collect();
        let packed = b.pack(dtype, rows, first.cols, &bytes);
        parts.iter().for_each(|p| p.release_pages());
        Some(packed.map_err(weight_error(&name)))
    }
}

impl Rows {
    /// The GGUF rows of `raw`, requantized to `to` when that is lighter.
    fn gguf(raw: RawTensor, to: Option<DType>, cols: usize) -> Rows {
        let rows = raw.numel() / cols.max(1);
        let requantized = to
            .filter(|&to| requantize::worth_it(raw.dtype, to, cols))
            .and_then(|to| {
                requantize::requantize(raw.dtype, to, rows, cols, raw.data.as_slice())
                    .map(|bytes| (to, bytes))
            });
        Rows::Gguf {
            dtype: requantized.as_ref().map_or(raw.dtype, |(to, _)| *to),
            raw,
            requantized: requantized.map(|(_, bytes)| bytes),
        }
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
    if let Some(q) = claims.take_quantized(name, &[rows, cols])? {
        return Ok(MatrixRows::stored(name, q));
    }
    let raw = claims.take(name, &[rows, cols])?;
    MatrixRows::new(claims, name, raw, rows, cols)
}

/// A matrix if the checkpoint has it, packed by `b`.
pub fn optional_matrix<B: Backend>(
    b: &B,
    claims: &Claims,
    name: &str,
    rows: usize,
    cols: usize,
) -> Result<Option<B::Weight>, ModelError> {
    if claims.has(name) {
        matrix(b, claims, name, rows, cols).map(Some)
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
