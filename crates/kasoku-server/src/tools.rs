//! Tools on the prompt side: how the model's chat template writes tool calls, the messages
//! and template variables of a request with tools, and the grammar that enforces
//! `tool_choice: required` or a named function.
//!
//! Templates with a tool section get the tools as the `tools` variable and the history as it
//! is (Qwen2.5/Qwen3's Hermes tags, Llama 3's JSON). For a template without one, kasoku's
//! generic fallback describes the tools in a system message and asks for Hermes tags; earlier
//! calls and results are written into the history as text in that format.

use serde_json::{json, Map, Value};

use kasoku_grammar::{GrammarSpec, ToolCallFormat, ToolSpec};

use crate::request::{Tool, ToolChoice};
use crate::tool_calls::ToolSyntax;

/// How a template's model writes tool calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TemplateTools {
    /// `<tool_call>{...}</tool_call>` (Qwen2.5, Qwen3, Hermes).
    Hermes,
    /// A bare `{"name": ..., "parameters": ...}` answer (Llama 3.1+).
    Llama3,
    /// No tool section: kasoku's generic fallback.
    Generic,
}

impl TemplateTools {
    pub fn of(template_source: &str) -> TemplateTools {
        if template_source.contains("<tool_call>") {
            TemplateTools::Hermes
        } else if template_source.contains("<|python_tag|>")
            || (template_source.contains("<|start_header_id|>")
                && template_source.contains("\"parameters\""))
        {
            TemplateTools::Llama3
        } else {
            TemplateTools::Generic
        }
    }

    /// What the output parser looks for.
    pub fn syntax(self) -> ToolSyntax {
        match self {
            TemplateTools::Hermes | TemplateTools::Generic => ToolSyntax::hermes(),
            TemplateTools::Llama3 => ToolSyntax::BareJson,
        }
    }

    fn format(self) -> ToolCallFormat {
        match self {
            TemplateTools::Hermes | TemplateTools::Generic => ToolCallFormat::hermes(),
            TemplateTools::Llama3 => ToolCallFormat::llama3_json(),
        }
    }
}

/// What a request with tools changes.
#[derive(Debug, Default)]
pub struct ToolPlan {
    /// Parse calls out of the answer with this syntax.
    pub syntax: Option<ToolSyntax>,
    /// Enforce calls with this grammar.
    pub grammar: Option<GrammarSpec>,
}

/// Prepares `messages` and `kwargs` (the template's variables) for `tools`, and says how the
/// answer is parsed and constrained. `tool_choice: none` shows no tools and parses nothing.
pub fn plan(
    style: TemplateTools,
    tools: &[Tool],
    choice: &ToolChoice,
    parallel: bool,
    messages: &mut Vec<Value>,
    kwargs: &mut Map<String, Value>,
) -> ToolPlan {
    let has_history = messages
        .iter()
        .any(|m| m["role"] == "tool" || m.get("tool_calls").is_some());
    if style == TemplateTools::Generic && has_history {
        history_as_text(messages);
    }
    if tools.is_empty() || *choice == ToolChoice::None {
        return ToolPlan::default();
    }
    match style {
        TemplateTools::Generic => add_system(messages, &generic_instructions(tools)),
        _ => {
            kwargs.insert(
                "tools".into(),
                Value::Array(tools.iter().map(Tool::to_openai).collect()),
            );
        }
    }
    let grammar = match choice {
        ToolChoice::Auto | ToolChoice::None => None,
        ToolChoice::Required => Some(GrammarSpec::ToolCalls {
            tools: tools.iter().map(spec).collect(),
            format: style.format(),
            parallel,
        }),
        ToolChoice::Named(name) => Some(GrammarSpec::ToolCalls {
            tools: tools.iter().filter(|t| &t.name == name).map(spec).collect(),
            format: style.format(),
            parallel: false,
        }),
    };
    ToolPlan {
        syntax: Some(style.syntax()),
        grammar,
    }
}

fn spec(t: &Tool) -> ToolSpec {
    ToolSpec {
        name: t.name.clone(),
        parameters: t.parameters.clone(),
    }
}

/// Adds `text` to the system message (first), or makes one.
pub fn add_system(messages: &mut Vec<Value>, text: &str) {
    match messages.first_mut() {
        Some(first) if first["role"] == "system" => {
            let content = first["content"].as_str().unwrap_or_default();
            first["content"] = Value::String(if content.is_empty() {
                text.to_string()
            } else {
                format!("{content}\n\n{text}")
            });
        }
        _ => messages.insert(0, json!({"role": "system", "content": text})),
    }
}

fn generic_instructions(tools: &[Tool]) -> String {
    let list: Vec<String> = tools.iter().map(|t| t.to_openai().to_string()).collect();
    format!(
        "You can call these tools (JSON Schema of each function's arguments):\n{}\n\n\
         To call one, answer with\n<tool_call>\n{{\"name\": \"<function name>\", \"arguments\": {{<arguments as JSON>}}}}\n</tool_call>\n\
         and nothing else; several calls go one after another. Results come back as \
         <tool_response> messages.",
        list.join("\n")
    )
}

/// For a template without tools: earlier calls become assistant text in the Hermes format,
/// tool results user messages in `<tool_response>` tags.
fn history_as_text(messages: &mut [Value]) {
    for m in messages.iter_mut() {
        if m["role"] == "tool" {
            let content = m["content"].as_str().unwrap_or_default();
            *m = json!({
                "role": "user",
                "content": format!("<tool_response>\n{content}\n</tool_response>"),
            });
        } else if let Some(Value::Array(calls)) =
            m.as_object_mut().and_then(|o| o.remove("tool_calls"))
        {
            let mut text = m["content"].as_str().unwrap_or_default().to_string();
            for c in calls {
                let call =
                    json!({"name": c["function"]["name"], "arguments": c["function"]["arguments"]});
                if !text.is_empty() {
                    text.push('\n');
                }
                text.push_str(&format!("<tool_call>\n{call}\n</tool_call>"));
            }
            m["content"] = Value::String(text);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> Tool {
        Tool {
            name: "get_weather".into(),
            description: Some("Weather of a city".into()),
            parameters: Some(json!({"type": "object", "properties": {"city": {"type": "string"}}})),
        }
    }

    #[test]
    fn template_styles() {
        assert_eq!(
            TemplateTools::of("{{- '<tool_call>\\n' }}{{ tools }}"),
            TemplateTools::Hermes
        );
        assert_eq!(
            TemplateTools::of("<|start_header_id|>{{ '\"parameters\": ' }}"),
            TemplateTools::Llama3
        );
        assert_eq!(
            TemplateTools::of("{% for m in messages %}{{ m.content }}{% endfor %}"),
            TemplateTools::Generic
        );
    }

    #[test]
    fn plans_by_choice_and_template() {
        let tools = [weather()];
        let mut messages = vec![json!({"role": "user", "content": "hi"})];
        let mut kwargs = Map::new();
        let p = plan(
            TemplateTools::Hermes,
            &tools,
            &ToolChoice::Required,
            true,
            &mut messages,
            &mut kwargs,
        );
        assert_eq!(kwargs["tools"][0]["function"]["name"], "get_weather");
        assert_eq!(messages.len(), 1);
        assert!(matches!(
            p.grammar,
            Some(GrammarSpec::ToolCalls { parallel: true, .. })
        ));
        assert_eq!(p.syntax, Some(ToolSyntax::hermes()));
        // none: no tools shown, nothing parsed.
        let mut kwargs = Map::new();
        let p = plan(
            TemplateTools::Hermes,
            &tools,
            &ToolChoice::None,
            true,
            &mut messages,
            &mut kwargs,
        );
        assert!(p.syntax.is_none() && p.grammar.is_none() && kwargs.is_empty());
        // auto: parsed, not enforced.
        let p = plan(
            TemplateTools::Llama3,
            &tools,
            &ToolChoice::Auto,
            true,
            &mut messages,
            &mut Map::new(),
        );
        assert_eq!(p.syntax, Some(ToolSyntax::BareJson));
        assert!(p.grammar.is_none());
    }

    #[test]
    fn the_generic_fallback_writes_tools_and_history_as_text() {
        let mut messages = vec![
            json!({"role": "system", "content": "Be brief."}),
            json!({"role": "user", "content": "Weather?"}),
            json!({"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}),
            json!({"role": "tool", "tool_call_id": "c1", "content": "sunny"}),
        ];
        let mut kwargs = Map::new();
        let p = plan(
            TemplateTools::Generic,
            &[weather()],
            &ToolChoice::Named("get_weather".into()),
            true,
            &mut messages,
            &mut kwargs,
        );
        assert!(kwargs.is_empty());
        let system = messages[0]["content"].as_str().unwrap();
        assert!(
            system.starts_with("Be brief.\n\nYou can call these tools"),
            "{system}"
        );
        assert!(system.contains("\"get_weather\""));
        assert_eq!(
            messages[2],
            json!({"role": "assistant", "content": "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}\n</tool_call>"})
        );
        assert_eq!(messages[3]["role"], "user");
        assert_eq!(
            messages[3]["content"],
            "<tool_response>\nsunny\n</tool_response>"
        );
        let Some(GrammarSpec::ToolCalls {
            tools, parallel, ..
        }) = p.grammar
        else {
            panic!("named choice: a grammar")
        };
        assert_eq!((tools.len(), parallel), (1, false));
    }
}
