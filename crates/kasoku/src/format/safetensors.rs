//! Hugging Face checkpoint directories: `config.json` plus `model.safetensors`, or shards listed
//! by `model.safetensors.index.json`; every shard memory-mapped, headers parsed and validated
//! by the `safetensors` crate. Tensors are exposed under GGUF names ([`super::hf_names`]), so
//! model code knows one naming scheme; [`HfCheckpoint::hf_name`] gives the original name.
//! Element types: F32, F16, BF16 (anything else is [`FormatError::UnsupportedType`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ::safetensors::tensor::Dtype as StDtype;
use ::safetensors::SafeTensors;
use memmap2::Mmap;

use super::hf_names::{translate, HfName};
use super::kasoku_st::Declared;
use super::{
    FormatError, HfConfig, QuantizedTensor, RawTensor, SourceOrigin, TensorBytes, TensorSource,
};
use crate::quant::DType;

const SINGLE: &str = "model.safetensors";
const INDEX: &str = "model.safetensors.index.json";

struct Entry {
    name: String,
    hf_name: String,
    shard: usize,
    dtype: DType,
    shape: Vec<usize>,
    start: usize,
    len: usize,
}

/// An open Hugging Face checkpoint directory.
pub struct HfCheckpoint {
    dir: PathBuf,
    config: HfConfig,
    shards: Vec<(PathBuf, Arc<Mmap>)>,
    entries: Vec<Entry>,
    by_name: HashMap<String, usize>,
    skipped: Vec<String>,
    /// Matrices in kasoku's formats, by GGUF name (see `kasoku_st`).
    quantized: BTreeMap<String, QuantizedTensor>,
    /// Whether the files use GGUF names and conventions (`kasoku.names = "gguf"`).
    gguf_names: Option<bool>,
}

impl std::fmt::Debug for HfCheckpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HfCheckpoint")
            .field("dir", &self.dir)
            .field("model_type", &self.config.model_type())
            .field("shards", &self.shards.len())
            .field("tensors", &self.entries.len())
            .finish()
    }
}

impl HfCheckpoint {
    /// Opens `dir` (config.json and the safetensors file(s)), maps and validates every shard.
    pub fn open(dir: impl AsRef<Path>) -> Result<HfCheckpoint, FormatError> {
        let dir = dir.as_ref().to_path_buf();
        let config = HfConfig::load(&dir)?;
        Self::open_with(dir, config)
    }

    /// Opens the safetensors of `dir` without a `config.json`, for the checkpoints
    /// `kasoku quantize` writes from a GGUF file (GGUF names; their configuration is the GGUF
    /// metadata beside them, `format::checkpoint`). The files must say they use GGUF names.
    pub fn open_gguf_named(dir: impl AsRef<Path>) -> Result<HfCheckpoint, FormatError> {
        let dir = dir.as_ref().to_path_buf();
        let ckpt = Self::open_with(dir.clone(), HfConfig::minimal(&dir, "gguf"))?;
        if ckpt.gguf_names != Some(true) {
            return Err(FormatError::Metadata {
                path: dir,
                reason: format!(
                    "the safetensors beside kasoku.gguf do not declare {}=gguf",
                    super::kasoku_st::NAMES_KEY
                ),
            });
        }
        Ok(ckpt)
    }

    fn open_with(dir: PathBuf, config: HfConfig) -> Result<HfCheckpoint, FormatError> {
        let index_path = dir.join(INDEX);
        let shard_files: Vec<String> = if index_path.exists() {
            read_index(&index_path)?
        } else {
            vec![SINGLE.to_string()]
        };

        let mut ckpt = HfCheckpoint {
            dir,
            config,
            shards: Vec::new(),
            entries: Vec::new(),
            by_name: HashMap::new(),
            skipped: Vec::new(),
            quantized: BTreeMap::new(),
            gguf_names: None,
        };
        for file in shard_files {
            ckpt.add_shard(&file)?;
        }
        Ok(ckpt)
    }

    fn add_shard(&mut self, file: &str) -> Result<(), FormatError> {
        let path = self.dir.join(file);
        let io = |source| FormatError::Io {
            path: path.clone(),
            source,
        };
        let handle = File::open(&path).map_err(io)?;
        if handle.metadata().map_err(io)?.len() < 8 {
            return Err(FormatError::Corrupt {
                path,
                reason: "too short for a safetensors header".into(),
            });
        }
        // SAFETY: read-only map of a file this process does not modify (see gguf.rs).
        let mmap = Arc::new(unsafe { Mmap::map(&handle) }.map_err(io)?);
        let corrupt = |reason: String| FormatError::Corrupt {
            path: path.clone(),
            reason,
        };
        let (header_len, metadata) = SafeTensors::read_metadata(&mmap)
            .map_err(|e| corrupt(format!("safetensors header: {e}")))?;
        let data_start = 8 + header_len; // read_metadata checked this fits the file
        let shard = self.shards.len();
        let mut declared = Declared::read(metadata.metadata().as_ref(), &corrupt)?;
        // Every shard of a checkpoint names its tensors one way.
        let gguf_names = declared.gguf_names;
        if *self.gguf_names.get_or_insert(gguf_names) != gguf_names {
            return Err(corrupt("shards disagree on their naming scheme".into()));
        }
        let model_type = self.config.model_type().to_string();
        let translated = |st_name: &str| {
            if gguf_names {
                HfName::Name(st_name.to_string())
            } else {
                translate(&model_type, st_name)
            }
        };
        for hf_name in metadata.offset_keys() {
            let info = metadata
                .info(&hf_name)
                .expect("offset_keys lists known tensors");
            let (s, e) = info.data_offsets;
            let part = declared.take_part(
                &hf_name,
                info.dtype,
                &info.shape,
                || TensorBytes::mapped(mmap.clone(), data_start + s, e - s),
                &corrupt,
            )?;
            if part {
                continue;
            }
            let name = match translated(&hf_name) {
                HfName::Skipped => {
                    self.skipped.push(hf_name);
                    continue;
                }
                HfName::Name(n) => n,
            };
            let dtype = match info.dtype {
                StDtype::F32 => DType::F32,
                StDtype::F16 => DType::F16,
                StDtype::BF16 => DType::BF16,
                other => {
                    return Err(FormatError::UnsupportedType {
                        path: path.clone(),
                        tensor: hf_name,
                        type_name: format!("{other:?}"),
                    })
                }
            };
            if self.by_name.contains_key(&name) || self.quantized.contains_key(&name) {
                return Err(corrupt(format!(
                    "tensor '{hf_name}' duplicates '{name}' (from another name or shard)"
                )));
            }
            self.by_name.insert(name.clone(), self.entries.len());
            self.entries.push(Entry {
                name,
                hf_name,
                shard,
                dtype,
                shape: info.shape.clone(),
                start: data_start + s,
                len: e - s,
            });
        }
        for mut q in declared.finish(&corrupt)? {
            let name = match translated(&q.name) {
                HfName::Skipped => {
                    self.skipped.push(q.name);
                    continue;
                }
                HfName::Name(n) => n,
            };
            if self.by_name.contains_key(&name) || self.quantized.contains_key(&name) {
                return Err(corrupt(format!(
                    "kasoku tensor '{}' duplicates '{name}' (from another name or shard)",
                    q.name
                )));
            }
            q.name = name.clone();
            self.quantized.insert(name, q);
        }
        self.shards.push((path, mmap));
        Ok(())
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn config(&self) -> &HfConfig {
        &self.config
    }

    /// The original HF name of a tensor known by its GGUF name.
    pub fn hf_name(&self, name: &str) -> Option<&str> {
        self.by_name
            .get(name)
            .map(|&i| self.entries[i].hf_name.as_str())
    }

    /// HF names of tensors hidden from the source (the vision tower).
    pub fn skipped(&self) -> &[String] {
        &self.skipped
    }

    /// Paths of the shard files, in load order.
    pub fn shard_paths(&self) -> Vec<&Path> {
        self.shards.iter().map(|(p, _)| p.as_path()).collect()
    }
}

/// The distinct shard file names of an index, in first-seen order. Names must be plain file
/// names (no directories), so a hostile index cannot point outside the checkpoint.
fn read_index(path: &Path) -> Result<Vec<String>, FormatError> {
    let bad = |reason: String| FormatError::Metadata {
        path: path.to_path_buf(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|source| FormatError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let json: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| bad(format!("invalid JSON: {e}")))?;
    let map = json
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| bad("missing object 'weight_map'".into()))?;
    let mut seen = BTreeSet::new();
    let mut files = Vec::new();
    for (tensor, file) in map {
        let file = file
            .as_str()
            .ok_or_else(|| bad(format!("weight_map['{tensor}'] is not a string")))?;
        let plain =
            Path::new(file).file_name().is_some_and(|f| f == file) && file != "." && file != "..";
        if !plain {
            return Err(bad(format!(
                "weight_map['{tensor}'] = '{file}' is not a file name in this directory"
            )));
        }
        if seen.insert(file.to_string()) {
            files.push(file.to_string());
        }
    }
    Ok(files)
}

impl TensorSource for HfCheckpoint {
    fn path(&self) -> &Path {
        &self.dir
    }

    fn names(&self) -> Vec<String> {
        let plain = self.entries.iter().map(|e| e.name.clone());
        plain.chain(self.quantized.keys().cloned()).collect()
    }

    fn quantized(&self, name: &str) -> Option<QuantizedTensor> {
        self.quantized.get(name).cloned()
    }

    fn get(&self, name: &str) -> Option<RawTensor> {
        let e = &self.entries[*self.by_name.get(name)?];
        let map = self.shards[e.shard].1.clone();
        Some(RawTensor {
            name: e.name.clone(),
            dtype: e.dtype,
            shape: e.shape.clone(),
            data: TensorBytes::mapped(map, e.start, e.len),
        })
    }

    fn origin(&self) -> SourceOrigin {
        if self.gguf_names == Some(true) {
            SourceOrigin::Gguf
        } else {
            SourceOrigin::HuggingFace
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::test_util::ScratchDir;
    use crate::format::Claims;
    use ::safetensors::tensor::TensorView;

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    /// Writes a safetensors file of `(name, dtype, shape, bytes)` with the crate's serializer.
    fn write_st(path: &Path, tensors: &[(&str, StDtype, Vec<usize>, Vec<u8>)]) {
        let views: Vec<(String, TensorView)> = tensors
            .iter()
            .map(|(n, d, s, b)| (n.to_string(), TensorView::new(*d, s.clone(), b).unwrap()))
            .collect();
        let bytes = ::safetensors::serialize(views, None).unwrap();
        std::fs::write(path, bytes).unwrap();
    }

    fn write_config(dir: &ScratchDir, model_type: &str) {
        std::fs::write(
            dir.join("config.json"),
            format!(r#"{{"model_type": "{model_type}"}}"#),
        )
        .unwrap();
    }

    #[test]
    fn single_file_checkpoint() {
        let dir = ScratchDir::new("st-single");
        write_config(&dir, "qwen2");
        let bf16: Vec<u8> = vec![0x80, 0x3f, 0x00, 0x40]; // 1.0, 2.0
        write_st(
            &dir.join(SINGLE),
            &[
                (
                    "model.embed_tokens.weight",
                    StDtype::F32,
                    vec![2, 3],
                    f32_bytes(&[1., 2., 3., 4., 5., 6.]),
                ),
                (
                    "model.layers.0.self_attn.q_proj.bias",
                    StDtype::BF16,
                    vec![2],
                    bf16.clone(),
                ),
                (
                    "model.layers.0.post_attention_layernorm.weight",
                    StDtype::F16,
                    vec![1],
                    vec![0, 0x3c],
                ),
                (
                    "lm_head.weight",
                    StDtype::F32,
                    vec![1, 2],
                    f32_bytes(&[7., 8.]),
                ),
            ],
        );
        let ck = HfCheckpoint::open(dir.path()).unwrap();
        assert_eq!(ck.origin(), SourceOrigin::HuggingFace);
        let mut names = ck.names();
        names.sort();
        assert_eq!(
            names,
            [
                "blk.0.attn_q.bias",
                "blk.0.ffn_norm.weight",
                "output.weight",
                "token_embd.weight"
            ]
        );
        let e = ck.get("token_embd.weight").unwrap();
        assert_eq!(
            (e.dtype, e.shape.as_slice()),
            (DType::F32, [2usize, 3].as_slice())
        );
        assert_eq!(
            e.data.as_slice(),
            f32_bytes(&[1., 2., 3., 4., 5., 6.]).as_slice()
        );
        let b = ck.get("blk.0.attn_q.bias").unwrap();
        assert_eq!((b.dtype, b.data.as_slice()), (DType::BF16, bf16.as_slice()));
        assert_eq!(
            ck.get("output.weight").unwrap().data.as_slice(),
            f32_bytes(&[7., 8.]).as_slice()
        );
        assert_eq!(
            ck.hf_name("blk.0.ffn_norm.weight"),
            Some("model.layers.0.post_attention_layernorm.weight")
        );

        // Strict claiming over translated names.
        let claims = Claims::new(&ck);
        claims.take("token_embd.weight", &[2, 3]).unwrap();
        let msg = claims
            .take("output.weight", &[2, 2])
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("'output.weight'") && msg.contains(&dir.path().display().to_string()),
            "{msg}"
        );
        let msg = claims.finish().unwrap_err().to_string();
        assert!(
            msg.contains("blk.0.attn_q.bias") && msg.contains("output.weight"),
            "{msg}"
        );
    }

    #[test]
    fn sharded_checkpoint_with_vision_and_mtp() {
        let dir = ScratchDir::new("st-sharded");
        std::fs::write(
            dir.join("config.json"),
            r#"{"model_type": "qwen3_5", "text_config": {"model_type": "qwen3_5_text"}}"#,
        )
        .unwrap();
        let s1 = "model-00001-of-00002.safetensors";
        let s2 = "model-00002-of-00002.safetensors";
        write_st(
            &dir.join(s1),
            &[
                (
                    "model.language_model.layers.0.linear_attn.A_log",
                    StDtype::F32,
                    vec![2],
                    f32_bytes(&[0.5, -0.5]),
                ),
                (
                    "model.visual.blocks.0.norm.weight",
                    StDtype::I64,
                    vec![1],
                    vec![0; 8],
                ),
            ],
        );
        write_st(
            &dir.join(s2),
            &[
                (
                    "model.language_model.layers.0.post_attention_layernorm.weight",
                    StDtype::F32,
                    vec![1],
                    f32_bytes(&[1.]),
                ),
                (
                    "mtp.fc.weight",
                    StDtype::F32,
                    vec![1, 2],
                    f32_bytes(&[3., 4.]),
                ),
            ],
        );
        let index = format!(
            r#"{{"metadata": {{"total_size": 28}}, "weight_map": {{
                "model.language_model.layers.0.linear_attn.A_log": "{s1}",
                "model.visual.blocks.0.norm.weight": "{s1}",
                "model.language_model.layers.0.post_attention_layernorm.weight": "{s2}",
                "mtp.fc.weight": "{s2}"}}}}"#
        );
        std::fs::write(dir.join(INDEX), index).unwrap();
        let ck = HfCheckpoint::open(dir.path()).unwrap();
        assert_eq!(ck.shard_paths().len(), 2);
        assert_eq!(
            ck.names(),
            [
                "blk.0.ssm_a",
                "blk.0.post_attention_norm.weight",
                "mtp.fc.weight"
            ]
        );
        assert_eq!(ck.skipped(), ["model.visual.blocks.0.norm.weight"]);
        assert_eq!(
            ck.get("blk.0.ssm_a").unwrap().data.as_slice(),
            f32_bytes(&[0.5, -0.5]).as_slice()
        );
        assert_eq!(
            ck.get("mtp.fc.weight").unwrap().data.as_slice(),
            f32_bytes(&[3., 4.]).as_slice()
        );
        assert_eq!(ck.config().model_type(), "qwen3_5");

        // An index pointing outside the directory is refused.
        std::fs::write(
            dir.join(INDEX),
            r#"{"weight_map": {"x": "../evil.safetensors"}}"#,
        )
        .unwrap();
        let msg = HfCheckpoint::open(dir.path()).unwrap_err().to_string();
        assert!(msg.contains("not a file name"), "{msg}");
        // A missing shard names its path.
        std::fs::write(
            dir.join(INDEX),
            r#"{"weight_map": {"x": "absent.safetensors"}}"#,
        )
        .unwrap();
        let msg = HfCheckpoint::open(dir.path()).unwrap_err().to_string();
        assert!(msg.contains("absent.safetensors"), "{msg}");
    }

    #[test]
    fn bad_files_are_errors() {
        let dir = ScratchDir::new("st-bad");
        write_config(&dir, "llama");
        write_st(
            &dir.join(SINGLE),
            &[(
                "model.layers.0.mlp.up_proj.weight",
                StDtype::I32,
                vec![2],
                vec![0; 8],
            )],
        );
        let e = HfCheckpoint::open(dir.path()).unwrap_err();
        assert!(
            matches!(&e, FormatError::UnsupportedType { tensor, .. } if tensor == "model.layers.0.mlp.up_proj.weight")
        );
        assert!(e.to_string().contains("I32"), "{e}");

        // Truncated data.
        write_st(
            &dir.join(SINGLE),
            &[("model.norm.weight", StDtype::F32, vec![4], vec![0; 16])],
        );
        let bytes = std::fs::read(dir.join(SINGLE)).unwrap();
        std::fs::write(dir.join(SINGLE), &bytes[..bytes.len() - 4]).unwrap();
        let msg = HfCheckpoint::open(dir.path()).unwrap_err().to_string();
        assert!(msg.contains(SINGLE) && msg.contains("corrupt"), "{msg}");
        // Absurd header length.
        let mut evil = u64::MAX.to_le_bytes().to_vec();
        evil.extend_from_slice(b"{}");
        std::fs::write(dir.join(SINGLE), evil).unwrap();
        assert!(matches!(
            HfCheckpoint::open(dir.path()),
            Err(FormatError::Corrupt { .. })
        ));
        // Empty file.
        std::fs::write(dir.join(SINGLE), b"").unwrap();
        assert!(matches!(
            HfCheckpoint::open(dir.path()),
            Err(FormatError::Corrupt { .. })
        ));
    }
}

/// The committed tiny fixtures: each HF checkpoint, read under GGUF names, has exactly the
/// tensors (and shapes) of the GGUF llama.cpp's converter made from it.
#[cfg(test)]
mod fixture_tests {
    use super::*;
    use crate::format::GgufFile;

    #[test]
    fn hf_names_agree_with_llama_cpp_converter() {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures");
        for fixture in [
            "llama/tiny",
            "llama/tiny_rope_llama3",
            "qwen2/tiny",
            "qwen3/tiny",
            "qwen3_5/tiny",
            "qwen3_5/tiny_vl",
        ] {
            let dir = root.join(fixture);
            let hf = HfCheckpoint::open(&dir).unwrap();
            if fixture.ends_with("_vl") {
                // No GGUF for the VL wrapper: every text tensor translates, the tower is skipped.
                assert!(
                    !hf.skipped().is_empty()
                        && hf.skipped().iter().all(|n| n.starts_with("model.visual."))
                );
                let names = hf.names();
                assert!(names.iter().all(|n| !n.starts_with("model.")), "{names:?}");
                assert!(
                    names.contains(&"blk.0.ssm_a".to_string())
                        && names.contains(&"output.weight".to_string())
                );
                continue;
            }
            let gguf = GgufFile::open(dir.join("model-f32.gguf")).unwrap();
            let mut hf_names = hf.names();
            hf_names.sort();
            // llama.cpp's converter adds a precomputed `rope_freqs` for llama3 rope scaling.
            let mut gguf_names: Vec<String> = gguf
                .names()
                .into_iter()
                .filter(|n| n != "rope_freqs.weight")
                .collect();
            gguf_names.sort();
            assert_eq!(hf_names, gguf_names, "{fixture}");
            for name in &hf_names {
                let (a, b) = (
                    hf.get(name).unwrap(),
                    TensorSource::get(&gguf, name).unwrap(),
                );
                let strip = |s: &[usize]| s.iter().copied().filter(|&d| d != 1).collect::<Vec<_>>();
                assert_eq!(strip(&a.shape), strip(&b.shape), "{fixture}: {name}");
            }
        }
    }
}
