//! How checkpoints in kasoku's formats (`quant::kasoku`) sit in safetensors files, as
//! `kasoku quantize` writes them, and the strict reading of that layout.
//!
//! A quantized matrix `W` (a name of the file's naming scheme) is stored as the tensors
//! `W.codes`, `W.scales` and, for M, `W.zeros`, each 2-D with one row per matrix row, of the
//! element type and width its spec implies (`TensorSpec::part_layout`). The header's
//! `__metadata__` (string values, as safetensors requires) says what they are:
//! - `kasoku.version`: `"1"`;
//! - `kasoku.tensors`: a JSON object from each matrix name to its spec
//!   (`TensorSpec::to_json`: format, group, rotation seed and block, shape);
//! - `kasoku.names`: `"hf"` (Hugging Face names, with `config.json` and the tokenizer files
//!   beside the weights) or `"gguf"` (GGUF names and conventions, with the source's metadata
//!   in `kasoku.gguf` beside them; see `format::checkpoint`);
//! - `kasoku.recipe`: how it was made (informational).
//!
//! Reading is strict: a part of no declared matrix, a declared matrix missing a part, a part
//! of the wrong element type or shape, or an unreadable spec is an error naming the tensor.

use std::collections::{BTreeMap, HashMap};

use ::safetensors::tensor::Dtype as StDtype;

use super::{FormatError, QuantizedTensor, TensorBytes};
use crate::quant::kasoku::{Part, TensorSpec};

/// `__metadata__` keys.
pub const VERSION_KEY: &str = "kasoku.version";
pub const TENSORS_KEY: &str = "kasoku.tensors";
pub const NAMES_KEY: &str = "kasoku.names";
pub const RECIPE_KEY: &str = "kasoku.recipe";
/// The layout version this code reads and writes.
pub const VERSION: &str = "1";

/// The name of a part of matrix `name`.
pub fn part_name(name: &str, part: Part) -> String {
    format!("{name}.{}", part.name())
}

/// The safetensors element type of a part type name of `TensorSpec::part_layout`.
pub fn st_dtype(elem: &str) -> StDtype {
    match elem {
        "I8" => StDtype::I8,
        "F16" => StDtype::F16,
        "F32" => StDtype::F32,
        _ => StDtype::U8,
    }
}

/// The declared matrices of one file's metadata (empty when it declares none), and whether
/// its names are GGUF names.
pub struct Declared {
    pub specs: BTreeMap<String, TensorSpec>,
    pub gguf_names: bool,
    parts: HashMap<String, [Option<TensorBytes>; 3]>,
}

impl Declared {
    /// Reads the `__metadata__` of a file (`corrupt` makes the error for a reason).
    pub fn read(
        meta: Option<&HashMap<String, String>>,
        corrupt: &dyn Fn(String) -> FormatError,
    ) -> Result<Declared, FormatError> {
        let mut d = Declared {
            specs: BTreeMap::new(),
            gguf_names: false,
            parts: HashMap::new(),
        };
        let Some(meta) = meta else { return Ok(d) };
        let Some(tensors) = meta.get(TENSORS_KEY) else {
            return Ok(d);
        };
        match meta.get(VERSION_KEY).map(String::as_str) {
            Some(VERSION) => {}
            other => {
                return Err(corrupt(format!(
                    "{VERSION_KEY} is {other:?}; this kasoku reads version {VERSION}"
                )))
            }
        }
        d.gguf_names = match meta.get(NAMES_KEY).map(String::as_str) {
            None | Some("hf") => false,
            Some("gguf") => true,
            Some(other) => return Err(corrupt(format!("{NAMES_KEY} is '{other}'"))),
        };
        let json: serde_json::Value = serde_json::from_str(tensors)
            .map_err(|e| corrupt(format!("{TENSORS_KEY} is not JSON: {e}")))?;
        let obj = json
            .as_object()
            .ok_or_else(|| corrupt(format!("{TENSORS_KEY} is not a JSON object")))?;
        for (name, spec) in obj {
            let spec = TensorSpec::from_json(spec)
                .map_err(|e| corrupt(format!("kasoku tensor '{name}': {e}")))?;
            d.specs.insert(name.clone(), spec);
        }
        Ok(d)
    }

    /// Takes the tensor `st_name` if it is a part of a declared matrix (checking its element
    /// type and shape); `Ok(false)` for any other tensor.
    pub fn take_part(
        &mut self,
        st_name: &str,
        dtype: StDtype,
        shape: &[usize],
        bytes: impl FnOnce() -> TensorBytes,
        corrupt: &dyn Fn(String) -> FormatError,
    ) -> Result<bool, FormatError> {
        if self.specs.is_empty() {
            return Ok(false);
        }
        let Some((base, suffix)) = st_name.rsplit_once('.') else {
            return Ok(false);
        };
        let (slot, part) = match suffix {
            "codes" => (0, Part::Codes),
            "scales" => (1, Part::Scales),
            "zeros" => (2, Part::Zeros),
            _ => return Ok(false),
        };
        let Some(spec) = self.specs.get(base) else {
            return Err(corrupt(format!(
                "tensor '{st_name}' looks like a part of '{base}', which {TENSORS_KEY} does not \
                 declare"
            )));
        };
        if !spec.parts().contains(&part) {
            return Err(corrupt(format!(
                "tensor '{st_name}': a {} matrix has no {} part",
                spec,
                part.name()
            )));
        }
        let (want_shape, elem) = spec.part_layout(part);
        if dtype != st_dtype(elem) || shape != want_shape {
            return Err(corrupt(format!(
                "tensor '{st_name}' is {dtype:?} {shape:?}; its spec ({spec}, {}x{}) needs {elem} \
                 {want_shape:?}",
                spec.rows, spec.cols
            )));
        }
        let entry = self.parts.entry(base.to_string()).or_default();
        if entry[slot].is_some() {
            return Err(corrupt(format!("tensor '{st_name}' appears twice")));
        }
        entry[slot] = Some(bytes());
        Ok(true)
    }

    /// The declared matrices with all their parts (under their names in the file); an error
    /// names a matrix missing a part.
    pub fn finish(
        mut self,
        corrupt: &dyn Fn(String) -> FormatError,
    ) -> Result<Vec<QuantizedTensor>, FormatError> {
        let mut out = Vec::with_capacity(self.specs.len());
        for (name, spec) in &self.specs {
            let [codes, scales, zeros] = self.parts.remove(name).unwrap_or_default();
            let missing = |p: Part| {
                corrupt(format!(
                    "kasoku tensor '{name}' ({spec}) has no '{}'",
                    part_name(name, p)
                ))
            };
            let codes = codes.ok_or_else(|| missing(Part::Codes))?;
            let scales = scales.ok_or_else(|| missing(Part::Scales))?;
            let zeros = match (spec.parts().contains(&Part::Zeros), zeros) {
                (true, None) => return Err(missing(Part::Zeros)),
                (_, z) => z.unwrap_or_else(|| TensorBytes::from_vec(Vec::new())),
            };
            let q = QuantizedTensor::new(name, *spec, codes, scales, zeros)
                .map_err(|e| corrupt(format!("kasoku tensor '{name}': {e}")))?;
            out.push(q);
        }
        Ok(out)
    }
}
