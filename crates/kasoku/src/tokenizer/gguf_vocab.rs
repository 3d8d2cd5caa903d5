//! Builds a `tokenizers::Tokenizer` equal to llama.cpp's reading of a GGUF vocabulary:
//! - `tokenizer.ggml.model = "gpt2"`: byte-level BPE from `tokens` and `merges`, split first by
//!   the regexes llama.cpp uses for `tokenizer.ggml.pre` (SmolLM/StarCoder: digits one by one,
//!   then GPT-2; Qwen2; Qwen3.5; Llama 3; GPT-2);
//! - `tokenizer.ggml.model = "llama"`: SentencePiece BPE, merges recovered from `scores` (the
//!   merge whose result scores highest goes first), `<0xNN>` byte fallback, spaces written `▁`
//!   and one prepended to each text fragment when `add_space_prefix` (as llama.cpp does).
//!
//! Token types (`tokenizer.ggml.token_type`): 3 (control) and 2 (unknown) become special added
//! tokens, matched whole only when special tokens are parsed; 4 (user-defined, e.g. `<think>`)
//! become plain added tokens, always matched whole; 6 are byte tokens; 5 unused.

use std::collections::HashMap;

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::{Prepend, Replace, Sequence as NormalizerSequence};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence as PreSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{
    AddedToken, DecoderWrapper, NormalizerWrapper, PreTokenizerWrapper, SplitDelimiterBehavior,
};

use super::bytes::Spelling;
use super::TokenizerError;
use crate::format::{limits, GgufFile};

pub const TYPE_NORMAL: i32 = 1;
pub const TYPE_UNKNOWN: i32 = 2;
pub const TYPE_CONTROL: i32 = 3;
pub const TYPE_USER_DEFINED: i32 = 4;

/// GPT-2's split (llama.cpp's form: no trailing `\s+`; unmatched text stays a piece anyway).
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
/// Qwen2 / Qwen3 (llama.cpp spells the case-insensitive contractions as ASCII classes).
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen3.5: as Qwen2 with combining marks (`\p{M}`) kept with letters.
const QWEN35: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Llama 3: numbers in groups of up to three.
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The split regexes (applied in order) and whether merges are skipped for whole-word vocabulary
/// hits, for a `tokenizer.ggml.pre` value; `None` for names kasoku does not know.
fn pre_tokenizer_rules(pre: &str) -> Option<(&'static [&'static str], bool)> {
    Some(match pre {
        "gpt2" | "mpt" | "olmo" | "jais" | "trillion" | "granite-docling" => (&[GPT2], false),
        "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva-7b" => {
            (&[r"\p{N}", GPT2], false)
        }
        "qwen2" | "stablelm2" | "deepseek-r1-qwen" | "hunyuan" | "megrez" => (&[QWEN2], false),
        "qwen35" => (&[QWEN35], false),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0" => {
            (&[LLAMA3], true)
        }
        "smaug-bpe" | "dbrx" => (&[LLAMA3], false),
        _ => return None,
    })
}

/// What [`build`] produces.
pub(super) struct GgufVocab {
    pub tokenizer: tokenizers::Tokenizer,
    pub pieces: Vec<String>,
    pub types: Vec<i32>,
    pub spelling: Spelling,
    pub strip_leading_space: bool,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub extra_eog: Vec<u32>,
    pub add_bos: bool,
    pub warnings: Vec<String>,
}

pub(super) fn build(gguf: &GgufFile) -> Result<GgufVocab, TokenizerError> {
    let invalid = |reason: String| TokenizerError::Invalid {
        path: gguf.path().to_path_buf(),
        reason,
    };
    let model = gguf
        .get_str("tokenizer.ggml.model")
        .ok_or_else(|| invalid("no tokenizer.ggml.model".into()))?;
    let pieces = string_array(gguf, "tokenizer.ggml.tokens")?
        .ok_or_else(|| invalid("no tokenizer.ggml.tokens".into()))?;
    let n = pieces.len();
    if n == 0 || n > limits::MAX_VOCAB {
        return Err(invalid(format!(
            "tokenizer.ggml.tokens has {n} tokens (1 to {} accepted)",
            limits::MAX_VOCAB
        )));
    }
    let types: Vec<i32> = match gguf.get_array("tokenizer.ggml.token_type") {
        None => vec![TYPE_NORMAL; n],
        Some(a) if a.len() == n => a
            .iter()
            .map(|v| v.as_i64().and_then(|t| i32::try_from(t).ok()))
            .collect::<Option<_>>()
            .ok_or_else(|| invalid("tokenizer.ggml.token_type holds non-integers".into()))?,
        Some(a) => return Err(invalid(format!("{} token types for {n} tokens", a.len()))),
    };
    let id = |key: &str| -> Result<Option<u32>, TokenizerError> {
        match gguf.get(key) {
            None => Ok(None),
            Some(v) => match v.as_u64() {
                Some(i) if (i as usize) < n => Ok(Some(i as u32)),
                // Some converters write -1 (as i32 or u32::MAX) for "none".
                _ if v.as_i64() == Some(-1) || v.as_u64() == Some(u32::MAX as u64) => Ok(None),
                _ => Err(invalid(format!(
                    "{key} = {v:?} is not a token id below {n}"
                ))),
            },
        }
    };
    let bos = id("tokenizer.ggml.bos_token_id")?;
    let eos = id("tokenizer.ggml.eos_token_id")?;
    let mut extra_eog = Vec::new();
    for key in ["tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
        extra_eog.extend(id(key)?);
    }
    let mut warnings = Vec::new();

    let mut vocab = Vocab::default();
    for (i, p) in pieces.iter().enumerate() {
        vocab.insert(p.clone(), i as u32); // a duplicated piece maps to its last id (as llama.cpp)
    }

    let (tokenizer, spelling, strip_leading_space, default_add_bos) = match model {
        "gpt2" => {
            let merges = string_array(gguf, "tokenizer.ggml.merges")?
                .ok_or_else(|| invalid("byte-level BPE without tokenizer.ggml.merges".into()))?;
            let merges = merges
                .iter()
                .map(|m| {
                    let at = m
                        .char_indices()
                        .skip(1)
                        .find(|&(_, c)| c == ' ')
                        .map(|(i, _)| i);
                    at.map(|i| (m[..i].to_string(), m[i + 1..].to_string()))
                        .ok_or_else(|| invalid(format!("merge '{m}' has no space")))
                })
                .collect::<Result<Vec<_>, _>>()?;
            let pre = gguf.get_str("tokenizer.ggml.pre").unwrap_or("default");
            let (regexes, ignore_merges) = pre_tokenizer_rules(pre).unwrap_or_else(|| {
                warnings.push(format!(
                    "unknown tokenizer.ggml.pre '{pre}': splitting text with GPT-2's regex"
                ));
                (&[GPT2], false)
            });
            let bpe = BPE::builder()
                .vocab_and_merges(vocab, merges)
                .ignore_merges(ignore_merges)
                .build()
                .map_err(|e| invalid(format!("BPE: {e}")))?;
            let mut tok = tokenizers::Tokenizer::new(bpe);
            let mut steps: Vec<PreTokenizerWrapper> = Vec::new();
            for re in regexes {
                let split = Split::new(
                    SplitPattern::Regex(re.to_string()),
                    SplitDelimiterBehavior::Isolated,
                    false,
                )
                .map_err(|e| invalid(format!("split regex: {e}")))?;
                steps.push(split.into());
            }
            steps.push(ByteLevel::new(false, false, false).into());
            tok.with_pre_tokenizer(Some(PreSequence::new(steps)));
            tok.with_decoder(Some(ByteLevel::new(false, false, false)));
            (tok, Spelling::ByteLevel, false, false)
        }
        "llama" => {
            let scores: Vec<f32> = match gguf.get_array("tokenizer.ggml.scores") {
                Some(a) if a.len() == n => {
                    a.iter().map(|v| v.as_f64().unwrap_or(0.0) as f32).collect()
                }
                Some(a) => return Err(invalid(format!("{} scores for {n} tokens", a.len()))),
                None => vec![0.0; n],
            };
            let merges = sentencepiece_merges(&pieces, &types, &scores, &vocab).map_err(invalid)?;
            let unk = id("tokenizer.ggml.unknown_token_id")?.unwrap_or(0);
            let bpe = BPE::builder()
                .vocab_and_merges(vocab, merges)
                .byte_fallback(true)
                .unk_token(pieces[unk as usize].clone())
                .fuse_unk(true)
                .build()
                .map_err(|e| invalid(format!("BPE: {e}")))?;
            let mut tok = tokenizers::Tokenizer::new(bpe);
            let space_prefix = gguf
                .get_bool("tokenizer.ggml.add_space_prefix")
                .unwrap_or(true);
            let mut norm: Vec<NormalizerWrapper> = Vec::new();
            if space_prefix {
                norm.push(Prepend::new("\u{2581}".into()).into());
            }
            norm.push(
                Replace::new(" ", "\u{2581}")
                    .map_err(|e| invalid(format!("normalizer: {e}")))?
                    .into(),
            );
            tok.with_normalizer(Some(NormalizerSequence::new(norm)))
                .map_err(|e| invalid(format!("normalizer: {e}")))?;
            let mut dec: Vec<DecoderWrapper> = vec![
                Replace::new("\u{2581}", " ")
                    .map_err(|e| invalid(format!("decoder: {e}")))?
                    .into(),
                ByteFallback::new().into(),
                Fuse::new().into(),
            ];
            if space_prefix {
                dec.push(Strip::new(' ', 1, 0).into());
            }
            tok.with_decoder(Some(DecoderSequence::new(dec)));
            (tok, Spelling::SentencePiece, space_prefix, true)
        }
        other => {
            return Err(invalid(format!(
                "unsupported tokenizer.ggml.model '{other}' (kasoku reads gpt2 and llama)"
            )))
        }
    };

    let mut tokenizer = tokenizer;
    let special: Vec<AddedToken> = (0..n)
        .filter(|&i| types[i] == TYPE_CONTROL || types[i] == TYPE_UNKNOWN)
        .map(|i| AddedToken::from(pieces[i].clone(), true))
        .collect();
    let user: Vec<AddedToken> = (0..n)
        .filter(|&i| types[i] == TYPE_USER_DEFINED)
        .map(|i| AddedToken::from(pieces[i].clone(), false).normalized(false))
        .collect();
    tokenizer
        .add_special_tokens(special)
        .map_err(|e| invalid(format!("special tokens: {e}")))?;
    tokenizer
        .add_tokens(user)
        .map_err(|e| invalid(format!("user-defined tokens: {e}")))?;

    let add_bos = gguf
        .get_bool("tokenizer.ggml.add_bos_token")
        .unwrap_or(default_add_bos);
    Ok(GgufVocab {
        tokenizer,
        pieces,
        types,
        spelling,
        strip_leading_space,
        bos,
        eos,
        extra_eog,
        add_bos,
        warnings,
    })
}

/// A metadata array of strings (`None` if absent; an error if present with other types).
fn string_array(gguf: &GgufFile, key: &str) -> Result<Option<Vec<String>>, TokenizerError> {
    let Some(array) = gguf.get_array(key) else {
        return Ok(None);
    };
    array
        .iter()
        .map(|v| v.as_str().map(str::to_string))
        .collect::<Option<Vec<_>>>()
        .map(Some)
        .ok_or_else(|| TokenizerError::Invalid {
            path: gguf.path().to_path_buf(),
            reason: format!("{key} is not an array of strings"),
        })
}

/// Bytes hashed while recovering SentencePiece merges: every split of an `L`-byte token
/// looks up both halves (~`L²` bytes). Real vocabularies need a few tens of millions (32k to
/// 256k tokens of mostly under 16 bytes); a hostile one of long tokens would need 10¹² and
/// more, so past this budget (about a second of work) the vocabulary is refused.
const MAX_SPM_SPLIT_BYTES: u64 = 1 << 30;

/// Merges that reproduce SentencePiece's BPE from token scores: every split of a normal token
/// into two vocabulary pieces is a merge, ranked by the merged token's score (highest first;
/// ties by id), which is the order llama.cpp's SPM tokenizer merges in.
fn sentencepiece_merges(
    pieces: &[String],
    types: &[i32],
    scores: &[f32],
    vocab: &HashMap<String, u32, impl std::hash::BuildHasher>,
) -> Result<Vec<(String, String)>, String> {
    let work: u64 = pieces
        .iter()
        .zip(types)
        .filter(|(_, &t)| t == TYPE_NORMAL)
        .map(|(p, _)| (p.len() as u64).saturating_mul(p.len() as u64))
        .fold(0, u64::saturating_add);
    if work > MAX_SPM_SPLIT_BYTES {
        return Err(format!(
            "tokenizer.ggml.tokens: its tokens are too long to recover SentencePiece merges \
             from (sum of squared lengths {work} > {MAX_SPM_SPLIT_BYTES})"
        ));
    }
    let mut ranked: Vec<(f32, u32, u32, u32)> = Vec::new(); // (score, merged id, left id, right id)
    for (id, piece) in pieces.iter().enumerate() {
        if types[id] != TYPE_NORMAL || vocab.get(piece) != Some(&(id as u32)) {
            continue;
        }
        for (at, _) in piece.char_indices().skip(1) {
            let (l, r) = piece.split_at(at);
            if let (Some(&li), Some(&ri)) = (vocab.get(l), vocab.get(r)) {
                ranked.push((scores[id], id as u32, li, ri));
            }
        }
    }
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    Ok(ranked
        .into_iter()
        .map(|(_, _, l, r)| (pieces[l as usize].clone(), pieces[r as usize].clone()))
        .collect())
}
