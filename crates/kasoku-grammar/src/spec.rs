//! What a request constrains its answer to, and the llguidance grammar for it.

use llguidance::api::TopLevelGrammar;
use serde_json::{json, Value};

use super::GrammarError;

/// JSON whitespace the grammars allow between tokens: what models write when they indent,
/// bounded so that a model cannot fill its answer with blanks.
const WHITESPACE: &str = r"[\x20\x0A\x0D\x09]{0,48}";

/// One callable function: its name and the JSON Schema of its arguments.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolSpec {
    pub name: String,
    /// `None` (or `{}`): any JSON object.
    pub parameters: Option<Value>,
}

/// How the model writes a call: `open` + `{"name": ..., "<arguments_key>": {...}}` + `close`
/// (Hermes: `<tool_call>\n`, `\n</tool_call>`, `arguments`), several joined by `separator`.
/// Bare JSON (Llama 3) has empty tags, `parameters` and `; `.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCallFormat {
    pub open: String,
    pub close: String,
    pub arguments_key: String,
    pub separator: String,
}

impl ToolCallFormat {
    pub fn hermes() -> ToolCallFormat {
        ToolCallFormat {
            open: "<tool_call>\n".into(),
            close: "\n</tool_call>".into(),
            arguments_key: "arguments".into(),
            separator: "\n".into(),
        }
    }

    pub fn llama3_json() -> ToolCallFormat {
        ToolCallFormat {
            open: String::new(),
            close: String::new(),
            arguments_key: "parameters".into(),
            separator: "; ".into(),
        }
    }
}

/// A request's constraint on its answer.
#[derive(Clone, Debug, PartialEq)]
pub enum GrammarSpec {
    /// `response_format: json_object`: one JSON object.
    JsonObject,
    /// `response_format: json_schema`. `strict`: refuse what cannot be enforced exactly; else
    /// unsupported keywords are ignored (the rest is still enforced).
    JsonSchema { schema: Value, strict: bool },
    /// `tool_choice: required` or a named function: the answer is one call (or, with
    /// `parallel`, one or more) of these tools, arguments valid against their schemas.
    ToolCalls {
        tools: Vec<ToolSpec>,
        format: ToolCallFormat,
        parallel: bool,
    },
    /// A grammar in llguidance's Lark dialect.
    Lark(String),
}

impl GrammarSpec {
    pub(crate) fn to_grammar(&self) -> Result<TopLevelGrammar, GrammarError> {
        Ok(match self {
            GrammarSpec::JsonObject => {
                TopLevelGrammar::from_json_schema(with_options(json!({"type": "object"}), false))
            }
            GrammarSpec::JsonSchema { schema, strict } => {
                if !(schema.is_object() || schema.is_boolean()) {
                    return Err(GrammarError::Unsupported(
                        "the JSON schema must be an object".into(),
                    ));
                }
                TopLevelGrammar::from_json_schema(with_options(schema.clone(), !strict))
            }
            GrammarSpec::ToolCalls {
                tools,
                format,
                parallel,
            } => TopLevelGrammar::from_lark(tool_calls_lark(tools, format, *parallel)?),
            GrammarSpec::Lark(text) => TopLevelGrammar::from_lark(text.clone()),
        })
    }
}

/// The schema with kasoku's JSON options (whitespace, leniency) unless it sets its own.
fn with_options(schema: Value, lenient: bool) -> Value {
    let Value::Object(mut map) = schema else {
        return schema;
    };
    let options = map
        .entry("x-guidance")
        .or_insert_with(|| json!({}))
        .as_object_mut()
        .map(|o| {
            o.entry("whitespace_pattern").or_insert(json!(WHITESPACE));
            o.entry("lenient").or_insert(json!(lenient));
        });
    if options.is_none() {
        map.insert(
            "x-guidance".into(),
            json!({"whitespace_pattern": WHITESPACE, "lenient": lenient}),
        );
    }
    Value::Object(map)
}

/// A Lark grammar: `open body close`, repeated with `separator` when `parallel`, where `body`
/// is one tool's call object (its name first, then its arguments).
fn tool_calls_lark(
    tools: &[ToolSpec],
    format: &ToolCallFormat,
    parallel: bool,
) -> Result<String, GrammarError> {
    if tools.is_empty() {
        return Err(GrammarError::Unsupported(
            "tool calls need at least one tool".into(),
        ));
    }
    let calls: Vec<Value> = tools
        .iter()
        .map(|t| {
            let parameters = match &t.parameters {
                None => json!({"type": "object"}),
                Some(Value::Object(o)) if o.is_empty() => json!({"type": "object"}),
                Some(p) => p.clone(),
            };
            let mut properties = serde_json::Map::new();
            properties.insert("name".into(), json!({"const": t.name}));
            properties.insert(format.arguments_key.clone(), parameters);
            json!({
                "type": "object",
                "properties": properties,
                "required": ["name", format.arguments_key],
                "additionalProperties": false,
            })
        })
        .collect();
    let schema = with_options(
        if calls.len() == 1 {
            calls[0].clone()
        } else {
            json!({"anyOf": calls})
        },
        false,
    );
    let literal = |s: &str| serde_json::to_string(s).expect("strings serialize");
    let mut call = String::new();
    if !format.open.is_empty() {
        call.push_str(&literal(&format.open));
        call.push(' ');
    }
    call.push_str("body");
    if !format.close.is_empty() {
        call.push(' ');
        call.push_str(&literal(&format.close));
    }
    let start = if parallel {
        format!("start: call ({} call)*", literal(&format.separator))
    } else {
        "start: call".to_string()
    };
    Ok(format!("{start}\ncall: {call}\nbody: %json {schema}\n"))
}
