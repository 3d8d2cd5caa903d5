//! Tokenizers and chat templates.
//!
//! [`Tokenizer`] wraps a `tokenizers::Tokenizer` built either from a GGUF file's metadata
//! ([`Tokenizer::from_gguf`], matching llama.cpp's reading of the vocabulary) or from a Hugging
//! Face `tokenizer.json` ([`Tokenizer::from_hf_dir`]), and adds what an engine needs: the bytes of
//! every token (for exact streaming, [`StreamDecoder`]), BOS and all end-of-generation ids.
//!
//! Conventions:
//! - [`Tokenizer::encode`] never adds BOS; [`Tokenizer::encode_with_bos`] prepends it when the
//!   model wants one ([`Tokenizer::add_bos`]) and the text does not already start with it.
//! - `parse_special = true` matches control tokens (`<|im_start|>`) written in the text;
//!   with `false` they are tokenized as plain text. User-defined added tokens (`<think>`,
//!   `<tool_call>`) are matched whole either way, as llama.cpp and Hugging Face do.
//! - [`Tokenizer::decode`] renders control tokens as their text and, for SentencePiece
//!   vocabularies, drops the leading space of the first token; streams never drop it.

mod bytes;
pub mod chat_template;
mod error;
mod gguf_vocab;
mod guard;
mod hf;
mod stream;

use std::path::Path;
use std::sync::{Arc, OnceLock};

pub use bytes::Spelling;
pub use chat_template::{ChatMessage, ChatTemplate};
pub use error::TokenizerError;
pub use stream::StreamDecoder;

use crate::format::GgufFile;

/// Texts of control tokens that end generation (besides the file's own eos/eot/eom ids).
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|eom_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "<\u{ff5c}end\u{2581}of\u{2581}sentence\u{ff5c}>",
];

/// A tokenizer; cheap to clone (shared).
#[derive(Clone)]
pub struct Tokenizer {
    inner: Arc<Inner>,
}

struct Inner {
    /// Matches special tokens in text.
    tok: tokenizers::Tokenizer,
    /// Treats special tokens as text (made on first use).
    plain: OnceLock<tokenizers::Tokenizer>,
    pieces: Vec<String>,
    /// Token bytes, concatenated; token `i` is `bytes[offsets[i]..offsets[i + 1]]`.
    bytes: Vec<u8>,
    offsets: Vec<usize>,
    control: Vec<bool>,
    spelling: Spelling,
    strip_leading_space: bool,
    bos: Option<u32>,
    eos: Option<u32>,
    eos_ids: Vec<u32>,
    add_bos: bool,
    chat_template: Option<String>,
    warnings: Vec<String>,
}

/// Everything a constructor gathers; [`Tokenizer::assemble`] derives the rest.
struct Parts {
    tok: tokenizers::Tokenizer,
    pieces: Vec<String>,
    /// Control/special tokens (skipped by `decode_skip_special`, EOG candidates).
    control: Vec<bool>,
    /// Tokens whose text is taken literally (control and user-defined/added tokens).
    verbatim: Vec<bool>,
    spelling: Spelling,
    strip_leading_space: bool,
    bos: Option<u32>,
    eos: Option<u32>,
    extra_eog: Vec<u32>,
    add_bos: bool,
    chat_template: Option<String>,
    warnings: Vec<String>,
}

impl Tokenizer {
    /// The tokenizer described by a GGUF file's `tokenizer.ggml.*` metadata.
    pub fn from_gguf(gguf: &GgufFile) -> Result<Tokenizer, TokenizerError> {
        guard::guarded("building the tokenizer", || Self::from_gguf_unguarded(gguf)).unwrap_or_else(
            |reason| {
                Err(TokenizerError::Invalid {
                    path: gguf.path().to_path_buf(),
                    reason,
                })
            },
        )
    }

    fn from_gguf_unguarded(gguf: &GgufFile) -> Result<Tokenizer, TokenizerError> {
        let v = gguf_vocab::build(gguf)?;
        let control: Vec<bool> = v
            .types
            .iter()
            .map(|&t| t == gguf_vocab::TYPE_CONTROL || t == gguf_vocab::TYPE_UNKNOWN)
            .collect();
        let verbatim: Vec<bool> = v
            .types
            .iter()
            .zip(&control)
            .map(|(&t, &c)| c || t == gguf_vocab::TYPE_USER_DEFINED)
            .collect();
        Ok(Self::assemble(Parts {
            tok: v.tokenizer,
            pieces: v.pieces,
            control,
            verbatim,
            spelling: v.spelling,
            strip_leading_space: v.strip_leading_space,
            bos: v.bos,
            eos: v.eos,
            extra_eog: v.extra_eog,
            add_bos: v.add_bos,
            chat_template: gguf.get_str("tokenizer.chat_template").map(str::to_string),
            warnings: v.warnings,
        }))
    }

    /// The tokenizer of a Hugging Face directory: `tokenizer.json`, plus `tokenizer_config.json`
    /// (bos/eos, `add_bos_token`), `generation_config.json` and `config.json` (eos ids) if present.
    pub fn from_hf_dir(dir: impl AsRef<Path>) -> Result<Tokenizer, TokenizerError> {
        let dir = dir.as_ref();
        guard::guarded("loading the tokenizer", || {
            Ok(Self::assemble(hf::load(dir)?))
        })
        .unwrap_or_else(|reason| {
            Err(TokenizerError::Invalid {
                path: dir.join("tokenizer.json"),
                reason,
            })
        })
    }

    fn assemble(p: Parts) -> Tokenizer {
        let inverse = bytes::char_to_byte();
        let mut all = Vec::new();
        let mut offsets = Vec::with_capacity(p.pieces.len() + 1);
        offsets.push(0);
        for (i, piece) in p.pieces.iter().enumerate() {
            all.extend(bytes::token_bytes(
                piece,
                p.spelling,
                p.verbatim[i],
                &inverse,
            ));
            offsets.push(all.len());
        }
        let mut eos_ids: Vec<u32> = p.eos.into_iter().chain(p.extra_eog).collect();
        for (i, piece) in p.pieces.iter().enumerate() {
            if p.control[i] && EOG_TEXTS.contains(&piece.as_str()) {
                eos_ids.push(i as u32);
            }
        }
        let mut seen = std::collections::HashSet::new();
        eos_ids.retain(|id| seen.insert(*id));
        Tokenizer {
            inner: Arc::new(Inner {
                tok: p.tok,
                plain: OnceLock::new(),
                pieces: p.pieces,
                bytes: all,
                offsets,
                control: p.control,
                spelling: p.spelling,
                strip_leading_space: p.strip_leading_space,
                bos: p.bos,
                eos: p.eos,
                eos_ids,
                add_bos: p.add_bos,
                chat_template: p.chat_template,
                warnings: p.warnings,
            }),
        }
    }

    /// Token ids of `text`, without BOS. `parse_special`: match control tokens written in it.
    /// A panic inside the `tokenizers` library (some malformed tokenizer.json files make it
    /// index out of bounds on every encode) is an error too.
    pub fn encode(&self, text: &str, parse_special: bool) -> Result<Vec<u32>, TokenizerError> {
        guard::guarded("encoding", || {
            let tok = if parse_special {
                &self.inner.tok
            } else {
                self.inner.plain.get_or_init(|| {
                    let mut t = self.inner.tok.clone();
                    t.set_encode_special_tokens(true);
                    t
                })
            };
            tok.encode(text, false)
                .map(|enc| enc.get_ids().to_vec())
                .map_err(|e| e.to_string())
        })
        .and_then(|r| r)
        .map_err(TokenizerError::Encode)
    }

    /// [`Self::encode`], with BOS first when [`Self::add_bos`] and the text does not start with it.
    pub fn encode_with_bos(
        &self,
        text: &str,
        parse_special: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        let mut ids = self.encode(text, parse_special)?;
        if let (true, Some(bos)) = (self.inner.add_bos, self.inner.bos) {
            if ids.first() != Some(&bos) {
                ids.insert(0, bos);
            }
        }
        Ok(ids)
    }

    /// The text of `ids` (control tokens rendered as their text; invalid UTF-8 as U+FFFD).
    pub fn decode(&self, ids: &[u32]) -> String {
        self.decode_impl(ids, false)
    }

    /// The text of `ids` without control tokens.
    pub fn decode_skip_special(&self, ids: &[u32]) -> String {
        self.decode_impl(ids, true)
    }

    fn decode_impl(&self, ids: &[u32], skip_special: bool) -> String {
        let mut out = Vec::new();
        for &id in ids {
            if skip_special && self.is_control(id) {
                continue;
            }
            if let Some(b) = self.token_bytes(id) {
                out.extend_from_slice(b);
            }
        }
        let mut text = String::from_utf8_lossy(&out).into_owned();
        if self.inner.strip_leading_space && text.starts_with(' ') {
            text.remove(0);
        }
        text
    }

    /// An incremental decoder for generated tokens.
    pub fn stream_decoder(&self) -> StreamDecoder {
        StreamDecoder::new(self)
    }

    /// Number of token ids (the vocabulary including added tokens).
    pub fn token_count(&self) -> usize {
        self.inner.pieces.len()
    }

    pub fn bos(&self) -> Option<u32> {
        self.inner.bos
    }

    /// The file's primary end-of-sequence id.
    pub fn eos(&self) -> Option<u32> {
        self.inner.eos
    }

    /// Every id that ends generation: eos, eot/eom, and control tokens such as `<|im_end|>`,
    /// `<|endoftext|>`, `<|eot_id|>`, `<end_of_turn>`.
    pub fn eos_ids(&self) -> &[u32] {
        &self.inner.eos_ids
    }

    pub fn is_eog(&self, id: u32) -> bool {
        self.inner.eos_ids.contains(&id)
    }

    /// Whether prompts should start with BOS (GGUF `tokenizer.ggml.add_bos_token`, HF
    /// `add_bos_token` or the post-processor).
    pub fn add_bos(&self) -> bool {
        self.inner.add_bos
    }

    /// The vocabulary's spelling of a token (`Ġworld`, `▁world`, `<|im_end|>`).
    pub fn id_to_piece(&self, id: u32) -> Option<&str> {
        self.inner.pieces.get(id as usize).map(String::as_str)
    }

    /// The id of a vocabulary piece or added token, spelled as in the vocabulary.
    pub fn piece_to_id(&self, piece: &str) -> Option<u32> {
        guard::guarded("looking up a token", || self.inner.tok.token_to_id(piece))
            .ok()
            .flatten()
    }

    /// The raw bytes a token stands for (possibly part of a UTF-8 character).
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        let i = id as usize;
        let (start, end) = (*self.inner.offsets.get(i)?, *self.inner.offsets.get(i + 1)?);
        Some(&self.inner.bytes[start..end])
    }

    /// Whether a token is a control (special) token.
    pub fn is_control(&self, id: u32) -> bool {
        self.inner
            .control
            .get(id as usize)
            .copied()
            .unwrap_or(false)
    }

    pub fn spelling(&self) -> Spelling {
        self.inner.spelling
    }

    /// The chat template the tokenizer's source carries, if any.
    pub fn chat_template_source(&self) -> Option<&str> {
        self.inner.chat_template.as_deref()
    }

    /// Things that loaded but may tokenize differently from the model's own tokenizer.
    pub fn warnings(&self) -> &[String] {
        &self.inner.warnings
    }
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("tokens", &self.token_count())
            .field("spelling", &self.inner.spelling)
            .field("bos", &self.inner.bos)
            .field("eos_ids", &self.inner.eos_ids)
            .field("add_bos", &self.inner.add_bos)
            .finish()
    }
}

#[cfg(test)]
mod tests;
