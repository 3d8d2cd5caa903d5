//! Chat templates: the Jinja template a model ships (GGUF `tokenizer.chat_template`, HF
//! `chat_template.jinja` or `tokenizer_config.json`), rendered with minijinja configured like
//! Hugging Face's `apply_chat_template`: `trim_blocks` + `lstrip_blocks`, Python string/dict
//! methods (minijinja-contrib pycompat), `raise_exception(msg)`, an HF-compatible `tojson`
//! (Python `json.dumps` output: `", "`/`": "` separators, no HTML escaping, non-ASCII kept),
//! and the variables `messages`, `add_generation_prompt`, `bos_token`, `eos_token`, plus any
//! extra ones (`enable_thinking`, `tools`...).
//!
//! A template is code from the checkpoint, so rendering is bounded: every render gets
//! [`RENDER_FUEL`] (minijinja's fuel: one unit per VM instruction, so loops end), all value
//! output, captured (`{% set x %}`, macros) or not, counts against [`MAX_RENDERED_BYTES`], and so
//! does the rendered text itself; a `tojson` indent is at most [`MAX_INDENT`] characters; a
//! panic inside minijinja becomes an error. minijinja itself refuses ranges over 100000 items and
//! repeated strings over 100 MB. The builtins whose one call could build gigabytes from a small
//! number are wrapped: format strings (the `format` filter and `str.format`) may hold no number
//! above [`MAX_FORMAT_NUMBER`] (a width of 2³² once hung the fuzzer), `indent` is at most
//! [`MAX_INDENT`] wide, `batch` and `slice` make at most [`MAX_FORMAT_NUMBER`] items, and
//! `replace` (filter and method) refuses a result over [`MAX_RENDERED_BYTES`]. What these bounds
//! do not cover: a handful of instructions that each build a huge value without writing it
//! (string concatenation doubling a 100 MB string, raw template text captured in a loop).

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use minijinja::value::{Kwargs, Object, Rest, Value, ValueKind};
use minijinja::{Environment, Error, ErrorKind, Output, State};
use serde::{Deserialize, Serialize};
use serde_json::Map;

use super::TokenizerError;
use crate::format::GgufFile;

/// One message of a conversation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` (or whatever roles the template knows).
    pub role: String,
    /// The text.
    pub content: String,
}

impl ChatMessage {
    /// A message of `role` saying `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
}

const NAME: &str = "chat_template";

/// The work one render may do, in minijinja fuel (VM instructions). Real templates use ~30 per
/// message (500 messages and a tool: 9510-15785, see the tests), so conversations far longer
/// than any context render well within it, while a runaway loop stops within ~0.5 s.
pub const RENDER_FUEL: u64 = 5_000_000;
/// The most text one render may write (values and template text, captured or not).
pub const MAX_RENDERED_BYTES: usize = 64 << 20;
/// The longest `tojson` indent or separator (Python allows any; an indent of 10**9 spaces per
/// level would be an attack).
pub const MAX_INDENT: usize = 64;

/// The largest number a format string may hold (`'%4294967296s' | format(x)` or
/// `'{:>4294967296}'.format(x)` would pad one value to 4 GiB in one instruction), and the most
/// items `batch` and `slice` may make.
pub const MAX_FORMAT_NUMBER: usize = 1 << 16;

/// A compiled chat template with the BOS/EOS texts it may refer to.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    origin: String,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("origin", &self.origin)
            .field("bytes", &self.source.len())
            .finish()
    }
}

impl ChatTemplate {
    /// Compiles `source`. `origin` names where it came from, for error messages.
    pub fn new(
        source: &str,
        bos_token: impl Into<String>,
        eos_token: impl Into<String>,
        origin: impl Into<String>,
    ) -> Result<ChatTemplate, TokenizerError> {
        let origin = origin.into();
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(bounded_methods);
        // Builtins whose one call can build a value of any size from a small number: bounded.
        env.add_filter("format", bounded_format);
        env.add_filter("indent", bounded_indent);
        env.add_filter("batch", bounded_batch);
        env.add_filter("slice", bounded_slice);
        env.add_filter("replace", bounded_replace);
        env.add_function("raise_exception", raise_exception);
        env.add_filter("tojson", tojson);
        env.add_function("strftime_now", strftime_now);
        env.set_fuel(Some(RENDER_FUEL));
        env.set_formatter(bounded_formatter);
        env.add_template_owned(NAME, source.to_string())
            .map_err(|e| TokenizerError::Template {
                source_name: origin.clone(),
                reason: describe(&e),
            })?;
        Ok(ChatTemplate {
            env,
            source: source.to_string(),
            origin,
            bos_token: bos_token.into(),
            eos_token: eos_token.into(),
        })
    }

    /// The template of a GGUF file (`tokenizer.chat_template`), with its BOS/EOS token texts.
    pub fn from_gguf(gguf: &GgufFile) -> Result<ChatTemplate, TokenizerError> {
        let origin = gguf.path().display().to_string();
        let source =
            gguf.get_str("tokenizer.chat_template")
                .ok_or_else(|| TokenizerError::Template {
                    source_name: origin.clone(),
                    reason: "the file has no tokenizer.chat_template".into(),
                })?;
        let token = |key: &str| -> String {
            let tokens = gguf.get_array("tokenizer.ggml.tokens");
            gguf.get_u64(key)
                .and_then(|id| tokens?.get(id as usize)?.as_str().map(str::to_string))
                .unwrap_or_default()
        };
        let (bos, eos) = (
            token("tokenizer.ggml.bos_token_id"),
            token("tokenizer.ggml.eos_token_id"),
        );
        ChatTemplate::new(source, bos, eos, origin)
    }

    /// The template of a Hugging Face directory (`chat_template.jinja`, else
    /// `tokenizer_config.json`'s `chat_template`), with bos/eos texts from tokenizer_config.json.
    pub fn from_hf_dir(dir: impl AsRef<Path>) -> Result<ChatTemplate, TokenizerError> {
        let dir = dir.as_ref();
        let origin = dir.display().to_string();
        let source = super::hf::dir_template(dir)?.ok_or_else(|| TokenizerError::Template {
            source_name: origin.clone(),
            reason: "no chat_template.jinja and no chat_template in tokenizer_config.json".into(),
        })?;
        let config: serde_json::Value = std::fs::read_to_string(dir.join("tokenizer_config.json"))
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_default();
        let text = |key: &str| -> String {
            match config.get(key) {
                Some(serde_json::Value::String(s)) => s.clone(),
                Some(serde_json::Value::Object(o)) => o
                    .get("content")
                    .and_then(|c| c.as_str())
                    .unwrap_or("")
                    .into(),
                _ => String::new(),
            }
        };
        ChatTemplate::new(&source, text("bos_token"), text("eos_token"), origin)
    }

    /// Renders a conversation. `extra` adds variables (e.g. `enable_thinking`, `tools`); it may
    /// not override `messages`, `add_generation_prompt`, `bos_token`, `eos_token`.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        extra: &Map<String, serde_json::Value>,
    ) -> Result<String, TokenizerError> {
        let messages = serde_json::to_value(messages).expect("messages serialize");
        self.render_json(&messages, add_generation_prompt, extra)
    }

    /// Renders messages given as JSON (an array of objects, for tool calls or list contents).
    pub fn render_json(
        &self,
        messages: &serde_json::Value,
        add_generation_prompt: bool,
        extra: &Map<String, serde_json::Value>,
    ) -> Result<String, TokenizerError> {
        let mut ctx = extra.clone();
        // Hugging Face always passes these (None when not given).
        for key in ["tools", "documents"] {
            ctx.entry(key).or_insert(serde_json::Value::Null);
        }
        ctx.insert("messages".into(), messages.clone());
        ctx.insert("add_generation_prompt".into(), add_generation_prompt.into());
        ctx.insert("bos_token".into(), self.bos_token.clone().into());
        ctx.insert("eos_token".into(), self.eos_token.clone().into());
        let failed = |reason| TokenizerError::Template {
            source_name: self.origin.clone(),
            reason,
        };
        let template = self
            .env
            .get_template(NAME)
            .map_err(|e| failed(describe(&e)))?;
        let mut out = BoundedText::default();
        super::guard::guarded("rendering", || {
            template.render_captured_to(ctx, &mut out).map(drop)
        })
        .map_err(failed)?
        .map_err(|e| failed(describe(&e)))?;
        String::from_utf8(out.text).map_err(|e| failed(format!("rendered invalid UTF-8: {e}")))
    }

    /// The template's Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    pub fn bos_token(&self) -> &str {
        &self.bos_token
    }

    pub fn eos_token(&self) -> &str {
        &self.eos_token
    }
}

/// The error and its causes on one line.
fn describe(e: &Error) -> String {
    let mut s = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        s.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    s
}

fn too_long() -> String {
    format!("the rendered text is over the limit of {MAX_RENDERED_BYTES} bytes")
}

/// The rendered text, refusing to grow past [`MAX_RENDERED_BYTES`].
#[derive(Default)]
struct BoundedText {
    text: Vec<u8>,
}

impl std::io::Write for BoundedText {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.text.len() + buf.len() > MAX_RENDERED_BYTES {
            return Err(std::io::Error::other(too_long()));
        }
        self.text.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Bytes of value output one render has written so far (kept in the render's state).
#[derive(Debug, Default)]
struct Written(AtomicUsize);

impl Object for Written {}

/// A writer that stops once the render's value output would pass [`MAX_RENDERED_BYTES`].
struct Counted<'a, 'o> {
    out: &'a mut Output<'o>,
    written: &'a Written,
    over: bool,
}

impl std::fmt::Write for Counted<'_, '_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let before = self.written.0.fetch_add(s.len(), Ordering::Relaxed);
        if before + s.len() > MAX_RENDERED_BYTES {
            self.over = true;
            return Err(std::fmt::Error);
        }
        self.out.write_str(s)
    }
}

/// minijinja's formatter for templates without auto-escaping (chat templates have none), with
/// every value's text counted, captured output included: `{{ ['a'] * 10**9 }}` is a single
/// instruction, so only its length can stop it.
fn bounded_formatter(out: &mut Output, state: &State, value: &Value) -> Result<(), Error> {
    use std::fmt::Write;
    let written = state.get_or_set_temp_object("kasoku.written", Written::default);
    // Formatting a sequence goes through every item even after a write failed, so a sequence
    // of a billion items must be refused before it is formatted.
    let left = MAX_RENDERED_BYTES.saturating_sub(written.0.load(Ordering::Relaxed));
    if shown_len_at_least(value, left + 1) > left {
        return Err(Error::new(ErrorKind::InvalidOperation, too_long()));
    }
    let mut w = Counted {
        out,
        written: &written,
        over: false,
    };
    let result = match value.as_str() {
        Some(s) => w.write_str(s),
        None => write!(w, "{value}"),
    };
    match result {
        Ok(()) => Ok(()),
        Err(_) if w.over => Err(Error::new(ErrorKind::InvalidOperation, too_long())),
        Err(e) => Err(Error::from(e)),
    }
}

/// A lower bound of the length of `value`'s text, or a number at least `limit` once the bound
/// reaches it (so the walk costs at most `limit` steps): a string is its length, a sequence or map
/// at least one byte per item plus its brackets, anything else at least one byte. Lazy iterables
/// are counted by their length alone (walking them could consume them).
fn shown_len_at_least(value: &Value, limit: usize) -> usize {
    if let Some(s) = value.as_str() {
        return s.len();
    }
    match value.kind() {
        ValueKind::Seq | ValueKind::Map => {
            let mut total = 2;
            if value.len().is_some_and(|n| n >= limit) {
                return limit;
            }
            for item in value.try_iter().into_iter().flatten() {
                total += 1 + shown_len_at_least(&item, limit.saturating_sub(total));
                if total >= limit {
                    return total;
                }
            }
            total
        }
        ValueKind::Iterable => value.len().unwrap_or(0).saturating_add(2),
        _ => 1,
    }
}

/// Refuses a format string holding a number (a width, a precision) above
/// [`MAX_FORMAT_NUMBER`]; printf and `str.format` styles read widths only from the string.
fn check_format_string(format: &str) -> Result<(), Error> {
    let too_big = format.split(|c: char| !c.is_ascii_digit()).any(|digits| {
        digits.len() > 9 || digits.parse::<usize>().is_ok_and(|n| n > MAX_FORMAT_NUMBER)
    });
    if too_big {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("a format string may not hold numbers above {MAX_FORMAT_NUMBER} (a width or precision that large is an attack)"),
        ));
    }
    Ok(())
}

/// Refuses a replacement whose result would exceed [`MAX_RENDERED_BYTES`].
fn check_replace(value: &Value, from: &Value, to: &Value) -> Result<(), Error> {
    let (Some(s), Some(from), Some(to)) = (value.as_str(), from.as_str(), to.as_str()) else {
        return Ok(());
    };
    if to.len() <= from.len() {
        return Ok(());
    }
    let hits = if from.is_empty() {
        s.chars().count() + 1
    } else {
        s.matches(from).count()
    };
    let grown = s
        .len()
        .saturating_add(hits.saturating_mul(to.len() - from.len()));
    if grown > MAX_RENDERED_BYTES {
        return Err(Error::new(ErrorKind::InvalidOperation, too_long()));
    }
    Ok(())
}

/// A count for `batch` or `slice` of at most [`MAX_FORMAT_NUMBER`].
fn check_count(count: usize, filter: &str) -> Result<(), Error> {
    if count > MAX_FORMAT_NUMBER {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("{filter} of {count} items (at most {MAX_FORMAT_NUMBER})"),
        ));
    }
    Ok(())
}

/// The `format` filter with [`check_format_string`] first.
fn bounded_format(state: &State, format: &Value, args: Rest<Value>) -> Result<Value, Error> {
    if let Some(f) = format.as_str() {
        check_format_string(f)?;
    }
    minijinja::filters::format(state, format, args)
}

/// The `indent` filter with a width of at most [`MAX_INDENT`].
fn bounded_indent(
    state: &State,
    value: Value,
    args: Rest<Value>,
    kwargs: Kwargs,
) -> Result<Value, Error> {
    let width = match args.first() {
        Some(w) => w.as_usize(),
        None => kwargs.peek::<Option<usize>>("width")?,
    };
    if width.is_some_and(|w| w > MAX_INDENT) {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("indent wider than {MAX_INDENT} characters"),
        ));
    }
    let mut call = vec![value];
    call.extend(args.0);
    call.push(Value::from(kwargs));
    Value::from_function(minijinja::filters::indent).call(state, &call)
}

/// `fill_with`, given by position or (as Jinja2 allows) by name.
fn fill_with(positional: Option<Value>, kwargs: &Kwargs) -> Result<Option<Value>, Error> {
    let named = kwargs.get::<Option<Value>>("fill_with")?;
    kwargs.assert_all_used()?;
    Ok(positional.or(named))
}

/// The `batch` filter with at most [`MAX_FORMAT_NUMBER`] items a batch.
fn bounded_batch(
    state: &State,
    value: Value,
    count: usize,
    fill: Option<Value>,
    kwargs: Kwargs,
) -> Result<Value, Error> {
    check_count(count, "batch")?;
    minijinja::filters::batch(state, value, count, fill_with(fill, &kwargs)?)
}

/// The `slice` filter with at most [`MAX_FORMAT_NUMBER`] slices.
fn bounded_slice(
    state: &State,
    value: Value,
    count: usize,
    fill: Option<Value>,
    kwargs: Kwargs,
) -> Result<Value, Error> {
    check_count(count, "slice")?;
    minijinja::filters::slice(state, value, count, fill_with(fill, &kwargs)?)
}

/// The `replace` filter, refusing a result over [`MAX_RENDERED_BYTES`].
fn bounded_replace(state: &State, value: Value, from: Value, to: Value) -> Result<Value, Error> {
    check_replace(&value, &from, &to)?;
    Value::from_function(minijinja::filters::replace).call(state, &[value, from, to])
}

/// Python's string, dict and list methods (minijinja-contrib's pycompat), with
/// `str.format` and `str.replace` bounded as the filters are.
fn bounded_methods(
    state: &State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, Error> {
    if let Some(s) = value.as_str() {
        match (method, args) {
            ("format", _) => check_format_string(s)?,
            ("replace", [from, to, ..]) => check_replace(value, from, to)?,
            _ => {}
        }
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// Hugging Face's `strftime_now(format)` (used by Llama 3.x templates for today's date), in UTC.
/// Supports `%d %m %Y %y %b %B %a %A %H %M %S %j %%`; other specifiers are kept as written.
fn strftime_now(format: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    strftime(&format, secs)
}

/// Formats `secs` since the Unix epoch (UTC) like Python's `strftime` (subset, English names).
fn strftime(format: &str, secs: u64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    let days = (secs / 86400) as i64;
    let rem = secs % 86400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    let before: [i64; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = before[(month - 1) as usize] + day + i64::from(leap && month > 2);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year % 100)),
            Some('b') => out.push_str(&MONTHS[(month - 1) as usize][..3]),
            Some('B') => out.push_str(MONTHS[(month - 1) as usize]),
            Some('a') => out.push_str(&DAYS[weekday][..3]),
            Some('A') => out.push_str(DAYS[weekday]),
            Some('H') => out.push_str(&format!("{:02}", rem / 3600)),
            Some('M') => out.push_str(&format!("{:02}", rem % 3600 / 60)),
            Some('S') => out.push_str(&format!("{:02}", rem % 60)),
            Some('j') => out.push_str(&format!("{yday:03}")),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Hugging Face's `tojson`: Python `json.dumps(value, ensure_ascii=False, indent=indent,
/// separators=separators, sort_keys=sort_keys)`, returned as safe (unescaped) text.
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<Value> = kwargs.get("indent")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let too_long = |what: &str, len: usize| {
        Error::new(
            ErrorKind::InvalidOperation,
            format!("tojson: {what} of {len} characters is over the limit of {MAX_INDENT}"),
        )
    };
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => {
            let text = if let Some(s) = v.as_str() {
                s.to_string()
            } else {
                let n = i64::try_from(v.clone()).map_err(|_| {
                    Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: indent must be an int or str",
                    )
                })?;
                let n = usize::try_from(n).unwrap_or(0);
                if n > MAX_INDENT {
                    return Err(too_long("an indent", n));
                }
                " ".repeat(n)
            };
            if text.chars().count() > MAX_INDENT {
                return Err(too_long("an indent", text.chars().count()));
            }
            Some(text)
        }
    };
    let (item_sep, key_sep) = match separators.as_deref() {
        Some([a, b]) => (a.clone(), b.clone()),
        Some(_) => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson: separators must be a pair",
            ))
        }
        None if indent.is_some() => (",".to_string(), ": ".to_string()),
        None => (", ".to_string(), ": ".to_string()),
    };
    for sep in [&item_sep, &key_sep] {
        if sep.chars().count() > MAX_INDENT {
            return Err(too_long("a separator", sep.chars().count()));
        }
    }
    let json = serde_json::to_value(&value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let mut w = PyJson {
        out: String::new(),
        indent,
        item_sep,
        key_sep,
        ensure_ascii: ensure_ascii.unwrap_or(false),
        sort_keys: sort_keys.unwrap_or(false),
    };
    w.value(&json, 0);
    Ok(Value::from_safe_string(w.out))
}

/// A writer of Python's `json.dumps` text.
struct PyJson {
    out: String,
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    ensure_ascii: bool,
    sort_keys: bool,
}

impl PyJson {
    fn newline(&mut self, depth: usize) {
        if let Some(ind) = &self.indent {
            self.out.push('\n');
            for _ in 0..depth {
                self.out.push_str(ind);
            }
        }
    }

    fn value(&mut self, v: &serde_json::Value, depth: usize) {
        use serde_json::Value as J;
        match v {
            J::Null => self.out.push_str("null"),
            J::Bool(b) => self.out.push_str(if *b { "true" } else { "false" }),
            J::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
                (Some(i), _, _) => self.out.push_str(&i.to_string()),
                (_, Some(u), _) => self.out.push_str(&u.to_string()),
                (_, _, Some(f)) => self.out.push_str(&python_float(f)),
                _ => self.out.push_str(&n.to_string()),
            },
            J::String(s) => self.string(s),
            J::Array(items) => {
                if items.is_empty() {
                    self.out.push_str("[]");
                    return;
                }
                self.out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        let sep = self.item_sep.clone();
                        self.out.push_str(&sep);
                    }
                    self.newline(depth + 1);
                    self.value(item, depth + 1);
                }
                self.newline(depth);
                self.out.push(']');
            }
            J::Object(map) => {
                if map.is_empty() {
                    self.out.push_str("{}");
                    return;
                }
                let mut entries: Vec<(&String, &serde_json::Value)> = map.iter().collect();
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(b.0));
                }
                self.out.push('{');
                for (i, (k, item)) in entries.into_iter().enumerate() {
                    if i > 0 {
                        let sep = self.item_sep.clone();
                        self.out.push_str(&sep);
                    }
                    self.newline(depth + 1);
                    self.string(k);
                    let sep = self.key_sep.clone();
                    self.out.push_str(&sep);
                    self.value(item, depth + 1);
                }
                self.newline(depth);
                self.out.push('}');
            }
        }
    }

    fn string(&mut self, s: &str) {
        self.out.push('"');
        for c in s.chars() {
            match c {
                '"' => self.out.push_str("\\\""),
                '\\' => self.out.push_str("\\\\"),
                '\n' => self.out.push_str("\\n"),
                '\r' => self.out.push_str("\\r"),
                '\t' => self.out.push_str("\\t"),
                '\u{8}' => self.out.push_str("\\b"),
                '\u{c}' => self.out.push_str("\\f"),
                c if (c as u32) < 0x20 || (self.ensure_ascii && (c as u32) > 0x7e) => {
                    let mut buf = [0u16; 2];
                    for unit in c.encode_utf16(&mut buf) {
                        self.out.push_str(&format!("\\u{unit:04x}"));
                    }
                }
                c => self.out.push(c),
            }
        }
        self.out.push('"');
    }
}

/// Python's `repr(float)`: shortest round-trip digits, positional for exponents -4..16,
/// otherwise `d.ddde±XX`; `NaN`, `Infinity`, `-Infinity` as `json.dumps` writes them.
fn python_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 {
            "Infinity".into()
        } else {
            "-Infinity".into()
        };
    }
    let sci = format!("{f:e}"); // shortest digits: "-1.2345e-5"
    let (mantissa, exp) = sci.split_once('e').expect("{:e} has an exponent");
    let exp: i32 = exp.parse().expect("integer exponent");
    let (sign, mantissa) = mantissa
        .strip_prefix('-')
        .map_or(("", mantissa), |m| ("-", m));
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if (-4..16).contains(&exp) {
        let point = exp + 1; // digits before the decimal point
        let body = if point <= 0 {
            format!("0.{}{}", "0".repeat((-point) as usize), digits)
        } else if point as usize >= digits.len() {
            format!("{}{}.0", digits, "0".repeat(point as usize - digits.len()))
        } else {
            format!(
                "{}.{}",
                &digits[..point as usize],
                &digits[point as usize..]
            )
        };
        format!("{sign}{body}")
    } else {
        let m = if digits.len() > 1 {
            format!("{}.{}", &digits[..1], &digits[1..])
        } else {
            digits
        };
        format!(
            "{sign}{m}e{}{:02}",
            if exp < 0 { '-' } else { '+' },
            exp.abs()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(src: &str, extra: serde_json::Value) -> Result<String, TokenizerError> {
        let t = ChatTemplate::new(src, "<s>", "</s>", "test")?;
        let extra = extra.as_object().cloned().unwrap_or_default();
        t.render(&[ChatMessage::new("user", "Hi")], true, &extra)
    }

    #[test]
    fn python_float_repr() {
        // Expected strings are Python 3's repr() of the same floats.
        for (f, py) in [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (123456.789, "123456.789"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (-2.5, "-2.5"),
            (1.5e-7, "1.5e-07"),
            (0.0, "0.0"),
        ] {
            assert_eq!(python_float(f), py, "{f}");
        }
    }

    #[test]
    fn tojson_matches_python_json_dumps() {
        let extra =
            serde_json::json!({"x": {"b": [1, 2.5, "é<&>\"\n"], "a": null, "c": true, "d": {}}});
        assert_eq!(
            render("{{ x | tojson }}", extra.clone()).unwrap(),
            r#"{"b": [1, 2.5, "é<&>\"\n"], "a": null, "c": true, "d": {}}"#
        );
        assert_eq!(
            render("{{ x | tojson(indent=2, sort_keys=true) }}", extra.clone()).unwrap(),
            "{\n  \"a\": null,\n  \"b\": [\n    1,\n    2.5,\n    \"é<&>\\\"\\n\"\n  ],\n  \"c\": true,\n  \"d\": {}\n}"
        );
        assert_eq!(
            render("{{ 'é' | tojson(ensure_ascii=true) }}", extra).unwrap(),
            r#""\u00e9""#
        );
    }

    #[test]
    fn variables_methods_and_exceptions() {
        let src = "{{ bos_token }}{% for m in messages %}{{ m.role | upper }}:{{ m.content.strip() }}{% endfor %}\
                   {% if add_generation_prompt %}>{% endif %}{% if enable_thinking is defined and not enable_thinking %}!{% endif %}";
        assert_eq!(
            render(src, serde_json::json!({"enable_thinking": false})).unwrap(),
            "<s>USER:Hi>!"
        );
        assert_eq!(render(src, serde_json::json!({})).unwrap(), "<s>USER:Hi>");
        let e = render(
            "{{ raise_exception('roles must alternate') }}",
            serde_json::json!({}),
        )
        .unwrap_err();
        assert!(
            e.to_string().contains("roles must alternate") && e.to_string().contains("test"),
            "{e}"
        );
        let e = ChatTemplate::new("{% if %}", "", "", "broken.jinja").unwrap_err();
        assert!(e.to_string().contains("broken.jinja"), "{e}");
    }

    #[test]
    fn strftime_subset() {
        // Python: datetime.fromtimestamp(1796038107, timezone.utc).strftime(...) for each format.
        let t = 1_796_038_107;
        assert_eq!(strftime("%d %b %Y", t), "30 Nov 2026");
        assert_eq!(
            strftime("%A %B %j %H:%M:%S %y %m %a %%", t),
            "Monday November 334 11:28:27 26 11 Mon %"
        );
        assert_eq!(strftime("%d %b %Y", 951_782_400), "29 Feb 2000");
    }

    #[test]
    fn tools_default_to_none() {
        assert_eq!(
            render(
                "{{ tools is none }}/{{ documents is none }}",
                serde_json::json!({})
            )
            .unwrap(),
            "True/True"
        );
    }

    #[test]
    fn trim_and_lstrip_blocks() {
        let src = "{% for m in messages %}\n    {% if true %}\n[{{ m.content }}]\n    {% endif %}\n{% endfor %}\n";
        assert_eq!(render(src, serde_json::json!({})).unwrap(), "[Hi]\n");
    }

    /// The error of rendering `src` with one message, and how long it took.
    fn render_error(src: &str) -> (String, std::time::Duration) {
        let start = std::time::Instant::now();
        let e = render(src, serde_json::json!({})).unwrap_err().to_string();
        (e, start.elapsed())
    }

    #[test]
    fn one_call_cannot_build_a_huge_value_from_a_small_number() {
        // Each of these asked for gigabytes in one instruction (the first was a fuzz finding:
        // fuzz/crashes/chat_template/hang-10b9b7c1f1f90b1c); now each is a quick clear error.
        for (src, says) in [
            ("{{ '%4294967296s-%d' | format('a', 3) }}", "format string"),
            ("{{ '%.100000000f' | format(1.0) }}", "format string"),
            ("{{ '{:>4294967296}'.format('a') }}", "format string"),
            ("{{ 'a\nb' | indent(4294967296) }}", "indent wider"),
            ("{{ 'a\nb' | indent(width=100000) }}", "indent wider"),
            (
                "{{ [1] | batch(1000000000, fill_with=0) | list | length }}",
                "batch of",
            ),
            (
                "{{ [1, 2] | slice(1000000000) | list | length }}",
                "slice of",
            ),
            (
                "{{ ('a' * 10000000) | replace('a', 'a' * 100) | length }}",
                "over the limit",
            ),
            (
                "{{ ('a' * 10000000).replace('a', 'a' * 100) | length }}",
                "over the limit",
            ),
        ] {
            let (e, took) = render_error(src);
            assert!(e.contains(says), "{src}: {e}");
            assert!(took.as_secs() < 2, "{src}: {took:?}");
        }
        // The same filters and methods at sizes templates use answer as Jinja2 does.
        let ok = "{{ 'a\nb' | indent(2) }}|{{ 'a\nb' | indent(width=2, first=true) }}|\
                  {{ '%-5s|%.2f' | format('ab', 1.234) }}|{{ '{:>4}'.format('a') }}|\
                  {{ [1, 2, 3] | batch(2, fill_with=0) | list }}|{{ [1, 2, 3] | slice(2) | list }}|\
                  {{ 'aXb' | replace('X', 'yy') }}|{{ 'aXb'.replace('X', 'yy') }}";
        assert_eq!(
            render(ok, serde_json::json!({})).unwrap(),
            "a\n  b|  a\n  b|ab   |1.23|   a|[[1, 2], [3, 0]]|[[1, 2], [3]]|ayyb|ayyb"
        );
    }

    #[test]
    fn runaway_loops_run_out_of_fuel() {
        // minijinja refuses a range this long outright.
        let (e, _) = render_error("{% for i in range(10**9) %}x{% endfor %}");
        assert!(e.contains("range has too many elements"), "{e}");
        // 10^10 iterations writing nothing: only the fuel stops them.
        let (e, took) = render_error(
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        );
        assert!(e.contains("fuel"), "{e}");
        eprintln!("out of fuel after {took:?}");
        assert!(took.as_secs() < 10, "{took:?}");
    }

    #[test]
    fn huge_output_is_refused_at_the_limit() {
        for src in [
            // One instruction printing a billion items.
            "{{ ['a'] * 10**9 }}",
            // The same, captured into a variable instead of written out.
            "{% set x %}{{ ['a'] * 10**9 }}{% endset %}{{ x | length }}",
            // Within the fuel: 50000 x 100000 bytes of template text and values.
            "{% for i in range(50000) %}{{ 'b' * 100000 }}{% endfor %}",
        ] {
            let (e, took) = render_error(src);
            assert!(e.contains("over the limit"), "{src}: {e}");
            assert!(took.as_secs() < 10, "{src}: {took:?}");
        }
        for src in [
            "{{ messages | tojson(indent=10**9) }}",
            "{{ messages | tojson(indent='x' * 10**8) }}",
            "{{ messages | tojson(separators=['x' * 10**8, ':']) }}",
        ] {
            let (e, _) = render_error(src);
            assert!(e.contains("over the limit of 64"), "{src}: {e}");
        }
    }

    #[test]
    fn real_templates_use_a_small_share_of_the_fuel() {
        // The committed templates, 500 messages and a tool: each must use under 0.5% of the
        // budget, so a conversation that fits any context renders well within it.
        let fixture = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/tokenizer/chat_templates.json"
        );
        let all: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(fixture).unwrap()).unwrap();
        let messages: Vec<ChatMessage> = (0..500)
            .map(|i| ChatMessage::new(["user", "assistant"][i % 2], format!("message {i}")))
            .collect();
        let mut extra = Map::new();
        extra.insert("tools".into(), serde_json::json!([{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object", "properties": {"a": {"type": "string"}}}}}]));
        for case in all["templates"].as_array().unwrap() {
            let (name, src) = (
                case["name"].as_str().unwrap(),
                case["template"].as_str().unwrap(),
            );
            let t = ChatTemplate::new(src, "<s>", "</s>", name).unwrap();
            let template = t.env.get_template(NAME).unwrap();
            let mut ctx = extra.clone();
            ctx.insert("messages".into(), serde_json::to_value(&messages).unwrap());
            ctx.insert("add_generation_prompt".into(), true.into());
            let rendered = template.render_captured(&ctx).unwrap();
            let (used, _) = rendered.state().fuel_levels().unwrap();
            // Measured: 11515 (SmolLM2), 15785 (Qwen2.5-Coder), 9510 (Qwen3.5), ~30 a message.
            assert!(used < RENDER_FUEL / 200, "{name}: {used}");
        }
    }
}
