//! Tool calls parsed out of a model's answer as it streams: text goes out as content, and each
//! call as a start (id, name) followed by pieces of its arguments, never any markup. Text that
//! might begin a call is held back until it is known not to, so a call split across tokens
//! (or characters) never leaks into the content.
//!
//! Two syntaxes cover the templates in use:
//! - [`ToolSyntax::Tagged`]: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`,
//!   Hermes-style, as Qwen2.5/Qwen3 templates ask; kasoku's generic fallback for templates
//!   without tool support asks for the same.
//! - [`ToolSyntax::BareJson`]: Llama 3's form, an answer that is a JSON object
//!   `{"name": ..., "parameters": {...}}` (optionally after `<|python_tag|>`; several joined
//!   by `;`).
//!
//! Arguments are passed on as the model wrote them (a JSON object's text); a model that wrote
//! them as a JSON string gets that string's value.

use serde_json::Value;

/// How a template's model writes tool calls.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolSyntax {
    Tagged { open: String, close: String },
    BareJson,
}

impl ToolSyntax {
    pub fn hermes() -> ToolSyntax {
        ToolSyntax::Tagged {
            open: "<tool_call>".into(),
            close: "</tool_call>".into(),
        }
    }
}

/// What the parser releases.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolEvent {
    Content(String),
    /// A call begins; its arguments follow.
    Start {
        index: usize,
        id: String,
        name: String,
    },
    Arguments {
        index: usize,
        delta: String,
    },
}

/// A finished call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// JSON text.
    pub arguments: String,
}

const PYTHON_TAG: &str = "<|python_tag|>";

#[derive(Debug)]
enum Mode {
    /// Plain content. `pending` holds text that may be the start of a call.
    Text,
    /// BareJson: before the first non-space character of a possible call.
    BareStart,
    /// Inside a call's JSON object.
    Call(Box<CallScanner>),
    /// Tagged: after a call's object, before its closing tag.
    AfterCall,
    /// BareJson: the answer turned out to be plain content.
    Content,
}

/// Streams content and tool calls out of answer text.
#[derive(Debug)]
pub struct ToolCallParser {
    syntax: ToolSyntax,
    id_prefix: String,
    mode: Mode,
    /// Held-back text (a possible tag prefix, trailing whitespace, a bare call's raw text).
    pending: String,
    calls: Vec<ToolCall>,
    events: Vec<ToolEvent>,
}

impl ToolCallParser {
    /// `id_prefix` makes call ids (`{prefix}{index}`) unique across responses.
    pub fn new(syntax: ToolSyntax, id_prefix: &str) -> ToolCallParser {
        let mode = match syntax {
            ToolSyntax::Tagged { .. } => Mode::Text,
            ToolSyntax::BareJson => Mode::BareStart,
        };
        ToolCallParser {
            syntax,
            id_prefix: id_prefix.to_string(),
            mode,
            pending: String::new(),
            calls: Vec::new(),
            events: Vec::new(),
        }
    }

    /// Takes the next piece of answer text.
    pub fn push(&mut self, text: &str) -> Vec<ToolEvent> {
        for c in text.chars() {
            self.step(c);
        }
        self.flush_arguments();
        std::mem::take(&mut self.events)
    }

    /// Ends the answer: releases what was held back. A call cut off before its object
    /// closed is dropped if it never got a name, else finished with what it has.
    pub fn finish(&mut self) -> Vec<ToolEvent> {
        match std::mem::replace(&mut self.mode, Mode::Content) {
            Mode::Call(scanner) => {
                if scanner.name.is_some() {
                    self.end_call(*scanner);
                } else if self.syntax == ToolSyntax::BareJson {
                    let raw = std::mem::take(&mut self.pending);
                    self.content(&raw);
                }
            }
            Mode::Text | Mode::Content | Mode::BareStart => {
                let held = std::mem::take(&mut self.pending);
                // Whitespace before a call or at the end of an answer with calls is dropped.
                if self.calls.is_empty() || !held.trim().is_empty() {
                    self.content(&held);
                }
            }
            Mode::AfterCall => {}
        }
        self.pending.clear();
        self.flush_arguments();
        std::mem::take(&mut self.events)
    }

    /// The calls finished so far.
    pub fn calls(&self) -> &[ToolCall] {
        &self.calls
    }

    fn content(&mut self, text: &str) {
        if text.is_empty() {
            return;
        }
        if let Some(ToolEvent::Content(last)) = self.events.last_mut() {
            last.push_str(text);
        } else {
            self.events.push(ToolEvent::Content(text.to_string()));
        }
    }

    fn step(&mut self, c: char) {
        match &mut self.mode {
            Mode::Content => self.content(&c.to_string()),
            Mode::Text => self.step_text(c),
            Mode::BareStart => self.step_bare_start(c),
            Mode::Call(scanner) => {
                if self.syntax == ToolSyntax::BareJson {
                    self.pending.push(c);
                }
                match scanner.step(c) {
                    Scan::NotACall if self.syntax == ToolSyntax::BareJson => {
                        // Only BareJson asks: the object is content after all.
                        self.mode = Mode::Content;
                        let raw = std::mem::take(&mut self.pending);
                        self.content(&raw);
                    }
                    Scan::More | Scan::NotACall => {}
                    Scan::Done => {
                        let Mode::Call(scanner) = std::mem::replace(&mut self.mode, Mode::Text)
                        else {
                            unreachable!()
                        };
                        self.end_call(*scanner);
                        self.pending.clear();
                        self.mode = match self.syntax {
                            ToolSyntax::Tagged { .. } => Mode::AfterCall,
                            ToolSyntax::BareJson => Mode::BareStart,
                        };
                    }
                }
                self.start_if_named();
            }
            Mode::AfterCall => {
                let ToolSyntax::Tagged { close, .. } = &self.syntax else {
                    unreachable!()
                };
                self.pending.push(c);
                if close.starts_with(self.pending.trim_start()) {
                    if self.pending.trim_start() == close {
                        self.pending.clear();
                        self.mode = Mode::Text;
                    }
                } else {
                    // No closing tag: back to content with this text.
                    let held = std::mem::take(&mut self.pending);
                    self.mode = Mode::Text;
                    for c in held.trim_start().chars() {
                        self.step_text(c);
                    }
                }
            }
        }
    }

    fn step_text(&mut self, c: char) {
        let ToolSyntax::Tagged { open, .. } = &self.syntax else {
            unreachable!()
        };
        self.pending.push(c);
        // `pending` = trailing whitespace, then maybe the start of the opening tag.
        let body = self.pending.trim_start();
        if body.is_empty() {
            return;
        }
        if open.starts_with(body) {
            if body == open {
                self.pending.clear();
                self.begin_call();
            }
            return;
        }
        // Not a tag: release all but trailing whitespace and a new possible tag start.
        let keep_from = tail_start(&self.pending, open);
        let out: String = self.pending[..keep_from].to_string();
        self.pending.drain(..keep_from);
        self.content(&out);
    }

    fn step_bare_start(&mut self, c: char) {
        self.pending.push(c);
        let body = self.pending.trim_start();
        if body.is_empty() {
            return;
        }
        if PYTHON_TAG.starts_with(body) {
            if body == PYTHON_TAG {
                self.pending.clear();
            }
            return;
        }
        let body = body.strip_prefix(PYTHON_TAG).unwrap_or(body).trim_start();
        let after_call = !self.calls.is_empty();
        if body == "{" {
            self.pending = "{".into();
            self.begin_call();
            if let Mode::Call(s) = &mut self.mode {
                s.step('{');
            }
        } else if after_call && body == ";" {
            self.pending.clear();
        } else if after_call && body.trim().is_empty() {
        } else {
            // Plain content from here on.
            self.mode = Mode::Content;
            let held = std::mem::take(&mut self.pending);
            self.content(if after_call { held.trim_start() } else { &held });
        }
    }

    fn begin_call(&mut self) {
        self.mode = Mode::Call(Box::new(CallScanner::new(self.calls.len())));
    }

    /// Announces the call once its name is known, then its arguments so far.
    fn start_if_named(&mut self) {
        let Mode::Call(s) = &mut self.mode else {
            return;
        };
        if s.announced || s.name.is_none() {
            return;
        }
        s.announced = true;
        let (index, name) = (s.index, s.name.clone().unwrap_or_default());
        let id = format!("{}{}", self.id_prefix, index);
        s.id = id.clone();
        self.events.push(ToolEvent::Start { index, id, name });
    }

    fn flush_arguments(&mut self) {
        let Mode::Call(s) = &mut self.mode else {
            return;
        };
        if !s.announced || s.unsent.is_empty() || s.args_is_string {
            return;
        }
        let delta = std::mem::take(&mut s.unsent);
        self.events.push(ToolEvent::Arguments {
            index: s.index,
            delta,
        });
    }

    fn end_call(&mut self, mut s: CallScanner) {
        let Some(name) = s.name.clone() else {
            // Inside tags but no name: what the model wrote, as content without the markup.
            let raw = std::mem::take(&mut s.raw);
            self.content(&raw);
            return;
        };
        if !s.announced {
            s.announced = true;
            s.id = format!("{}{}", self.id_prefix, s.index);
            self.events.push(ToolEvent::Start {
                index: s.index,
                id: s.id.clone(),
                name: name.clone(),
            });
        }
        let arguments = if s.args_is_string {
            // A JSON string holding the arguments' JSON: pass on its value.
            let value = serde_json::from_str::<String>(&s.args).unwrap_or_default();
            s.unsent = value.clone();
            value
        } else if s.args.trim().is_empty() {
            s.unsent = "{}".into();
            "{}".into()
        } else {
            s.args.clone()
        };
        if !s.unsent.is_empty() {
            self.events.push(ToolEvent::Arguments {
                index: s.index,
                delta: std::mem::take(&mut s.unsent),
            });
        }
        self.calls.push(ToolCall {
            id: s.id,
            name,
            arguments,
        });
    }
}

/// Where the held-back tail of `text` starts: trailing whitespace followed by a prefix of
/// `tag` (possibly empty), or the end.
fn tail_start(text: &str, tag: &str) -> usize {
    // The longest suffix that is a prefix of the tag.
    let tag_at = text
        .char_indices()
        .map(|(i, _)| i)
        .find(|&i| tag.starts_with(&text[i..]))
        .unwrap_or(text.len());
    let before = &text[..tag_at];
    before.trim_end().len()
}

/// What a scanner step found.
#[derive(Debug, PartialEq, Eq)]
enum Scan {
    More,
    /// BareJson: the object's first key is not a call's.
    NotACall,
    Done,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    /// Before the object's `{`.
    Open,
    Key,
    Colon,
    Value,
    /// After a value: `,` or `}`.
    Next,
}

/// Scans one call object character by character: its `name`, and its `arguments` (or
/// `parameters`) value, streamed as written.
#[derive(Debug)]
struct CallScanner {
    index: usize,
    id: String,
    expect: Expect,
    keys_seen: usize,
    key: String,
    in_key: bool,
    /// Inside a value: its nesting depth, string state and text.
    value: Option<ValueScan>,
    name: Option<String>,
    announced: bool,
    args: String,
    args_is_string: bool,
    unsent: String,
    /// The object's text (for a nameless call's fallback).
    raw: String,
    escaped: bool,
}

#[derive(Debug, Default)]
struct ValueScan {
    text: String,
    depth: usize,
    in_string: bool,
    escaped: bool,
    started: bool,
}

impl CallScanner {
    fn new(index: usize) -> CallScanner {
        CallScanner {
            index,
            id: String::new(),
            expect: Expect::Open,
            keys_seen: 0,
            key: String::new(),
            in_key: false,
            value: None,
            name: None,
            announced: false,
            args: String::new(),
            args_is_string: false,
            unsent: String::new(),
            raw: String::new(),
            escaped: false,
        }
    }

    fn is_args_key(&self) -> bool {
        self.key == "arguments" || self.key == "parameters"
    }

    fn step(&mut self, c: char) -> Scan {
        self.raw.push(c);
        if let Some(v) = &mut self.value {
            let done = v.step(c);
            match done {
                ValueEnd::No => {
                    if self.is_args_key() {
                        self.args.push(c);
                        self.unsent.push(c);
                    }
                    return Scan::More;
                }
                ValueEnd::Including => {
                    if self.is_args_key() {
                        self.args.push(c);
                        self.unsent.push(c);
                    }
                    self.end_value();
                    return Scan::More;
                }
                ValueEnd::Before => {
                    // A scalar ended at this character, which belongs to the object.
                    self.end_value();
                }
            }
        }
        match self.expect {
            Expect::Open => {
                if c == '{' {
                    self.expect = Expect::Key;
                }
                Scan::More
            }
            Expect::Key => {
                if self.in_key {
                    if self.escaped {
                        self.escaped = false;
                        self.key.push(c);
                    } else if c == '\\' {
                        self.escaped = true;
                    } else if c == '"' {
                        self.in_key = false;
                        self.expect = Expect::Colon;
                        self.keys_seen += 1;
                        let call_key = matches!(
                            self.key.as_str(),
                            "name" | "arguments" | "parameters" | "id" | "type" | "function"
                        );
                        if self.keys_seen == 1 && !call_key {
                            return Scan::NotACall;
                        }
                    } else {
                        self.key.push(c);
                    }
                    Scan::More
                } else if c == '"' {
                    self.in_key = true;
                    self.key.clear();
                    Scan::More
                } else if c == '}' {
                    Scan::Done
                } else {
                    Scan::More
                }
            }
            Expect::Colon => {
                if c == ':' {
                    self.expect = Expect::Value;
                }
                Scan::More
            }
            Expect::Value => {
                if c.is_whitespace() {
                    return Scan::More;
                }
                let mut v = ValueScan::default();
                let end = v.step(c);
                if self.is_args_key() {
                    self.args.clear();
                    self.unsent.clear();
                    self.args_is_string = c == '"';
                    self.args.push(c);
                    self.unsent.push(c);
                }
                self.value = Some(v);
                if end == ValueEnd::Including {
                    self.end_value();
                }
                Scan::More
            }
            Expect::Next => match c {
                ',' => {
                    self.expect = Expect::Key;
                    Scan::More
                }
                '}' => Scan::Done,
                _ => Scan::More,
            },
        }
    }

    fn end_value(&mut self) {
        let v = self.value.take().unwrap_or_default();
        if self.key == "name" && self.name.is_none() {
            self.name = serde_json::from_str::<Value>(&v.text)
                .ok()
                .and_then(|n| n.as_str().map(str::to_string));
        }
        if self.key == "function" && self.name.is_none() {
            // {"function": {"name": ..., "arguments": ...}}: an OpenAI-shaped call.
            if let Ok(f) = serde_json::from_str::<Value>(&v.text) {
                self.name = f["name"].as_str().map(str::to_string);
                let args = match &f["arguments"] {
                    Value::String(s) => s.clone(),
                    Value::Null => String::new(),
                    other => other.to_string(),
                };
                self.args = args.clone();
                self.unsent = args;
            }
        }
        self.expect = Expect::Next;
    }
}

#[derive(Debug, PartialEq, Eq)]
enum ValueEnd {
    No,
    /// The value ends with this character.
    Including,
    /// The value ended before this character (a scalar's terminator).
    Before,
}

impl ValueScan {
    fn step(&mut self, c: char) -> ValueEnd {
        if !self.started {
            self.started = true;
            self.text.push(c);
            return match c {
                '"' => {
                    self.in_string = true;
                    ValueEnd::No
                }
                '{' | '[' => {
                    self.depth = 1;
                    ValueEnd::No
                }
                _ => ValueEnd::No,
            };
        }
        if self.in_string {
            self.text.push(c);
            if self.escaped {
                self.escaped = false;
            } else if c == '\\' {
                self.escaped = true;
            } else if c == '"' {
                self.in_string = false;
                if self.depth == 0 {
                    return ValueEnd::Including;
                }
            }
            return ValueEnd::No;
        }
        if self.depth == 0 {
            // A scalar: it ends at a delimiter.
            if c == ',' || c == '}' || c.is_whitespace() {
                return ValueEnd::Before;
            }
            self.text.push(c);
            return ValueEnd::No;
        }
        self.text.push(c);
        match c {
            '"' => self.in_string = true,
            '{' | '[' => self.depth += 1,
            '}' | ']' => {
                self.depth -= 1;
                if self.depth == 0 {
                    return ValueEnd::Including;
                }
            }
            _ => {}
        }
        ValueEnd::No
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `pieces` one by one; returns the content, the calls rebuilt from the events, and
    /// the events.
    fn run(syntax: ToolSyntax, pieces: &[&str]) -> (String, Vec<ToolCall>, Vec<ToolEvent>) {
        let mut p = ToolCallParser::new(syntax, "call_");
        let mut events = Vec::new();
        for piece in pieces {
            events.extend(p.push(piece));
        }
        events.extend(p.finish());
        let mut content = String::new();
        let mut calls: Vec<ToolCall> = Vec::new();
        for e in &events {
            match e {
                ToolEvent::Content(t) => content.push_str(t),
                ToolEvent::Start { index, id, name } => {
                    assert_eq!(*index, calls.len(), "calls start in order");
                    calls.push(ToolCall {
                        id: id.clone(),
                        name: name.clone(),
                        arguments: String::new(),
                    });
                }
                ToolEvent::Arguments { index, delta } => calls[*index].arguments.push_str(delta),
            }
        }
        assert_eq!(calls, p.calls(), "streamed calls equal the finished ones");
        (content, calls, events)
    }

    fn chars(text: &str) -> Vec<String> {
        text.chars().map(String::from).collect()
    }

    const HERMES: &str = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": [1, 2]}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\"}}\n</tool_call>";

    #[test]
    fn hermes_calls_split_into_single_characters_never_leak_markup() {
        let pieces = chars(HERMES);
        let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
        let (content, calls, events) = run(ToolSyntax::hermes(), &refs);
        assert_eq!(content, "Let me check.");
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].name, "get_weather");
        assert_eq!(calls[0].id, "call_0");
        let args: Value = serde_json::from_str(&calls[0].arguments).unwrap();
        assert_eq!(args, serde_json::json!({"city": "Paris", "days": [1, 2]}));
        assert_eq!(calls[1].name, "get_time");
        assert_eq!(calls[1].arguments, "{\"tz\": \"CET\"}");
        // Arguments stream: more than one delta for the first call.
        let deltas = events
            .iter()
            .filter(|e| matches!(e, ToolEvent::Arguments { index: 0, .. }))
            .count();
        assert!(deltas > 5, "{deltas} argument deltas");
        for e in &events {
            if let ToolEvent::Content(t) = e {
                assert!(!t.contains('<') && !t.contains('{'), "markup leaked: {t:?}");
            }
        }
    }

    /// Every way of cutting the text into two pieces and into tokens of a few characters
    /// gives the same result as the whole text at once.
    #[test]
    fn any_split_gives_the_same_result() {
        let whole = run(ToolSyntax::hermes(), &[HERMES]);
        for cut in 0..HERMES.len() {
            if !HERMES.is_char_boundary(cut) {
                continue;
            }
            let (a, b) = HERMES.split_at(cut);
            let split = run(ToolSyntax::hermes(), &[a, b]);
            assert_eq!((&split.0, &split.1), (&whole.0, &whole.1), "cut at {cut}");
        }
        for size in 2..9 {
            let pieces: Vec<String> = chars(HERMES).chunks(size).map(|c| c.concat()).collect();
            let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
            let split = run(ToolSyntax::hermes(), &refs);
            assert_eq!(
                (&split.0, &split.1),
                (&whole.0, &whole.1),
                "pieces of {size}"
            );
        }
    }

    #[test]
    fn text_that_only_looks_like_a_tag_is_content() {
        let text = "a < b and <tool> or <tool_cal x </tool_call> end  ";
        let pieces = chars(text);
        let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
        let (content, calls, _) = run(ToolSyntax::hermes(), &refs);
        assert!(calls.is_empty());
        assert_eq!(content, text);
        // No call, plain text, held whitespace released in order.
        let (content, _, _) = run(ToolSyntax::hermes(), &["one\n", "\n", "two"]);
        assert_eq!(content, "one\n\ntwo");
    }

    #[test]
    fn a_call_cut_off_or_without_a_name() {
        // Cut off inside the arguments (max_tokens): the call keeps what it has.
        let (content, calls, _) = run(
            ToolSyntax::hermes(),
            &["<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1"],
        );
        assert_eq!(content, "");
        assert_eq!(calls[0].arguments, "{\"a\": 1");
        // No name: the body is content, without the tags.
        let (content, calls, _) = run(ToolSyntax::hermes(), &["<tool_call>{\"x\": 1}</tool_call>"]);
        assert!(calls.is_empty());
        assert_eq!(content, "{\"x\": 1}");
        // No arguments: an empty object. Arguments as a string: its value.
        let (_, calls, _) = run(
            ToolSyntax::hermes(),
            &["<tool_call>{\"name\": \"now\"}</tool_call>"],
        );
        assert_eq!(calls[0].arguments, "{}");
        let (_, calls, _) = run(
            ToolSyntax::hermes(),
            &["<tool_call>{\"arguments\": \"{\\\"q\\\": 2}\", \"name\": \"s\"}</tool_call>"],
        );
        assert_eq!(
            (calls[0].name.as_str(), calls[0].arguments.as_str()),
            ("s", "{\"q\": 2}")
        );
        // Scalars and strings with braces inside arguments.
        let (_, calls, _) = run(
            ToolSyntax::hermes(),
            &["<tool_call>{\"name\": \"f\", \"arguments\": {\"s\": \"}{\\\"\", \"n\": -1.5e3, \"b\": true}}</tool_call>"],
        );
        let v: Value = serde_json::from_str(&calls[0].arguments).unwrap();
        assert_eq!(v["s"], "}{\"");
        assert_eq!(v["n"], -1500.0);
    }

    #[test]
    fn llama3_bare_json_calls() {
        let text = "<|python_tag|>{\"name\": \"search\", \"parameters\": {\"q\": \"rust\"}}; {\"name\": \"open\", \"parameters\": {\"n\": 1}}";
        let pieces = chars(text);
        let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
        let (content, calls, _) = run(ToolSyntax::BareJson, &refs);
        assert_eq!(content, "");
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].name, "search");
        assert_eq!(calls[0].arguments, "{\"q\": \"rust\"}");
        assert_eq!(calls[1].arguments, "{\"n\": 1}");
        // An answer that is other JSON, or text, is content as written.
        for text in ["{\"answer\": 42}", "  The answer is {42}."] {
            let pieces = chars(text);
            let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
            let (content, calls, _) = run(ToolSyntax::BareJson, &refs);
            assert!(calls.is_empty());
            assert_eq!(content, text);
        }
    }
}
