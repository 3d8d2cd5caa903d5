//! Strict loading: a model takes each tensor it needs by name and expected shape; at the end,
//! any tensor nobody took is an error (unless explicitly ignored, e.g. a vision tower).

use std::collections::BTreeSet;
use std::sync::Mutex;

use super::{FormatError, QuantizedTensor, RawTensor, TensorSource};
use crate::quant::Target;

/// Tracks which tensors of a source have been claimed.
pub struct Claims<'a> {
    source: &'a dyn TensorSource,
    claimed: Mutex<BTreeSet<String>>,
    matrix_format: Option<Target>,
}

impl<'a> Claims<'a> {
    pub fn new(source: &'a dyn TensorSource) -> Self {
        Claims {
            source,
            claimed: Mutex::new(BTreeSet::new()),
            matrix_format: None,
        }
    }

    /// Asks whoever packs the claimed matrices to store those in heavier formats as `format`
    /// (see `crate::quant::requantize`), or to quantize them to kasoku's formats; `None` keeps
    /// every tensor's own format.
    pub fn with_matrix_format(mut self, format: Option<Target>) -> Self {
        self.matrix_format = format;
        self
    }

    /// The format set by [`Claims::with_matrix_format`].
    pub fn matrix_format(&self) -> Option<Target> {
        self.matrix_format
    }

    pub fn source(&self) -> &'a dyn TensorSource {
        self.source
    }

    /// Takes a required tensor, checking its shape (outermost first).
    pub fn take(&self, name: &str, shape: &[usize]) -> Result<RawTensor, FormatError> {
        self.take_optional(name, shape)?
            .ok_or_else(|| FormatError::MissingTensor {
                path: self.source.path().to_path_buf(),
                tensor: name.to_string(),
            })
    }

    /// Takes a tensor if the source has it, checking its shape.
    pub fn take_optional(
        &self,
        name: &str,
        shape: &[usize],
    ) -> Result<Option<RawTensor>, FormatError> {
        let Some(tensor) = self.source.get(name) else {
            return Ok(None);
        };
        if !same_shape(&tensor.shape, shape) {
            return Err(FormatError::WrongShape {
                path: self.source.path().to_path_buf(),
                tensor: name.to_string(),
                expected: shape.to_vec(),
                found: tensor.shape.clone(),
            });
        }
        self.claimed.lock().unwrap().insert(name.to_string());
        Ok(Some(tensor))
    }

    /// Takes a matrix stored in one of kasoku's formats if the source has one of that name,
    /// checking its shape (`[rows, cols]`).
    pub fn take_quantized(
        &self,
        name: &str,
        shape: &[usize],
    ) -> Result<Option<QuantizedTensor>, FormatError> {
        let Some(tensor) = self.source.quantized(name) else {
            return Ok(None);
        };
        let found = vec![tensor.spec.rows, tensor.spec.cols];
        if !same_shape(&found, shape) {
            return Err(FormatError::WrongShape {
                path: self.source.path().to_path_buf(),
                tensor: name.to_string(),
                expected: shape.to_vec(),
                found,
            });
        }
        self.claimed.lock().unwrap().insert(name.to_string());
        Ok(Some(tensor))
    }

    /// Marks every tensor whose name starts with `prefix` as deliberately unused.
    pub fn ignore_prefix(&self, prefix: &str) {
        let mut claimed = self.claimed.lock().unwrap();
        for name in self.source.names() {
            if name.starts_with(prefix) {
                claimed.insert(name);
            }
        }
    }

    pub fn has(&self, name: &str) -> bool {
        self.source.get(name).is_some() || self.source.quantized(name).is_some()
    }

    /// Fails if any tensor of the source was not claimed or ignored.
    pub fn finish(self) -> Result<(), FormatError> {
        let claimed = self.claimed.into_inner().unwrap();
        let unclaimed: Vec<String> = self
            .source
            .names()
            .into_iter()
            .filter(|n| !claimed.contains(n))
            .collect();
        if unclaimed.is_empty() {
            return Ok(());
        }
        let mut list = unclaimed
            .iter()
            .take(8)
            .cloned()
            .collect::<Vec<_>>()
            .join(", ");
        if unclaimed.len() > 8 {
            list.push_str(&format!(" and {} more", unclaimed.len() - 8));
        }
        Err(FormatError::Unclaimed {
            path: self.source.path().to_path_buf(),
            tensors: list,
        })
    }
}

/// Shapes match if equal after dropping leading and trailing 1s on either side
/// (`[n]` matches `[1, n]`, `[n, 1, k]` matches `[n, k]`).
fn same_shape(found: &[usize], expected: &[usize]) -> bool {
    let strip = |s: &[usize]| -> Vec<usize> { s.iter().copied().filter(|&d| d != 1).collect() };
    found == expected
        || (found.iter().product::<usize>() == expected.iter().product::<usize>()
            && strip(found) == strip(expected))
}
