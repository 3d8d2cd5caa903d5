//! Token embedding: rows of `token_embd.weight` looked up by id and dequantized to f32
//! (no scaling). The bytes stay in the checkpoint's memory map.

use crate::backend::{Backend, Cpu, Gather};
use crate::format::{Claims, RawTensor};

use super::ModelError;

pub struct Embedding {
    tensor: RawTensor,
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
        let tensor = claims.take(name, &[vocab, dim])?;
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
            tensor,
            vocab,
            dim,
            row_bytes,
        })
    }

    /// The stored matrix (the head reuses it when embeddings are tied).
    pub fn tensor(&self) -> &RawTensor {
        &self.tensor
    }

    /// Bytes of one stored row.
    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    /// Writes the rows of `tokens` into `out` (`tokens.len() × dim`). Ids must be `< vocab`.
    pub fn lookup(&self, tokens: &[u32], out: &mut [f32]) {
        assert_eq!(
            out.len(),
            tokens.len() * self.dim,
            "embedding: out has the wrong length"
        );
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= self.vocab) {
            panic!("embedding: token {t} out of range");
        }
        Cpu.gather(Gather {
            dtype: self.tensor.dtype,
            table: self.tensor.data.as_slice(),
            dim: self.dim,
            tokens,
            out,
        });
    }
}
