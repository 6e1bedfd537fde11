//! The grammar of a forced tool call (`tool_choice` required or named), in llguidance's Lark
//! syntax, for the format the model's template teaches ([`ToolCallFormat`], the seam: one arm
//! per format). The server writes the call's opening `<tool_call>\n` into the prompt; the
//! grammar is the rest of the call: the name of one of the request's tools (or the named one),
//! its arguments valid against that tool's JSON schema, and the call's closing. After it only
//! an end-of-sequence token is allowed, so the reply is exactly one well-formed call.
//!
//! - Hermes JSON (Qwen3-Next): `{"name": "NAME", "arguments": ARGS}\n</tool_call>`, ARGS being
//!   the tool's `parameters` schema embedded as `%json {…}`.
//! - Qwen XML (Qwen3.5/3.6): `<function=NAME>\n` then `<parameter=KEY>\nVALUE\n</parameter>\n`
//!   per property (required ones always, in the schema's order), `</function>\n</tool_call>`.
//!   A value is written as the output parser reads it back ([`schema_types`]): bare text for a
//!   property that may be a string (an enum's strings as literals, `minLength`/`maxLength`
//!   kept; `pattern` and `format` are not enforced on bare text), JSON (`%json`) otherwise.

use super::structured_output::compact_json;
use crate::tool_calls::{schema_types, ToolCallFormat};
use serde_json::{Map, Value as Json};

/// The Lark grammar of one call to one of `tools` (OpenAI tool definitions; only `function`
/// when given).
pub fn tool_call_grammar(format: ToolCallFormat, tools: &[Json], function: Option<&str>) -> String {
    let chosen: Vec<(&str, Json)> = tools
        .iter()
        .map(|tool| tool.get("function").unwrap_or(tool))
        .filter_map(|f| Some((f.get("name")?.as_str()?, parameters(f))))
        .filter(|(name, _)| function.is_none_or(|wanted| wanted == *name))
        .collect();
    let mut rules = vec![];
    let calls: Vec<String> = chosen
        .iter()
        .enumerate()
        .map(|(i, (name, schema))| {
            let rule = format!("call_{i}");
            let body = match format {
                ToolCallFormat::HermesJson => hermes_json_call(name, schema),
                ToolCallFormat::QwenXml => qwen_xml_call(i, name, schema, &mut rules),
            };
            rules.push(format!("{rule}: {body}"));
            rule
        })
        .collect();
    let closing = match format {
        ToolCallFormat::HermesJson => "\n</tool_call>",
        ToolCallFormat::QwenXml => "</function>\n</tool_call>",
    };
    let mut grammar = format!("start: ({}) {}\n", calls.join(" | "), literal(closing));
    for rule in rules {
        grammar.push_str(&rule);
        grammar.push('\n');
    }
    grammar
}

/// A tool's `parameters` schema (any object when it has none).
fn parameters(function: &Json) -> Json {
    match function.get("parameters") {
        Some(schema @ Json::Object(_)) => schema.clone(),
        _ => serde_json::json!({"type": "object"}),
    }
}

/// A Lark string literal (Lark's strings are JSON strings).
fn literal(text: &str) -> String {
    Json::from(text).to_string()
}

/// `%json {…}`: a JSON document valid against `schema`, written compactly as the templates'
/// `tojson` writes it.
fn embedded_json(schema: &Json) -> String {
    format!("%json {}", compact_json(schema.clone()))
}

fn hermes_json_call(name: &str, schema: &Json) -> String {
    // The template writes the name as is (tool names are letters, digits, `_` and `-`).
    let head = format!("{{\"name\": \"{name}\", \"arguments\": ");
    format!("{} {} \"}}\"", literal(&head), embedded_json(schema))
}

fn qwen_xml_call(tool: usize, name: &str, schema: &Json, rules: &mut Vec<String>) -> String {
    let mut body = vec![literal(&format!("<function={name}>\n"))];
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Json::as_array)
        .into_iter()
        .flatten()
        .filter_map(Json::as_str)
        .collect();
    let empty = Map::new();
    let properties = schema
        .get("properties")
        .and_then(Json::as_object)
        .unwrap_or(&empty);
    for (p, (key, property)) in properties.iter().enumerate() {
        let rule = format!("param_{tool}_{p}");
        let value = xml_value(
            &format!("{tool}_{p}"),
            &with_definitions(property, schema),
            rules,
        );
        rules.push(format!(
            "{rule}: {} {value}",
            literal(&format!("<parameter={key}>\n"))
        ));
        let optional = if required.contains(&key.as_str()) {
            ""
        } else {
            "?"
        };
        body.push(format!("{rule}{optional}"));
    }
    body.join(" ")
}

/// A property's schema with the tool schema's `$defs` / `definitions`, so that a `$ref` in it
/// still resolves once it is embedded on its own.
fn with_definitions(property: &Json, tool_schema: &Json) -> Json {
    let mut property = property.clone();
    if let Some(object) = property.as_object_mut() {
        for key in ["$defs", "definitions"] {
            if let Some(defs) = tool_schema.get(key) {
                object.entry(key).or_insert_with(|| defs.clone());
            }
        }
    }
    property
}

/// The grammar of one XML parameter's value and its closing `\n</parameter>\n` (rules it
/// needs are added to `rules`); `id` makes its rule names unique.
fn xml_value(id: &str, schema: &Json, rules: &mut Vec<String>) -> String {
    const CLOSE: &str = "\n</parameter>\n";
    let types = schema_types(schema);
    let strings: Option<Vec<&str>> = schema
        .get("enum")
        .and_then(Json::as_array)
        .map(|values| values.iter().filter_map(Json::as_str).collect())
        .or_else(|| schema.get("const").and_then(Json::as_str).map(|c| vec![c]));
    if let Some(strings) = strings.filter(|s| !s.is_empty()) {
        let choices: Vec<String> = strings.iter().map(|s| literal(s)).collect();
        return format!("({}) {}", choices.join(" | "), literal(CLOSE));
    }
    if !types.is_empty() && !types.iter().any(|t| t == "string") {
        return format!("{} {}", embedded_json(schema), literal(CLOSE));
    }
    // Bare text: the parser reads it as a string. It never holds `</parameter>`, where the
    // parser could take the value to end.
    let length = |key: &str| schema.get(key).and_then(Json::as_u64);
    let min = length("minLength").unwrap_or(0);
    let max = length("maxLength").map_or(String::new(), |m| m.to_string());
    let terminal = format!("TEXT_{id}");
    rules.push(format!(
        "{terminal}: /(?s:.{{{min},{max}}})/ & ~/(?s:.*)<\\/parameter>(?s:.*)/"
    ));
    let rule = format!("text_{id}");
    rules.push(format!("{rule}[suffix={}]: {terminal}", literal(CLOSE)));
    rule
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::constraint::LogitsConstraint;
    use crate::serve::structured_output::Grammars;
    use serde_json::json;
    use std::path::PathBuf;

    fn model(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../models")
            .join(name)
    }

    fn tools() -> Vec<Json> {
        let weather = json!({"type": "object", "properties": {
            "city": {"type": "string", "minLength": 1, "maxLength": 12},
            "days": {"type": "integer", "minimum": 1, "maximum": 7},
            "unit": {"enum": ["celsius", "fahrenheit"]},
            "where": {"type": "object", "properties": {"zip": {"$ref": "#/$defs/zip"}},
                      "required": ["zip"], "additionalProperties": false}},
            "required": ["city", "days"], "additionalProperties": false,
            "$defs": {"zip": {"type": "integer", "minimum": 1000, "maximum": 9999}}});
        vec![
            json!({"type": "function", "function": {"name": "get_weather", "parameters": weather}}),
            json!({"type": "function", "function": {"name": "ping"}}),
        ]
    }

    /// Whether the constraint of `grammar` lets the model write `text` (as the model's
    /// tokenizer splits it) and then end.
    fn accepts(model_dir: &str, grammar: &str, text: &str) -> bool {
        let dir = model(model_dir);
        let tokenizer = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
        let eos = tokenizer.token_to_id("<|im_end|>").unwrap();
        let grammars = Grammars::new(&dir, &[eos]).unwrap();
        let mut constraint = grammars
            .tool_call_constraint(grammar.to_string())
            .unwrap_or_else(|e| panic!("{grammar}: {e:?}"));
        let allowed = |c: &mut dyn LogitsConstraint, token: u32| {
            let words = c.allowed().unwrap();
            words[token as usize / 32] & (1 << (token % 32)) != 0
        };
        let ids = tokenizer.encode(text, false).unwrap().get_ids().to_vec();
        for id in ids {
            if !allowed(&mut constraint, id) {
                return false;
            }
            constraint.accept(id).unwrap();
        }
        allowed(&mut constraint, eos)
    }

    /// Panics unless `grammar` lets the model write each of `good` and none of `bad`.
    fn check(model_dir: &str, grammar: &str, good: &[String], bad: &[String]) {
        for text in good {
            assert!(
                accepts(model_dir, grammar, text),
                "{grammar}\nrefused: {text:?}"
            );
        }
        for text in bad {
            assert!(!accepts(model_dir, grammar, text), "accepted: {text:?}");
        }
    }

    #[test]
    fn qwen_xml_calls_follow_the_tools_schemas() {
        let g = tool_call_grammar(ToolCallFormat::QwenXml, &tools(), None);
        let call =
            |params: &str| format!("<function=get_weather>\n{params}</function>\n</tool_call>");
        let p = |k: &str, v: &str| format!("<parameter={k}>\n{v}\n</parameter>\n");
        let good = [
            call(&(p("city", "Paris <Nord>") + &p("days", "3"))),
            call(
                &(p("city", "a\nb")
                    + &p("days", "7")
                    + &p("unit", "celsius")
                    + &p("where", "{\"zip\": 1234}")),
            ),
            "<function=ping>\n</function>\n</tool_call>".to_string(),
        ];
        let bad = [
            call(&p("days", "3")),                             // city is required
            call(&(p("city", "Paris") + &p("days", "9"))),     // over the maximum
            call(&(p("city", "Paris") + &p("days", "three"))), // not an integer
            call(&(p("city", "") + &p("days", "3"))),          // under minLength
            call(&(p("city", "Llanfairpwllgwyngyll") + &p("days", "3"))), // over maxLength
            call(&(p("city", "Paris") + &p("days", "3") + &p("unit", "kelvin"))),
            call(&(p("city", "Paris") + &p("days", "3") + &p("where", "{\"zip\": 12}"))),
            call(&(p("city", "a</parameter>") + &p("days", "3"))),
            call(&(p("city", "Paris") + &p("days", "3") + &p("extra", "1"))),
            "<function=get_time>\n</function>\n</tool_call>".to_string(),
            call(&(p("city", "Paris") + &p("days", "3"))) + "\n<tool_call>",
        ];
        check("qwen3.5-tiny-4bit", &g, &good, &bad);
        // Named: only that tool.
        let g = tool_call_grammar(ToolCallFormat::QwenXml, &tools(), Some("ping"));
        assert!(accepts("qwen3.5-tiny-4bit", &g, &good[2]));
        assert!(!accepts("qwen3.5-tiny-4bit", &g, &good[0]));
    }

    #[test]
    fn hermes_json_calls_follow_the_tools_schemas() {
        let g = tool_call_grammar(ToolCallFormat::HermesJson, &tools(), None);
        let call = |name: &str, args: &str| {
            format!("{{\"name\": \"{name}\", \"arguments\": {args}}}\n</tool_call>")
        };
        let good = [
            call("get_weather", r#"{"city": "Paris", "days": 3}"#),
            call(
                "get_weather",
                r#"{"city": "Pa\"ris", "days": 1, "unit": "fahrenheit", "where": {"zip": 1000}}"#,
            ),
            call("ping", "{}"),
        ];
        let bad = [
            call("get_weather", r#"{"days": 3}"#),
            call("get_weather", r#"{"city": "Paris", "days": 0}"#),
            call("get_weather", r#"{"city": "Paris", "days": 3, "x": 1}"#),
            call(
                "get_weather",
                r#"{"city": "Paris", "days": 3, "where": {"zip": 99}}"#,
            ),
            call("get_time", "{}"),
            r#"{"arguments": {}, "name": "ping"}"#.to_string() + "\n</tool_call>",
        ];
        check("qwen3-next-tiny-4bit", &g, &good, &bad);
        let g = tool_call_grammar(ToolCallFormat::HermesJson, &tools(), Some("get_weather"));
        assert!(accepts("qwen3-next-tiny-4bit", &g, &good[0]));
        assert!(!accepts("qwen3-next-tiny-4bit", &g, &good[2]));
    }
}
