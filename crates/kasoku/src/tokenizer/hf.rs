//! Loading a Hugging Face tokenizer directory: `tokenizer.json` (the `tokenizers` library reads
//! it), special tokens and `add_bos_token` from `tokenizer_config.json`, extra end-of-generation
//! ids from `generation_config.json` and `config.json`, the chat template from
//! `chat_template.jinja` or `tokenizer_config.json`.

use std::path::Path;

use serde_json::Value;

use super::{Parts, Spelling, TokenizerError};
use crate::format::{limits, GenerationDefaults, HfConfig};

fn read_json(path: &Path) -> Result<Option<Value>, TokenizerError> {
    if !path.exists() {
        return Ok(None);
    }
    let invalid = |reason: String| TokenizerError::Invalid {
        path: path.to_path_buf(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| invalid(e.to_string()))?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| invalid(format!("invalid JSON: {e}")))
}

/// A special-token entry of tokenizer_config.json: a string or `{"content": ...}`.
fn token_text(v: Option<&Value>) -> Option<&str> {
    match v? {
        Value::String(s) => Some(s),
        Value::Object(o) => o.get("content")?.as_str(),
        _ => None,
    }
}

/// The chat template of a tokenizer_config.json: a string, or a list of `{name, template}`
/// (the one named "default" is taken).
pub(super) fn config_template(config: &Value) -> Option<String> {
    match config.get("chat_template")? {
        Value::String(s) => Some(s.clone()),
        Value::Array(list) => list
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
            .and_then(|t| t.get("template")?.as_str())
            .map(str::to_string),
        _ => None,
    }
}

/// The chat template of a directory: `chat_template.jinja`, else tokenizer_config.json's.
pub(super) fn dir_template(dir: &Path) -> Result<Option<String>, TokenizerError> {
    let jinja = dir.join("chat_template.jinja");
    if jinja.exists() {
        let text = std::fs::read_to_string(&jinja).map_err(|e| TokenizerError::Invalid {
            path: jinja.clone(),
            reason: e.to_string(),
        })?;
        return Ok(Some(text));
    }
    Ok(read_json(&dir.join("tokenizer_config.json"))?
        .as_ref()
        .and_then(config_template))
}

/// Collects every `"type"` in a decoder's JSON, with the object it belongs to.
fn decoder_steps(v: &Value, out: &mut Vec<Value>) {
    match v {
        Value::Object(o) => {
            if o.contains_key("type") {
                out.push(v.clone());
            }
            o.values().for_each(|c| decoder_steps(c, out));
        }
        Value::Array(a) => a.iter().for_each(|c| decoder_steps(c, out)),
        _ => {}
    }
}

pub(super) fn load(dir: &Path) -> Result<Parts, TokenizerError> {
    let tj = dir.join("tokenizer.json");
    let invalid = |path: &Path, reason: String| TokenizerError::Invalid {
        path: path.to_path_buf(),
        reason,
    };
    if !tj.exists() {
        return Err(invalid(&tj, "not found".into()));
    }
    let tok = tokenizers::Tokenizer::from_file(&tj).map_err(|e| invalid(&tj, e.to_string()))?;

    // Id → piece, with added tokens.
    let vocab = tok.get_vocab(true);
    let n = vocab.values().map(|&i| i as usize + 1).max().unwrap_or(0);
    // Ids index the tables below: a single id of 4e9 must not allocate them 4e9 long.
    if n > limits::MAX_VOCAB {
        return Err(invalid(
            &tj,
            format!(
                "token id {} is above the limit of {} kasoku accepts",
                n - 1,
                limits::MAX_VOCAB - 1
            ),
        ));
    }
    let mut pieces = vec![String::new(); n];
    for (piece, id) in vocab {
        pieces[id as usize] = piece;
    }
    let mut control = vec![false; n];
    let mut verbatim = vec![false; n];
    for (id, added) in tok.get_added_tokens_decoder() {
        let i = id as usize;
        if i < n {
            control[i] = added.special;
            verbatim[i] = true;
        }
    }

    // How tokens spell bytes, from the decoder.
    let mut steps = Vec::new();
    if let Some(decoder) = tok.get_decoder() {
        let json =
            serde_json::to_value(decoder).map_err(|e| invalid(&tj, format!("decoder: {e}")))?;
        decoder_steps(&json, &mut steps);
    }
    let has = |t: &str| steps.iter().any(|s| s["type"] == t);
    let spelling = if has("ByteLevel") {
        Spelling::ByteLevel
    } else if has("ByteFallback")
        || has("Metaspace")
        || steps
            .iter()
            .any(|s| s["type"] == "Replace" && s["content"] == " ")
    {
        Spelling::SentencePiece
    } else {
        Spelling::Plain
    };
    let strip_leading_space = steps.iter().any(|s| {
        (s["type"] == "Strip" && s["content"] == " " && s["start"].as_u64().unwrap_or(0) >= 1)
            || (s["type"] == "Metaspace"
                && s["prepend_scheme"].as_str().is_some_and(|p| p != "never"))
    });

    let config = read_json(&dir.join("tokenizer_config.json"))?.unwrap_or(Value::Null);
    let id_of = |text: Option<&str>| text.and_then(|t| tok.token_to_id(t));
    let bos = id_of(token_text(config.get("bos_token")));
    let eos = id_of(token_text(config.get("eos_token")));

    let mut extra_eog = GenerationDefaults::load(dir)?.eos_token_ids;
    if dir.join("config.json").exists() {
        if let Some(v) = HfConfig::load(dir)?.value("eos_token_id") {
            let id = |x: &Value| x.as_u64().and_then(|x| u32::try_from(x).ok());
            match v {
                Value::Array(a) => extra_eog.extend(a.iter().filter_map(id)),
                _ => extra_eog.extend(id(v)),
            }
        }
    }
    extra_eog.retain(|&id| (id as usize) < n);

    let add_bos = match config.get("add_bos_token").and_then(Value::as_bool) {
        Some(b) => b,
        // No flag: does the post-processor put BOS first?
        None => match (bos, tok.encode("a", true), tok.encode("a", false)) {
            (Some(b), Ok(with), Ok(without)) => {
                with.get_ids().first() == Some(&b) && without.get_ids().first() != Some(&b)
            }
            _ => false,
        },
    };

    Ok(Parts {
        tok,
        pieces,
        control,
        verbatim,
        spelling,
        strip_leading_space,
        bos,
        eos,
        extra_eog,
        add_bos,
        chat_template: dir_template(dir)?,
        warnings: Vec::new(),
    })
}
