//! Hugging Face `config.json` and `generation_config.json` reading.
//!
//! Vision-language checkpoints (all official Qwen3.5 releases) nest the language model's fields
//! under `text_config`; [`HfConfig`] reads from there when present, else from the root, and
//! falls back to the root for keys the nested object lacks (e.g. a duplicated
//! `tie_word_embeddings`). Every typed getter's error names the file and the key.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::FormatError;

/// A parsed `config.json`.
#[derive(Clone, Debug)]
pub struct HfConfig {
    path: PathBuf,
    root: Map<String, Value>,
    /// `text_config` if present (else `None`: fields are read from the root).
    text: Option<Map<String, Value>>,
    model_type: String,
}

fn read_json_object(path: &Path) -> Result<Map<String, Value>, FormatError> {
    let text = std::fs::read_to_string(path).map_err(|source| FormatError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    match serde_json::from_str::<Value>(&text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(FormatError::Metadata {
            path: path.to_path_buf(),
            reason: "not a JSON object".into(),
        }),
        Err(e) => Err(FormatError::Metadata {
            path: path.to_path_buf(),
            reason: format!("invalid JSON: {e}"),
        }),
    }
}

/// `qwen3_5_text` → `qwen3_5`, `qwen3_5_moe_text` → `qwen3_5_moe`; other names unchanged.
pub fn normalise_model_type(model_type: &str) -> &str {
    model_type.strip_suffix("_text").unwrap_or(model_type)
}

impl HfConfig {
    /// Reads `dir/config.json`.
    pub fn load(dir: impl AsRef<Path>) -> Result<HfConfig, FormatError> {
        Self::from_file(dir.as_ref().join("config.json"))
    }

    /// A configuration that only names a model type (for sources whose real configuration
    /// is elsewhere: see `HfCheckpoint::open_gguf_named`).
    pub(crate) fn minimal(dir: &Path, model_type: &str) -> HfConfig {
        HfConfig {
            path: dir.to_path_buf(),
            root: Map::new(),
            text: None,
            model_type: model_type.to_string(),
        }
    }

    /// Reads a config file at an explicit path.
    pub fn from_file(path: impl AsRef<Path>) -> Result<HfConfig, FormatError> {
        let path = path.as_ref().to_path_buf();
        let root = read_json_object(&path)?;
        let text = match root.get("text_config") {
            Some(Value::Object(t)) => Some(t.clone()),
            Some(Value::Null) | None => None,
            Some(_) => {
                return Err(FormatError::Metadata {
                    path,
                    reason: "'text_config' is not an object".into(),
                });
            }
        };
        let model_type = text
            .as_ref()
            .and_then(|t| t.get("model_type"))
            .or_else(|| root.get("model_type"))
            .and_then(Value::as_str)
            .map(|s| normalise_model_type(s).to_string())
            .ok_or_else(|| FormatError::Metadata {
                path: path.clone(),
                reason: "missing key 'model_type'".into(),
            })?;
        Ok(HfConfig {
            path,
            root,
            text,
            model_type,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The language model's type, normalised (`llama`, `qwen2`, `qwen3`, `qwen3_5`...).
    pub fn model_type(&self) -> &str {
        &self.model_type
    }

    /// The top-level object.
    pub fn root(&self) -> &Map<String, Value> {
        &self.root
    }

    /// The object text fields are read from (`text_config`, or the root).
    pub fn text(&self) -> &Map<String, Value> {
        self.text.as_ref().unwrap_or(&self.root)
    }

    /// `architectures[0]` of the root (e.g. `Qwen3_5ForConditionalGeneration`).
    pub fn architecture(&self) -> Option<&str> {
        self.root
            .get("architectures")?
            .as_array()?
            .first()?
            .as_str()
    }

    /// A text field (from `text_config`, falling back to the root). JSON `null` reads as absent.
    pub fn value(&self, key: &str) -> Option<&Value> {
        let v = self.text().get(key).or_else(|| self.root.get(key))?;
        (!v.is_null()).then_some(v)
    }

    fn err(&self, key: &str, reason: &str) -> FormatError {
        FormatError::Metadata {
            path: self.path.clone(),
            reason: format!("key '{key}': {reason}"),
        }
    }

    fn typed<T>(
        &self,
        key: &str,
        what: &str,
        f: impl Fn(&Value) -> Option<T>,
    ) -> Result<Option<T>, FormatError> {
        match self.value(key) {
            None => Ok(None),
            Some(v) => f(v)
                .map(Some)
                .ok_or_else(|| self.err(key, &format!("{v} is not {what}"))),
        }
    }

    /// A non-negative integer field if present; an error if present with another type.
    pub fn opt_usize(&self, key: &str) -> Result<Option<usize>, FormatError> {
        self.typed(key, "a non-negative integer", |v| {
            v.as_u64().and_then(|n| usize::try_from(n).ok())
        })
    }

    pub fn opt_f64(&self, key: &str) -> Result<Option<f64>, FormatError> {
        self.typed(key, "a number", Value::as_f64)
    }

    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>, FormatError> {
        self.typed(key, "a boolean", Value::as_bool)
    }

    pub fn opt_str(&self, key: &str) -> Result<Option<&str>, FormatError> {
        match self.value(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| self.err(key, &format!("{v} is not a string"))),
        }
    }

    /// A required non-negative integer field.
    pub fn usize(&self, key: &str) -> Result<usize, FormatError> {
        self.opt_usize(key)?.ok_or_else(|| self.err(key, "missing"))
    }

    /// A required number.
    pub fn f64(&self, key: &str) -> Result<f64, FormatError> {
        self.opt_f64(key)?.ok_or_else(|| self.err(key, "missing"))
    }

    /// A required boolean.
    pub fn bool(&self, key: &str) -> Result<bool, FormatError> {
        self.opt_bool(key)?.ok_or_else(|| self.err(key, "missing"))
    }

    /// A required string.
    pub fn str(&self, key: &str) -> Result<&str, FormatError> {
        self.opt_str(key)?.ok_or_else(|| self.err(key, "missing"))
    }
}

/// Sampling defaults and stop tokens from `generation_config.json` (all optional).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GenerationDefaults {
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<usize>,
    pub min_p: Option<f64>,
    pub repetition_penalty: Option<f64>,
    pub do_sample: Option<bool>,
    pub bos_token_id: Option<u32>,
    /// `eos_token_id`, given in the file as one integer or a list.
    pub eos_token_ids: Vec<u32>,
}

impl GenerationDefaults {
    /// Reads `dir/generation_config.json`; all fields are `None`/empty if the file is absent.
    pub fn load(dir: impl AsRef<Path>) -> Result<GenerationDefaults, FormatError> {
        let path = dir.as_ref().join("generation_config.json");
        if !path.exists() {
            return Ok(GenerationDefaults::default());
        }
        let map = read_json_object(&path)?;
        let err = |key: &str, v: &Value, what: &str| FormatError::Metadata {
            path: path.clone(),
            reason: format!("key '{key}': {v} is not {what}"),
        };
        let get = |key: &str| map.get(key).filter(|v| !v.is_null());
        let f = |key: &str| {
            get(key)
                .map(|v| v.as_f64().ok_or_else(|| err(key, v, "a number")))
                .transpose()
        };
        let id = |key: &str, v: &Value| {
            v.as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| err(key, v, "a token id"))
        };
        let eos_token_ids = match get("eos_token_id") {
            None => Vec::new(),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| id("eos_token_id", v))
                .collect::<Result<_, _>>()?,
            Some(v) => vec![id("eos_token_id", v)?],
        };
        Ok(GenerationDefaults {
            temperature: f("temperature")?,
            top_p: f("top_p")?,
            top_k: get("top_k")
                .map(|v| {
                    v.as_u64()
                        .map(|n| n as usize)
                        .ok_or_else(|| err("top_k", v, "an integer"))
                })
                .transpose()?,
            min_p: f("min_p")?,
            repetition_penalty: f("repetition_penalty")?,
            do_sample: get("do_sample")
                .map(|v| v.as_bool().ok_or_else(|| err("do_sample", v, "a boolean")))
                .transpose()?,
            bos_token_id: get("bos_token_id")
                .map(|v| id("bos_token_id", v))
                .transpose()?,
            eos_token_ids,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::test_util::ScratchDir;

    #[test]
    fn nested_text_config_and_typed_getters() {
        let dir = ScratchDir::new("hfcfg");
        std::fs::write(
            dir.join("config.json"),
            r#"{"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
                "tie_word_embeddings": true, "vision_config": {"depth": 1},
                "text_config": {"model_type": "qwen3_5_text", "hidden_size": 1024, "rms_norm_eps": 1e-6,
                   "attention_bias": false, "hidden_act": "silu", "head_dim": null, "layer_types": ["a", "b"]}}"#,
        )
        .unwrap();
        let c = HfConfig::load(dir.path()).unwrap();
        assert_eq!(c.model_type(), "qwen3_5");
        assert_eq!(c.architecture(), Some("Qwen3_5ForConditionalGeneration"));
        assert_eq!(c.usize("hidden_size").unwrap(), 1024);
        assert_eq!(c.f64("rms_norm_eps").unwrap(), 1e-6);
        assert_eq!(c.f64("hidden_size").unwrap(), 1024.0);
        assert!(!c.bool("attention_bias").unwrap());
        assert!(
            c.bool("tie_word_embeddings").unwrap(),
            "falls back to the root"
        );
        assert_eq!(c.str("hidden_act").unwrap(), "silu");
        assert_eq!(
            c.opt_usize("head_dim").unwrap(),
            None,
            "null reads as absent"
        );
        assert_eq!(
            c.value("layer_types")
                .and_then(Value::as_array)
                .map(Vec::len),
            Some(2)
        );
        let p = dir.join("config.json").display().to_string();
        let e = c.usize("hidden_act").unwrap_err().to_string();
        assert!(e.contains(&p) && e.contains("'hidden_act'"), "{e}");
        let e = c.usize("num_hidden_layers").unwrap_err().to_string();
        assert!(
            e.contains(&p) && e.contains("'num_hidden_layers'") && e.contains("missing"),
            "{e}"
        );
        assert!(
            c.usize("rms_norm_eps").is_err(),
            "a float is not an integer"
        );
    }

    #[test]
    fn flat_config_and_errors() {
        let dir = ScratchDir::new("hfcfg2");
        std::fs::write(
            dir.join("config.json"),
            r#"{"model_type": "llama", "hidden_size": 576}"#,
        )
        .unwrap();
        let c = HfConfig::load(dir.path()).unwrap();
        assert_eq!(
            (c.model_type(), c.usize("hidden_size").unwrap()),
            ("llama", 576)
        );
        std::fs::write(dir.join("config.json"), r#"{"hidden_size": 576}"#).unwrap();
        assert!(HfConfig::load(dir.path())
            .unwrap_err()
            .to_string()
            .contains("model_type"));
        std::fs::write(dir.join("config.json"), "{not json").unwrap();
        assert!(HfConfig::load(dir.path())
            .unwrap_err()
            .to_string()
            .contains("invalid JSON"));
        std::fs::remove_file(dir.join("config.json")).unwrap();
        assert!(matches!(
            HfConfig::load(dir.path()),
            Err(FormatError::Io { .. })
        ));
    }

    #[test]
    fn generation_defaults() {
        let dir = ScratchDir::new("gencfg");
        assert_eq!(
            GenerationDefaults::load(dir.path()).unwrap(),
            GenerationDefaults::default()
        );
        std::fs::write(
            dir.join("generation_config.json"),
            r#"{"temperature": 0.7, "top_p": 0.8, "top_k": 20, "eos_token_id": [151645, 151643], "bos_token_id": 1}"#,
        )
        .unwrap();
        let g = GenerationDefaults::load(dir.path()).unwrap();
        assert_eq!(g.temperature, Some(0.7));
        assert_eq!(g.top_p, Some(0.8));
        assert_eq!(g.top_k, Some(20));
        assert_eq!(g.eos_token_ids, vec![151645, 151643]);
        assert_eq!(g.bos_token_id, Some(1));
        std::fs::write(dir.join("generation_config.json"), r#"{"eos_token_id": 2}"#).unwrap();
        assert_eq!(
            GenerationDefaults::load(dir.path()).unwrap().eos_token_ids,
            vec![2]
        );
        std::fs::write(
            dir.join("generation_config.json"),
            r#"{"eos_token_id": "x"}"#,
        )
        .unwrap();
        assert!(GenerationDefaults::load(dir.path())
            .unwrap_err()
            .to_string()
            .contains("eos_token_id"));
    }
}
