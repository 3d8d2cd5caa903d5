//! Generated tokens to answer text for one request: streaming detokenization, thinking
//! (`<think>…</think>`) split off as `reasoning_content`, stop strings on the answer, and
//! tool calls parsed out of it (when the request has tools).

use kasoku::engine::stop::StopMatcher;
use kasoku::tokenizer::{StreamDecoder, Tokenizer};

use crate::logprobs::Entry;
use crate::tool_calls::{ToolCall, ToolCallParser, ToolEvent, ToolSyntax};

/// What one step released.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Delta {
    pub content: String,
    pub reasoning: String,
    /// Tool call starts and argument pieces (never [`ToolEvent::Content`]).
    pub tool_calls: Vec<ToolEvent>,
    /// The log-probabilities of the tokens generated since the last delta, when asked for
    /// (they need not match the text released: stop strings and tool calls hold text back).
    pub logprobs: Vec<Entry>,
}

impl Delta {
    pub fn is_empty(&self) -> bool {
        self.content.is_empty()
            && self.reasoning.is_empty()
            && self.tool_calls.is_empty()
            && self.logprobs.is_empty()
    }

    fn append(&mut self, other: Delta) {
        self.content.push_str(&other.content);
        self.reasoning.push_str(&other.reasoning);
        self.tool_calls.extend(other.tool_calls);
        self.logprobs.extend(other.logprobs);
    }

    fn take_events(&mut self, events: Vec<ToolEvent>) {
        for e in events {
            match e {
                ToolEvent::Content(t) => self.content.push_str(&t),
                other => self.tool_calls.push(other),
            }
        }
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
    tools: Option<ToolCallParser>,
}

impl Output {
    /// `in_thinking`: the prompt ends inside an open `<think>` block; `tools`: parse tool
    /// calls in this syntax, their ids starting with `call_id_prefix`.
    pub fn new(
        tokenizer: &Tokenizer,
        think: Option<ThinkTokens>,
        in_thinking: bool,
        stops: &[String],
        tools: Option<(ToolSyntax, &str)>,
    ) -> Output {
        Output {
            decoder: tokenizer.stream_decoder().skip_special(true),
            stops: StopMatcher::new(stops),
            think,
            reasoning: in_thinking && think.is_some(),
            trim_start: false,
            tools: tools.map(|(syntax, prefix)| ToolCallParser::new(syntax, prefix)),
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

    /// Whether a stop string ended the answer.
    pub fn done(&self) -> bool {
        self.stops.stopped()
    }

    /// The stop string that ended the answer, if one did.
    pub fn stop_sequence(&self) -> Option<&str> {
        self.stops.matched()
    }

    /// The tool calls parsed so far.
    pub fn calls(&self) -> &[ToolCall] {
        self.tools.as_ref().map_or(&[], |t| t.calls())
    }

    /// Ends the stream: releases held text.
    pub fn finish(&mut self) -> Delta {
        let text = self.decoder.flush();
        let mut d = self.route(text);
        if !self.done() {
            let held = self.stops.flush();
            d.append(self.answer(held));
        }
        if let Some(t) = &mut self.tools {
            d.take_events(t.finish());
        }
        d
    }

    /// Answer text (past the stop strings) to content and tool calls.
    fn answer(&mut self, text: String) -> Delta {
        let mut d = Delta::default();
        match &mut self.tools {
            Some(t) => d.take_events(t.push(&text)),
            None => d.content = text,
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
        let text = self.stops.push(text);
        d.append(self.answer(text));
        d
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
        let d = run(&mut Output::new(&tok, Some(think), false, &[], None), &ids);
        assert_eq!(d.reasoning, "\nLet me see.\n");
        assert_eq!(d.content, "The answer is 4.");
        // The prompt opened it (thinking on); a stop string applies to the answer only.
        let ids = tok
            .encode("Hmm, 2+2. END</think>\n\n4 END 5", true)
            .unwrap();
        let stops = ["END".to_string()];
        let mut out = Output::new(&tok, Some(think), true, &stops, None);
        let d = run(&mut out, &ids);
        assert_eq!(d.reasoning, "Hmm, 2+2. END");
        assert_eq!(d.content, "4 ");
        assert!(out.done());
        // Without thinking tokens, everything is content.
        let d = run(&mut Output::new(&tok, None, true, &[], None), &ids[..3]);
        assert!(d.reasoning.is_empty() && !d.content.is_empty());
    }

    #[test]
    fn tool_calls_leave_the_content() {
        let tok = qwen35_tokenizer();
        let ids = tok
            .encode(
                "Checking.<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>",
                true,
            )
            .unwrap();
        let mut out = Output::new(
            &tok,
            None,
            false,
            &[],
            Some((ToolSyntax::hermes(), "call_")),
        );
        let d = run(&mut out, &ids);
        assert_eq!(d.content, "Checking.");
        assert_eq!(out.calls().len(), 1);
        assert_eq!(out.calls()[0].arguments, "{\"x\": 1}");
        assert!(matches!(&d.tool_calls[0], ToolEvent::Start { name, .. } if name == "f"));
    }
}
