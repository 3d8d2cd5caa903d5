//! Generated tokens to answer text for one request: streaming detokenization, thinking
//! (`<think>…</think>`) split off as `reasoning_content`, stop strings on the answer, and for
//! `response_format: json_object` the answer cut to its first top-level JSON object.

use kasoku::engine::stop::StopMatcher;
use kasoku::tokenizer::{StreamDecoder, Tokenizer};

/// Text released by one step.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Delta {
    pub content: String,
    pub reasoning: String,
}

impl Delta {
    pub fn is_empty(&self) -> bool {
        self.content.is_empty() && self.reasoning.is_empty()
    }

    fn append(&mut self, other: Delta) {
        self.content.push_str(&other.content);
        self.reasoning.push_str(&other.reasoning);
    }
}

/// The thinking delimiters of a model whose vocabulary has them as single tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThinkTokens {
    pub open: u32,
    pub close: u32,
}

impl ThinkTokens {
    pub fn of(tokenizer: &Tokenizer) -> Option<ThinkTokens> {
        Some(ThinkTokens {
            open: tokenizer.piece_to_id("<think>")?,
            close: tokenizer.piece_to_id("</think>")?,
        })
    }
}

/// Turns one request's tokens into answer and reasoning text.
pub struct Output {
    decoder: StreamDecoder,
    stops: StopMatcher,
    think: Option<ThinkTokens>,
    reasoning: bool,
    /// After `</think>`: drop the whitespace that separates thinking from the answer.
    trim_start: bool,
    json: Option<JsonCut>,
}

impl Output {
    /// `in_thinking`: the prompt ends inside an open `<think>` block.
    pub fn new(
        tokenizer: &Tokenizer,
        think: Option<ThinkTokens>,
        in_thinking: bool,
        stops: &[String],
        json_object: bool,
    ) -> Output {
        Output {
            decoder: tokenizer.stream_decoder().skip_special(true),
            stops: StopMatcher::new(stops),
            think,
            reasoning: in_thinking && think.is_some(),
            trim_start: false,
            json: json_object.then(JsonCut::default),
        }
    }

    /// Takes one generated token.
    pub fn push(&mut self, token: u32) -> Delta {
        if let Some(t) = self.think {
            if token == t.open && !self.reasoning {
                let text = self.decoder.flush();
                let d = self.route(text);
                self.reasoning = true;
                return d;
            }
            if token == t.close && self.reasoning {
                let text = self.decoder.flush();
                let d = self.route(text);
                self.reasoning = false;
                self.trim_start = true;
                return d;
            }
        }
        let text = self.decoder.push(token);
        self.route(text)
    }

    /// Whether the answer is complete (a stop string, or the JSON object closed).
    pub fn done(&self) -> bool {
        self.stops.stopped() || self.json.as_ref().is_some_and(|j| j.closed)
    }

    /// Ends the stream: releases held text.
    pub fn finish(&mut self) -> Delta {
        let text = self.decoder.flush();
        let mut d = self.route(text);
        if !self.done() {
            d.content.push_str(&self.stops.flush());
        }
        d
    }

    fn route(&mut self, text: String) -> Delta {
        let mut d = Delta::default();
        if text.is_empty() || self.done() {
            return d;
        }
        if self.reasoning {
            d.reasoning = text;
            return d;
        }
        let mut text = text.as_str();
        if self.trim_start {
            text = text.trim_start();
            if text.is_empty() {
                return d;
            }
            self.trim_start = false;
        }
        let text = match &mut self.json {
            Some(j) => j.push(text),
            None => text.to_string(),
        };
        d.append(Delta {
            content: self.stops.push(&text),
            reasoning: String::new(),
        });
        d
    }
}

/// Keeps the first top-level JSON object of a text stream: drops what comes before its `{`
/// and everything after its closing `}`.
#[derive(Debug, Default)]
struct JsonCut {
    started: bool,
    closed: bool,
    depth: usize,
    in_string: bool,
    escaped: bool,
}

impl JsonCut {
    fn push(&mut self, text: &str) -> String {
        let mut out = String::new();
        for c in text.chars() {
            if self.closed {
                break;
            }
            if !self.started {
                if c != '{' {
                    continue;
                }
                self.started = true;
            }
            out.push(c);
            if self.in_string {
                match (self.escaped, c) {
                    (true, _) => self.escaped = false,
                    (false, '\\') => self.escaped = true,
                    (false, '"') => self.in_string = false,
                    _ => {}
                }
                continue;
            }
            match c {
                '"' => self.in_string = true,
                '{' | '[' => self.depth += 1,
                '}' | ']' => {
                    self.depth = self.depth.saturating_sub(1);
                    if self.depth == 0 {
                        self.closed = true;
                    }
                }
                _ => {}
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qwen35_tokenizer() -> Tokenizer {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/qwen3_5/tiny"
        );
        Tokenizer::from_hf_dir(dir).unwrap()
    }

    fn run(out: &mut Output, ids: &[u32]) -> Delta {
        let mut all = Delta::default();
        for &id in ids {
            all.append(out.push(id));
        }
        all.append(out.finish());
        all
    }

    #[test]
    fn thinking_is_split_into_reasoning() {
        let tok = qwen35_tokenizer();
        let think = ThinkTokens::of(&tok).expect("<think> tokens");
        // The model opens the block itself.
        let ids = tok
            .encode("<think>\nLet me see.\n</think>\n\nThe answer is 4.", true)
            .unwrap();
        assert!(ids.contains(&think.open) && ids.contains(&think.close));
        let d = run(&mut Output::new(&tok, Some(think), false, &[], false), &ids);
        assert_eq!(d.reasoning, "\nLet me see.\n");
        assert_eq!(d.content, "The answer is 4.");
        // The prompt opened it (thinking on); a stop string applies to the answer only.
        let ids = tok
            .encode("Hmm, 2+2. END</think>\n\n4 END 5", true)
            .unwrap();
        let stops = ["END".to_string()];
        let mut out = Output::new(&tok, Some(think), true, &stops, false);
        let d = run(&mut out, &ids);
        assert_eq!(d.reasoning, "Hmm, 2+2. END");
        assert_eq!(d.content, "4 ");
        assert!(out.done());
        // Without thinking tokens, everything is content.
        let d = run(&mut Output::new(&tok, None, true, &[], false), &ids[..3]);
        assert!(d.reasoning.is_empty() && !d.content.is_empty());
    }

    #[test]
    fn json_cut_keeps_the_first_object() {
        let mut j = JsonCut::default();
        let mut out = j.push("Sure! {\"a\": \"}{\\\"\", ");
        assert!(!j.closed);
        out.push_str(&j.push("\"b\": [1, {\"c\": 2}]} trailing {"));
        assert!(j.closed);
        assert_eq!(out, "{\"a\": \"}{\\\"\", \"b\": [1, {\"c\": 2}]}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["b"][1]["c"], 2);
    }
}
