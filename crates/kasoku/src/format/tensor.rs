//! A tensor as found in a checkpoint file: name, element type, shape and its bytes,
//! borrowed from a memory map (or owned, for tensors made in memory).

use std::sync::Arc;

use memmap2::{Mmap, UncheckedAdvice};

use crate::quant::kasoku::{KasokuError, QuantizedView, TensorSpec};
use crate::quant::DType;

/// The page size [`TensorBytes::release_pages`] aligns to (where pages are larger, the advice
/// is refused and nothing happens).
const PAGE: usize = 4096;

/// Bytes of one tensor, kept alive by a shared owner (usually the file's memory map).
#[derive(Clone)]
pub struct TensorBytes {
    owner: Arc<dyn AsRef<[u8]> + Send + Sync>,
    start: usize,
    len: usize,
    /// The file mapping the bytes are in, when they are in one.
    map: Option<Arc<Mmap>>,
}

impl TensorBytes {
    /// Bytes `start..start + len` of `owner`. Panics if the range is outside `owner`:
    /// readers validate ranges against the file size before calling this.
    pub fn new(owner: Arc<dyn AsRef<[u8]> + Send + Sync>, start: usize, len: usize) -> Self {
        assert!(start
            .checked_add(len)
            .is_some_and(|end| end <= (*owner).as_ref().len()));
        TensorBytes {
            owner,
            start,
            len,
            map: None,
        }
    }

    /// Bytes `start..start + len` of a read-only file mapping. Panics as [`TensorBytes::new`].
    pub fn mapped(map: Arc<Mmap>, start: usize, len: usize) -> Self {
        let owner: Arc<dyn AsRef<[u8]> + Send + Sync> = map.clone();
        TensorBytes {
            map: Some(map),
            ..TensorBytes::new(owner, start, len)
        }
    }

    /// Takes this tensor's pages of a file mapping out of the process's resident memory (the
    /// whole pages inside its bytes): a matrix packed into memory of its own no longer needs
    /// them, and without this a loaded model was resident twice, packed and mapped. The bytes
    /// stay readable: a later read faults them back in from the file. Nothing happens for
    /// bytes in memory.
    pub fn release_pages(&self) {
        let Some(map) = &self.map else { return };
        let first = self.start.div_ceil(PAGE) * PAGE;
        let end = (self.start + self.len) / PAGE * PAGE;
        if end > first {
            // SAFETY: the mapping is a read-only (shared) map of a file this process does not
            // write, so dropping its pages discards nothing: every later read of these bytes,
            // through any TensorBytes, faults the file's data back in. A failure (pages larger
            // than PAGE) only leaves the pages resident.
            let _ = unsafe {
                map.unchecked_advise_range(UncheckedAdvice::DontNeed, first, end - first)
            };
        }
    }

    /// Bytes owned in memory.
    pub fn from_vec(bytes: Vec<u8>) -> Self {
        let len = bytes.len();
        TensorBytes {
            owner: Arc::new(bytes),
            start: 0,
            len,
            map: None,
        }
    }

    pub fn as_slice(&self) -> &[u8] {
        &(*self.owner).as_ref()[self.start..self.start + self.len]
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl std::fmt::Debug for TensorBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "TensorBytes({} bytes)", self.len)
    }
}

/// One tensor of a checkpoint. `data.len()` always equals the byte size its dtype and shape imply.
#[derive(Clone, Debug)]
pub struct RawTensor {
    pub name: String,
    pub dtype: DType,
    /// Outermost dimension first (`[rows, cols]` for a matrix whose rows are contiguous).
    pub shape: Vec<usize>,
    pub data: TensorBytes,
}

impl RawTensor {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// A matrix stored in one of kasoku's formats (`quant::kasoku`): its spec and its parts'
/// bytes, whose sizes were checked against the spec when it was made.
#[derive(Clone, Debug)]
pub struct QuantizedTensor {
    pub name: String,
    pub spec: TensorSpec,
    codes: TensorBytes,
    scales: TensorBytes,
    /// Empty for L.
    zeros: TensorBytes,
}

impl QuantizedTensor {
    /// The tensor, if every part has the size the spec implies (the error names the part).
    pub fn new(
        name: &str,
        spec: TensorSpec,
        codes: TensorBytes,
        scales: TensorBytes,
        zeros: TensorBytes,
    ) -> Result<QuantizedTensor, KasokuError> {
        QuantizedView::new(spec, codes.as_slice(), scales.as_slice(), zeros.as_slice())?;
        Ok(QuantizedTensor {
            name: name.to_string(),
            spec,
            codes,
            scales,
            zeros,
        })
    }

    /// The parts as a view (sizes already checked).
    pub fn view(&self) -> QuantizedView<'_> {
        QuantizedView {
            spec: self.spec,
            codes: self.codes.as_slice(),
            scales: self.scales.as_slice(),
            zeros: self.zeros.as_slice(),
        }
    }

    /// Releases the parts' pages of a file mapping (see [`TensorBytes::release_pages`]).
    pub fn release_pages(&self) {
        self.codes.release_pages();
        self.scales.release_pages();
        self.zeros.release_pages();
    }
}

/// A set of named tensors: one GGUF file, or a Hugging Face directory of safetensors shards.
/// Tensor names are the source's own names (GGUF: `blk.0.attn_q.weight`; HF:
/// `model.layers.0.self_attn.q_proj.weight`).
pub trait TensorSource: Send + Sync {
    /// The file or directory, for error messages.
    fn path(&self) -> &std::path::Path;
    /// Every tensor name, in file order.
    fn names(&self) -> Vec<String>;
    /// The tensor of that name, if present (`None` for a matrix in kasoku's formats: see
    /// [`TensorSource::quantized`]).
    fn get(&self, name: &str) -> Option<RawTensor>;
    /// The matrix of that name if it is stored in one of kasoku's formats. [`TensorSource::names`]
    /// lists these too.
    fn quantized(&self, name: &str) -> Option<QuantizedTensor> {
        let _ = name;
        None
    }
    /// Which converter's conventions the values follow (see [`SourceOrigin`]).
    fn origin(&self) -> SourceOrigin {
        SourceOrigin::Gguf
    }
}

/// Where a source's tensors come from. Names are GGUF names either way; values differ:
/// - `Gguf` (llama.cpp's converter): llama-architecture Q/K rows are permuted for RoPE on
///   adjacent pairs; Qwen3.5 norm weights are stored as `1 + w` (plain-weight convention) except
///   `ssm_norm`; `ssm_a` holds `-exp(A_log)`; V heads are in tiled order when nv != nk.
/// - `HuggingFace` (safetensors as trained): Q/K rows in HF order (RoPE on the two halves);
///   Qwen3.5 norms in the `(1 + w)` convention; `ssm_a` holds `A_log`; V heads grouped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceOrigin {
    Gguf,
    HuggingFace,
}
