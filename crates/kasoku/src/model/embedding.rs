//! Token embedding: rows of `token_embd.weight` looked up by id and dequantized to f32
//! (no scaling). The bytes stay in the checkpoint's memory map. A table stored in one of
//! kasoku's formats (`quant::kasoku`) gives each row dequantized and, when rotated, rotated
//! back to the original basis.

use crate::backend::{Backend, Buf, Gather, Table};
use crate::format::{Claims, QuantizedTensor, RawTensor, TensorBytes};
use crate::quant::kasoku::{quantize, Signs};
use crate::quant::Target;

use super::ModelError;

/// The table quantized to the claims' kasoku recipe, when it asks for one (so that a model
/// quantized as it loads equals the checkpoint `kasoku quantize` writes).
fn quantized_at_load(
    claims: &Claims,
    name: &str,
    vocab: usize,
    dim: usize,
) -> Result<Option<QuantizedTensor>, ModelError> {
    let Some(Target::Kasoku(recipe)) = claims.matrix_format() else {
        return Ok(None);
    };
    let tied = !claims.has("output.weight");
    let Some(spec) = recipe.embedding_spec(vocab, dim, tied) else {
        return Ok(None);
    };
    let Some(t) = claims.take_optional(name, &[vocab, dim])? else {
        return Ok(None);
    };
    let bad = |reason: String| ModelError::Tensor {
        tensor: name.to_string(),
        reason,
    };
    if t.dtype.bytes_for(vocab * dim) != Some(t.data.len()) {
        return Err(bad(format!(
            "{} bytes for {vocab}x{dim} {}",
            t.data.len(),
            t.dtype
        )));
    }
    let mut values = vec![0f32; vocab * dim];
    crate::quant::dequantize(t.dtype, t.data.as_slice(), &mut values);
    let q = quantize(spec, &values).map_err(|e| bad(format!("quantizing to {spec}: {e}")))?;
    let part = |v: Vec<u8>| TensorBytes::from_vec(v);
    QuantizedTensor::new(name, spec, part(q.codes), part(q.scales), part(q.zeros))
        .map(Some)
        .map_err(|e| bad(e.to_string()))
}

/// The stored table.
#[derive(Clone, Debug)]
pub enum EmbeddingTable {
    /// A GGUF element type (or float safetensors).
    Raw(RawTensor),
    /// One of kasoku's formats.
    Quantized(QuantizedTensor),
}

pub struct Embedding {
    table: EmbeddingTable,
    /// The rotation's signs of a rotated kasoku table.
    signs: Option<Signs>,
    pub vocab: usize,
    pub dim: usize,
    row_bytes: usize,
}

impl Embedding {
    pub fn load(
        claims: &Claims,
        name: &str,
        vocab: usize,
        dim: usize,
    ) -> Result<Embedding, ModelError> {
        let stored = claims.take_quantized(name, &[vocab, dim])?;
        let stored = match stored {
            Some(q) => Some(q),
            None => quantized_at_load(claims, name, vocab, dim)?,
        };
        if let Some(q) = stored {
            let row_bytes = q.spec.parts().iter().map(|&p| q.spec.row_bytes(p)).sum();
            return Ok(Embedding {
                signs: q.spec.rotation.map(|r| r.signs(dim)),
                table: EmbeddingTable::Quantized(q),
                vocab,
                dim,
                row_bytes,
            });
        }
        let tensor = claims.take(name, &[vocab, dim])?;
        Self::raw(name, tensor, vocab, dim)
    }

    fn raw(name: &str, tensor: RawTensor, vocab: usize, dim: usize) -> Result<Self, ModelError> {
        let row_bytes = tensor
            .dtype
            .bytes_for(dim)
            .ok_or_else(|| ModelError::Tensor {
                tensor: name.to_string(),
                reason: format!(
                    "rows of {dim} values do not fill whole {} blocks",
                    tensor.dtype
                ),
            })?;
        Ok(Embedding {
            table: EmbeddingTable::Raw(tensor),
            signs: None,
            vocab,
            dim,
            row_bytes,
        })
    }

    /// The stored matrix (the head reuses it when embeddings are tied).
    pub fn tensor(&self) -> &EmbeddingTable {
        &self.table
    }

    /// Bytes of one stored row.
    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    /// Writes the rows of `tokens` into `out` (`tokens.len() × dim`) on `b`. Ids must be
    /// `< vocab`.
    pub fn lookup<B: Backend>(&self, b: &B, tokens: &[u32], out: &mut B::Buffer) {
        assert_eq!(
            out.len(),
            tokens.len() * self.dim,
            "embedding: out has the wrong length"
        );
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= self.vocab) {
            panic!("embedding: token {t} out of range");
        }
        let table = match &self.table {
            EmbeddingTable::Raw(t) => Table::Raw {
                dtype: t.dtype,
                bytes: t.data.as_slice(),
            },
            EmbeddingTable::Quantized(q) => Table::Kasoku {
                view: q.view(),
                signs: self.signs.as_ref(),
            },
        };
        b.gather(Gather {
            table,
            dim: self.dim,
            tokens,
            out,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::kasoku::{Rotation, TensorSpec};

    #[test]
    fn a_quantized_table_gives_its_rows_in_the_original_basis() {
        let (vocab, dim) = (5, 64);
        let w: Vec<f32> = (0..vocab * dim)
            .map(|i| ((i * 7) % 13) as f32 - 6.0)
            .collect();
        for spec in [
            TensorSpec::l(vocab, dim, false, Some(Rotation::new(3, 32))),
            TensorSpec::m(vocab, dim, 64, None),
        ] {
            let q = quantize(spec, &w).unwrap();
            let t = QuantizedTensor::new(
                "token_embd.weight",
                spec,
                TensorBytes::from_vec(q.codes.clone()),
                TensorBytes::from_vec(q.scales.clone()),
                TensorBytes::from_vec(q.zeros.clone()),
            )
            .unwrap();
            let e = Embedding {
                signs: spec.rotation.map(|r| r.signs(dim)),
                table: EmbeddingTable::Quantized(t),
                vocab,
                dim,
                row_bytes: 0,
            };
            let mut out = vec![0f32; 2 * dim];
            e.lookup(&crate::backend::Cpu, &[3, 1], &mut out);
            let all = q.view().dequantize();
            assert_eq!(&out[..dim], &all[3 * dim..4 * dim], "{spec}");
            assert_eq!(&out[dim..], &all[dim..2 * dim], "{spec}");
        }
    }
}
