//! Grammars over the tiny Qwen2 fixture's byte-level vocabulary (357 tokens, 384 logits).

use serde_json::{json, Value};

use kasoku::constraint::TokenConstraint;
use kasoku::tokenizer::Tokenizer;

use super::*;

const VOCAB: usize = 384;

fn tokenizer() -> Tokenizer {
    Tokenizer::from_hf_dir(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/qwen2/tiny"
    ))
    .unwrap()
}

fn grammars(tok: &Tokenizer) -> Grammars {
    Grammars::new(tok, VOCAB, tok.eos_ids()).unwrap()
}

/// Feeds `text`'s tokens; returns how many the grammar took before refusing one, and
/// whether a stop token was allowed after the last one taken.
fn walk(c: &mut dyn TokenConstraint, tok: &Tokenizer, text: &str) -> (usize, bool) {
    let ids = tok.encode(text, false).unwrap();
    for (i, &id) in ids.iter().enumerate() {
        if !c.mask().unwrap().is_allowed(id) {
            return (i, false);
        }
        c.advance(id).unwrap();
    }
    let stop = tok.eos_ids()[0];
    (ids.len(), c.mask().unwrap().is_allowed(stop))
}

fn accepts(g: &Grammars, spec: &GrammarSpec, tok: &Tokenizer, text: &str) -> bool {
    let mut c = g.matcher(spec).unwrap();
    let n = tok.encode(text, false).unwrap().len();
    walk(&mut c, tok, text) == (n, true)
}

#[test]
fn json_object_and_schema_accept_valid_and_refuse_invalid_answers() {
    let tok = tokenizer();
    let g = grammars(&tok);
    let object = GrammarSpec::JsonObject;
    assert!(accepts(
        &g,
        &object,
        &tok,
        r#"{"a": [1, 2.5, {"b": null}], "c": "x"}"#
    ));
    assert!(!accepts(&g, &object, &tok, r#"Sure: {"a": 1}"#));
    assert!(!accepts(&g, &object, &tok, r#"[1, 2]"#));
    // Not finished: no stop token yet.
    assert!(!accepts(&g, &object, &tok, r#"{"a": 1"#));
    let schema = GrammarSpec::JsonSchema {
        schema: json!({
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "age": {"type": "integer", "minimum": 0},
                "tags": {"type": "array", "items": {"enum": ["a", "b"]}}
            },
            "required": ["name", "age"],
            "additionalProperties": false
        }),
        strict: true,
    };
    assert!(accepts(&g, &schema, &tok, r#"{"name": "Ada", "age": 36}"#));
    assert!(accepts(
        &g,
        &schema,
        &tok,
        "{\n  \"name\": \"Ada\",\n  \"age\": 36,\n  \"tags\": [\"b\"]\n}"
    ));
    assert!(
        !accepts(&g, &schema, &tok, r#"{"name": "Ada"}"#),
        "age is required"
    );
    assert!(!accepts(&g, &schema, &tok, r#"{"name": "Ada", "age": -1}"#));
    assert!(!accepts(
        &g,
        &schema,
        &tok,
        r#"{"name": "Ada", "age": 3, "x": 1}"#
    ));
    assert!(!accepts(
        &g,
        &schema,
        &tok,
        r#"{"name": "Ada", "age": 3, "tags": ["c"]}"#
    ));
}

/// Sampling under the mask from arbitrary logits always ends in an answer valid against the
/// schema, whatever the model prefers.
#[test]
fn any_walk_under_the_mask_ends_in_a_valid_answer() {
    let tok = tokenizer();
    let g = grammars(&tok);
    let schema = json!({
        "type": "object",
        "properties": {
            "color": {"enum": ["red", "green"]},
            "n": {"type": "integer", "minimum": 0, "maximum": 999},
            "ok": {"type": "boolean"}
        },
        "required": ["color", "n", "ok"],
        "additionalProperties": false
    });
    let constraint = g
        .compile(&GrammarSpec::JsonSchema {
            schema,
            strict: true,
        })
        .unwrap();
    let stops = tok.eos_ids();
    for seed in 0..20u64 {
        let mut c = constraint.start();
        let mut ids = Vec::new();
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let finished = (0..300).any(|_| {
            let mask = c.mask().unwrap();
            if stops.iter().any(|&s| mask.is_allowed(s)) {
                return true;
            }
            // xorshift: a random allowed token.
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let allowed: Vec<u32> = mask.allowed().collect();
            let t = allowed[(x % allowed.len() as u64) as usize];
            c.advance(t).unwrap();
            ids.push(t);
            false
        });
        let text = tok.decode(&ids);
        assert!(finished, "seed {seed}: no end after 300 tokens: {text}");
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert!(
            ["red", "green"].contains(&v["color"].as_str().unwrap()),
            "{text}"
        );
        assert!(v["n"].as_u64().unwrap() <= 999, "{text}");
        assert!(v["ok"].is_boolean(), "{text}");
    }
}

#[test]
fn schemas_that_cannot_be_enforced_say_why() {
    let tok = tokenizer();
    let g = grammars(&tok);
    let bad = [
        json!({"type": "object", "properties": {"a": {"type": "strin"}}}),
        json!({"$ref": "#/$defs/missing"}),
        json!({"type": "string", "pattern": "(unclosed"}),
        json!([1, 2]),
    ];
    for schema in bad {
        let e = g
            .compile(&GrammarSpec::JsonSchema {
                schema: schema.clone(),
                strict: true,
            })
            .expect_err(&schema.to_string());
        assert!(
            matches!(e, GrammarError::Unsupported(ref m) if !m.is_empty()),
            "{e}"
        );
    }
    // Local references are enforced.
    let with_defs = GrammarSpec::JsonSchema {
        schema: json!({
            "$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"], "additionalProperties": false}},
            "type": "object",
            "properties": {"p": {"$ref": "#/$defs/point"}},
            "required": ["p"],
            "additionalProperties": false
        }),
        strict: true,
    };
    assert!(accepts(&g, &with_defs, &tok, r#"{"p": {"x": 1}}"#));
    assert!(!accepts(&g, &with_defs, &tok, r#"{"p": {"y": 1}}"#));
}

#[test]
fn tool_calls_follow_the_format_and_the_argument_schemas() {
    let tok = tokenizer();
    let g = grammars(&tok);
    let tools = vec![
        ToolSpec {
            name: "get_weather".into(),
            parameters: Some(json!({
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"]
            })),
        },
        ToolSpec {
            name: "now".into(),
            parameters: None,
        },
    ];
    let one = GrammarSpec::ToolCalls {
        tools: tools.clone(),
        format: ToolCallFormat::hermes(),
        parallel: false,
    };
    let call = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    assert!(accepts(&g, &one, &tok, call));
    assert!(accepts(
        &g,
        &one,
        &tok,
        "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>"
    ));
    assert!(!accepts(
        &g,
        &one,
        &tok,
        "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>"
    ));
    assert!(
        !accepts(
            &g,
            &one,
            &tok,
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>"
        ),
        "city is required"
    );
    assert!(!accepts(&g, &one, &tok, "I will call it."));
    let two = format!("{call}\n{call}");
    assert!(!accepts(&g, &one, &tok, &two), "one call only");
    let parallel = GrammarSpec::ToolCalls {
        tools,
        format: ToolCallFormat::hermes(),
        parallel: true,
    };
    assert!(accepts(&g, &parallel, &tok, &two));
    // Llama 3's bare JSON.
    let llama = GrammarSpec::ToolCalls {
        tools: vec![ToolSpec {
            name: "f".into(),
            parameters: None,
        }],
        format: ToolCallFormat::llama3_json(),
        parallel: true,
    };
    assert!(accepts(
        &g,
        &llama,
        &tok,
        r#"{"name": "f", "parameters": {"a": 1}}; {"name": "f", "parameters": {}}"#
    ));
}

#[test]
fn a_fork_walks_on_its_own() {
    let tok = tokenizer();
    let g = grammars(&tok);
    let mut a = g.matcher(&GrammarSpec::JsonObject).unwrap();
    let (n, _) = walk(&mut a, &tok, r#"{"k": "#);
    assert!(n > 0);
    let mut b = a.fork();
    assert!(walk(&mut *b, &tok, r#"1}"#).1);
    // The original has not moved: it still needs a value.
    assert!(walk(&mut a, &tok, r#""v"}"#).1);
}
