//! Writing a checkpoint in kasoku's formats (`kasoku quantize`): every matrix the recipe
//! picks (`quant::kasoku::Recipe`) quantized to M or L, every other tensor kept (floats as they
//! are, GGUF block types dequantized to F32), all in one safetensors file laid out as
//! `format::kasoku_st` describes. The file is written as it is made: the header first (every
//! size is known from the specs), then each tensor in turn, so memory holds one matrix at a
//! time.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use serde_json::{json, Map, Value};

use super::kasoku_st::{part_name, NAMES_KEY, RECIPE_KEY, TENSORS_KEY, VERSION, VERSION_KEY};
use super::{FormatError, HfCheckpoint, TensorSource};
use crate::quant::kasoku::{quantize, Recipe, TensorSpec};
use crate::quant::{dequantize, DType};

/// How the written file names its tensors.
pub enum Naming<'a> {
    /// The source's (GGUF) names.
    Gguf,
    /// The Hugging Face names this checkpoint's tensors were read under (the source is it).
    Hf(&'a HfCheckpoint),
}

/// What was written.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WriteReport {
    /// Tensors of the source.
    pub tensors: usize,
    /// Of which quantized to kasoku's formats.
    pub quantized: usize,
    /// Values of the quantized matrices, and the bytes they take.
    pub quantized_values: u64,
    pub quantized_bytes: u64,
    /// Source tensors in GGUF block types that were dequantized (quantized again or kept as
    /// F32): requantizing compounds their error.
    pub dequantized: usize,
    /// Bytes of the file.
    pub file_bytes: u64,
}

impl WriteReport {
    /// Bits per weight of the quantized matrices.
    pub fn bits_per_weight(&self) -> f64 {
        self.quantized_bytes as f64 * 8.0 / self.quantized_values.max(1) as f64
    }
}

/// One tensor of the output.
enum Planned {
    Matrix {
        name: String,
        st_name: String,
        spec: TensorSpec,
    },
    Plain {
        name: String,
        st_name: String,
        dtype: DType,
        shape: Vec<usize>,
    },
}

/// Writes the tensors of `source` (GGUF names) to `path` as `recipe` says, calling
/// `progress(done, total, name)` before each tensor.
pub fn write_quantized(
    source: &dyn TensorSource,
    naming: Naming,
    recipe: Recipe,
    path: &Path,
    progress: &mut dyn FnMut(usize, usize, &str),
) -> Result<WriteReport, FormatError> {
    let bad = |reason: String| FormatError::Metadata {
        path: source.path().to_path_buf(),
        reason,
    };
    let mut plan = Vec::new();
    let mut report = WriteReport::default();
    // Whether the embedding table is also the head.
    let tied = source.get("output.weight").is_none() && source.quantized("output.weight").is_none();
    for name in source.names() {
        if source.quantized(&name).is_some() {
            return Err(bad(format!(
                "'{name}' is already in one of kasoku's formats; quantize the original checkpoint"
            )));
        }
        let t = source
            .get(&name)
            .ok_or_else(|| bad(format!("tensor '{name}' is listed but cannot be read")))?;
        let st_name = match &naming {
            Naming::Gguf => name.clone(),
            Naming::Hf(hf) => hf
                .hf_name(&name)
                .map(str::to_string)
                .ok_or_else(|| bad(format!("no HF name for '{name}'")))?,
        };
        report.tensors += 1;
        report.dequantized += usize::from(t.dtype.is_quantized());
        let spec = match t.shape[..] {
            [rows, cols] if name == "token_embd.weight" => recipe.embedding_spec(rows, cols, tied),
            [rows, cols] => recipe.spec_for(&name, rows, cols),
            _ => None,
        };
        plan.push(match spec {
            Some(spec) => Planned::Matrix {
                name,
                st_name,
                spec,
            },
            None => Planned::Plain {
                name,
                st_name,
                dtype: if t.dtype.is_quantized() {
                    DType::F32
                } else {
                    t.dtype
                },
                shape: t.shape.clone(),
            },
        });
    }

    // The header: every tensor's type, shape and place, and the specs.
    let mut header = Map::new();
    let mut specs = Map::new();
    let mut offset = 0usize;
    let mut entry = |st: String, dtype: &str, shape: Vec<usize>, len: usize| {
        header.insert(
            st,
            json!({"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len]}),
        );
        offset += len;
    };
    for p in &plan {
        match p {
            Planned::Matrix { st_name, spec, .. } => {
                specs.insert(st_name.clone(), spec.to_json());
                for &part in spec.parts() {
                    let (shape, elem) = spec.part_layout(part);
                    let len = spec.row_bytes(part) * spec.rows;
                    entry(part_name(st_name, part), elem, shape.to_vec(), len);
                }
            }
            Planned::Plain {
                st_name,
                dtype,
                shape,
                ..
            } => {
                let n: usize = shape.iter().product();
                let len = dtype
                    .bytes_for(n)
                    .ok_or_else(|| bad(format!("'{st_name}': {n} values of {dtype}")))?;
                entry(st_name.clone(), dtype.name(), shape.clone(), len);
            }
        }
    }
    let total_data = offset;
    let mut meta = Map::new();
    meta.insert(VERSION_KEY.into(), Value::String(VERSION.into()));
    meta.insert(
        TENSORS_KEY.into(),
        Value::String(Value::Object(specs).to_string()),
    );
    let names = match naming {
        Naming::Gguf => "gguf",
        Naming::Hf(_) => "hf",
    };
    meta.insert(NAMES_KEY.into(), Value::String(names.into()));
    meta.insert(
        RECIPE_KEY.into(),
        Value::String(format!(
            "{} m_group={} rotate={}",
            recipe.scheme.name(),
            recipe.m_group,
            recipe.rotate
        )),
    );
    header.insert("__metadata__".into(), Value::Object(meta));
    let mut head = Value::Object(header).to_string().into_bytes();
    while !head.len().is_multiple_of(8) {
        head.push(b' ');
    }

    let io = |source| FormatError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut out = BufWriter::new(File::create(path).map_err(io)?);
    out.write_all(&(head.len() as u64).to_le_bytes())
        .map_err(io)?;
    out.write_all(&head).map_err(io)?;
    let total = plan.len();
    for (i, p) in plan.iter().enumerate() {
        match p {
            Planned::Matrix { name, spec, .. } => {
                progress(i, total, name);
                let t = source
                    .get(name)
                    .ok_or_else(|| bad(format!("tensor '{name}' vanished while writing")))?;
                let mut values = vec![0f32; spec.rows * spec.cols];
                dequantize_checked(&t.dtype, t.data.as_slice(), &mut values)
                    .map_err(|r| bad(format!("'{name}': {r}")))?;
                let q = quantize(*spec, &values)
                    .map_err(|e| bad(format!("quantizing '{name}' to {spec}: {e}")))?;
                for &part in spec.parts() {
                    out.write_all(q.part(part)).map_err(io)?;
                }
                report.quantized += 1;
                report.quantized_values += (spec.rows * spec.cols) as u64;
                report.quantized_bytes += spec.total_bytes() as u64;
            }
            Planned::Plain { name, dtype, .. } => {
                progress(i, total, name);
                let t = source
                    .get(name)
                    .ok_or_else(|| bad(format!("tensor '{name}' vanished while writing")))?;
                if t.dtype == *dtype {
                    out.write_all(t.data.as_slice()).map_err(io)?;
                } else {
                    let mut values = vec![0f32; t.numel()];
                    dequantize_checked(&t.dtype, t.data.as_slice(), &mut values)
                        .map_err(|r| bad(format!("'{name}': {r}")))?;
                    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
                    out.write_all(&bytes).map_err(io)?;
                }
            }
        }
    }
    progress(total, total, "");
    out.flush().map_err(io)?;
    report.file_bytes = (8 + head.len() + total_data) as u64;
    Ok(report)
}

/// [`dequantize`] after checking the sizes agree.
fn dequantize_checked(dtype: &DType, bytes: &[u8], out: &mut [f32]) -> Result<(), String> {
    if dtype.bytes_for(out.len()) != Some(bytes.len()) {
        return Err(format!(
            "{} bytes cannot hold {} values of {dtype}",
            bytes.len(),
            out.len()
        ));
    }
    dequantize(*dtype, bytes, out);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::test_util::ScratchDir;
    use crate::format::HfCheckpoint;
    use crate::model::testing::{kasoku_sized_config, random_weights};
    use crate::model::{Arch, SourceKind};
    use crate::model::{Logits, Model};
    use crate::quant::kasoku::Scheme;
    use crate::quant::Target;

    /// A written checkpoint loads into the model that quantizing at load gives, bit for bit;
    /// damaged copies are refused with errors that name the problem.
    #[test]
    fn written_checkpoints_load_as_quantized_at_load_and_damage_is_named() {
        let cfg = kasoku_sized_config(Arch::Qwen2, SourceKind::Gguf);
        let src = random_weights(&cfg, 3);
        let dir = ScratchDir::new("kasoku-write");
        let file = dir.join("model.safetensors");
        for scheme in [Scheme::M, Scheme::L, Scheme::Mixed] {
            let recipe = Recipe::new(scheme);
            let mut calls = 0;
            let report =
                write_quantized(&src, Naming::Gguf, recipe, &file, &mut |_, _, _| calls += 1)
                    .unwrap();
            assert_eq!(report.file_bytes, std::fs::metadata(&file).unwrap().len());
            assert!(report.quantized > 0 && calls == report.tensors + 1);
            let ckpt = HfCheckpoint::open_gguf_named(dir.path()).unwrap();
            let stored = Model::from_source_with(cfg.clone(), &ckpt, None).unwrap();
            let at_load =
                Model::from_source_with(cfg.clone(), &src, Some(Target::Kasoku(recipe))).unwrap();
            let toks = [3u32, 9, 27, 4, 1];
            let run = |m: &Model| {
                let mut st = m.new_state(16);
                m.forward(&mut st, &toks, Logits::All).unwrap()
            };
            assert_eq!(run(&stored), run(&at_load), "{scheme:?}");
        }
        // Damage: a spec whose shape disagrees with its parts, a missing part, a part of no
        // declared matrix, a bad version.
        let bytes = std::fs::read(&file).unwrap();
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let header = std::str::from_utf8(&bytes[8..8 + n]).unwrap().to_string();
        let cases = [
            (
                header.replacen("\\\"shape\\\":[64,64]", "\\\"shape\\\":[32,64]", 1),
                "needs",
            ),
            (
                header.replacen("blk.0.ffn_up.weight.codes", "blk.0.ffn_up.weight.codez", 1),
                "ffn_up.weight.codez",
            ),
            (
                header.replacen("blk.0.ffn_up.weight.codes", "blk.0.ffn_uq.weight.codes", 1),
                "does not declare",
            ),
            (
                header.replacen("\"kasoku.version\":\"1\"", "\"kasoku.version\":\"9\"", 1),
                "version",
            ),
        ];
        for (i, (h, want)) in cases.iter().enumerate() {
            assert_ne!(h, &header, "case {i} changed nothing");
            let mut h = h.clone().into_bytes();
            h.resize(n, b' ');
            let mut damaged = bytes.clone();
            damaged[8..8 + n].copy_from_slice(&h);
            std::fs::write(&file, &damaged).unwrap();
            let e = HfCheckpoint::open_gguf_named(dir.path())
                .unwrap_err()
                .to_string();
            assert!(e.contains(want), "case {i}: {e}");
        }
    }
}
