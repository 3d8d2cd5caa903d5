//! Log-probabilities in OpenAI's two shapes: chat's `logprobs.content` (one entry per token
//! with its text, bytes and `top_logprobs`) and the legacy completions object (`tokens`,
//! `token_logprobs`, `top_logprobs` as text → logprob maps, `text_offset`).

use serde_json::{json, Map, Value};

use kasoku::engine::TokenLogprobs;
use kasoku::tokenizer::Tokenizer;

/// One token with its spelling: what both shapes are written from.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    pub token: Spelled,
    pub logprob: f32,
    pub top: Vec<(Spelled, f32)>,
}

/// A token's text (its bytes as UTF-8, lossily: a token may hold part of a character) and
/// its bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct Spelled {
    pub text: String,
    pub bytes: Vec<u8>,
}

impl Spelled {
    fn of(tokenizer: &Tokenizer, id: u32) -> Spelled {
        let bytes = tokenizer
            .token_bytes(id)
            .map(<[u8]>::to_vec)
            .unwrap_or_default();
        Spelled {
            text: String::from_utf8_lossy(&bytes).into_owned(),
            bytes,
        }
    }
}

impl Entry {
    pub fn new(tokenizer: &Tokenizer, lp: &TokenLogprobs) -> Entry {
        Entry {
            token: Spelled::of(tokenizer, lp.token),
            logprob: lp.logprob,
            top: lp
                .top
                .iter()
                .map(|&(id, l)| (Spelled::of(tokenizer, id), l))
                .collect(),
        }
    }
}

/// JSON has no -inf: a token with no probability gets the most negative finite f32
/// (what OpenAI's API documents as the value of very unlikely tokens, -9999, is arbitrary;
/// this keeps the order).
fn number(logprob: f32) -> Value {
    json!(if logprob.is_finite() {
        logprob
    } else {
        f32::MIN
    })
}

/// Chat's `logprobs` object for these tokens.
pub fn chat(entries: &[Entry]) -> Value {
    let content: Vec<Value> = entries
        .iter()
        .map(|e| {
            let top: Vec<Value> = e
                .top
                .iter()
                .map(|(t, l)| json!({"token": t.text, "logprob": number(*l), "bytes": t.bytes}))
                .collect();
            json!({
                "token": e.token.text,
                "logprob": number(e.logprob),
                "bytes": e.token.bytes,
                "top_logprobs": top,
            })
        })
        .collect();
    json!({"content": content, "refusal": null})
}

/// The completions `logprobs` object for these tokens; `offset` is the answer text's length
/// before the first of them (`text_offset` counts bytes of the answer text).
pub fn completion(entries: &[Entry], offset: usize) -> Value {
    let mut at = offset;
    let mut text_offset = Vec::with_capacity(entries.len());
    for e in entries {
        text_offset.push(at);
        at += e.token.text.len();
    }
    let top: Vec<Value> = entries
        .iter()
        .map(|e| {
            let mut m = Map::new();
            for (t, l) in &e.top {
                m.entry(t.text.clone()).or_insert(number(*l));
            }
            Value::Object(m)
        })
        .collect();
    json!({
        "tokens": entries.iter().map(|e| e.token.text.clone()).collect::<Vec<_>>(),
        "token_logprobs": entries.iter().map(|e| number(e.logprob)).collect::<Vec<_>>(),
        "top_logprobs": top,
        "text_offset": text_offset,
    })
}

/// The bytes of these tokens' text (what the next `offset` of [`completion`] advances by).
pub fn text_len(entries: &[Entry]) -> usize {
    entries.iter().map(|e| e.token.text.len()).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(text: &str, logprob: f32, top: &[(&str, f32)]) -> Entry {
        let spell = |t: &str| Spelled {
            text: t.to_string(),
            bytes: t.as_bytes().to_vec(),
        };
        Entry {
            token: spell(text),
            logprob,
            top: top.iter().map(|&(t, l)| (spell(t), l)).collect(),
        }
    }

    #[test]
    fn both_shapes_carry_the_same_numbers() {
        let entries = [
            entry("Hel", -0.5, &[("Hel", -0.5), ("Hi", -1.5)]),
            entry("lo", f32::NEG_INFINITY, &[]),
        ];
        let c = chat(&entries);
        assert_eq!(c["content"][0]["token"], "Hel");
        assert_eq!(c["content"][0]["bytes"], json!([72, 101, 108]));
        assert_eq!(c["content"][0]["top_logprobs"][1]["token"], "Hi");
        assert_eq!(c["content"][0]["top_logprobs"][1]["logprob"], -1.5);
        assert!(c["content"][1]["logprob"].as_f64().unwrap() < -1e38);
        let t = completion(&entries, 7);
        assert_eq!(t["tokens"], json!(["Hel", "lo"]));
        assert_eq!(t["token_logprobs"][0], -0.5);
        assert_eq!(t["top_logprobs"][0]["Hi"], -1.5);
        assert_eq!(t["text_offset"], json!([7, 10]));
        assert_eq!(text_len(&entries), 5);
    }
}
