//! The parameter types of the request's tools, used to type the values of an XML tool call.
//!
//! The Qwen XML format writes every parameter value as bare text (`<parameter=n>\n3\n</parameter>`),
//! so `3` can be the number 3 or the string "3": only the tool's JSON schema says which.

use serde_json::{Map, Value as Json};
use std::collections::HashMap;

/// For each tool of the request, the JSON-schema types of its parameters.
#[derive(Clone, Debug, Default)]
pub struct ToolSchemas {
    /// tool name → parameter name → the types its schema allows, in the schema's order.
    params: HashMap<String, HashMap<String, Vec<String>>>,
}

impl ToolSchemas {
    /// Reads the OpenAI `tools` list (`[{"type": "function", "function": {"name", "parameters"}}]`,
    /// or bare `{"name", "parameters"}` entries). Entries it cannot read are skipped: their calls
    /// then keep every value as a string, which is never wrong text, only untyped.
    pub fn from_tools(tools: &[Json]) -> Self {
        let mut params = HashMap::new();
        for tool in tools {
            let function = tool.get("function").unwrap_or(tool);
            let Some(name) = function.get("name").and_then(Json::as_str) else {
                continue;
            };
            let properties = function
                .get("parameters")
                .and_then(|p| p.get("properties"))
                .and_then(Json::as_object);
            let types = properties
                .map(|props| {
                    props
                        .iter()
                        .map(|(k, schema)| (k.clone(), schema_types(schema)))
                        .collect()
                })
                .unwrap_or_default();
            params.insert(name.to_string(), types);
        }
        Self { params }
    }

    /// Checks the request's `tools` field: a list of `{"type": "function", "function": {"name":
    /// non-empty string, "parameters"?: object}}`. The error is one line naming the entry (the
    /// server answers it as a 400 on param `tools`).
    #[cfg(test)]
    pub fn check_request_tools(tools: &Json) -> Result<(), String> {
        let Some(list) = tools.as_array() else {
            return Err("tools: expected a list".into());
        };
        for (i, tool) in list.iter().enumerate() {
            if tool.get("type").and_then(Json::as_str) != Some("function") {
                return Err(format!("tools[{i}].type: expected \"function\""));
            }
            let Some(function) = tool.get("function").filter(|f| f.is_object()) else {
                return Err(format!("tools[{i}].function: expected an object"));
            };
            match function.get("name") {
                Some(Json::String(n)) if !n.is_empty() => {}
                _ => {
                    return Err(format!(
                        "tools[{i}].function.name: missing (a non-empty string)"
                    ))
                }
            }
            match function.get("parameters") {
                None | Some(Json::Null) | Some(Json::Object(_)) => {}
                Some(_) => {
                    return Err(format!(
                        "tools[{i}].function.parameters: expected an object"
                    ))
                }
            }
        }
        Ok(())
    }

    /// Whether the request declared a tool called `name`.
    #[cfg(test)]
    pub fn has_tool(&self, name: &str) -> bool {
        self.params.contains_key(name)
    }

    /// The value of parameter `param` of tool `tool` from its text: parsed as the schema's type
    /// when the text is one, else the text itself. Unknown tools and parameters, and parameters
    /// whose schema names no type, keep the text.
    pub fn typed_value(&self, tool: &str, param: &str, text: &str) -> Json {
        let types = self.params.get(tool).and_then(|p| p.get(param));
        let Some(types) = types else {
            return Json::String(text.to_string());
        };
        // A string type wins over the others only when it comes first; ["integer", "string"]
        // reads "3" as 3.
        for ty in types {
            if ty == "string" {
                break;
            }
            if let Some(v) = parse_as(ty, text) {
                return v;
            }
        }
        Json::String(text.to_string())
    }
}

/// The types a property schema allows: `type` (a string or a list), else the `type` of each
/// `anyOf` / `oneOf` alternative. Constrained calls write a value in the form this reading
/// expects (serve/tool_call_grammar.rs).
pub fn schema_types(schema: &Json) -> Vec<String> {
    let mut out = Vec::new();
    match schema.get("type") {
        Some(Json::String(t)) => out.push(t.clone()),
        Some(Json::Array(ts)) => out.extend(ts.iter().filter_map(Json::as_str).map(String::from)),
        _ => {
            for key in ["anyOf", "oneOf"] {
                for alt in schema
                    .get(key)
                    .and_then(Json::as_array)
                    .into_iter()
                    .flatten()
                {
                    out.extend(schema_types(alt));
                }
            }
        }
    }
    out
}

/// `text` as a value of JSON-schema type `ty`, or None when it is not one. Booleans and null
/// also accept Python's spelling, since the Qwen3.5 template renders history values with
/// Python's `str()` (`True`, `None`) and the model copies that.
fn parse_as(ty: &str, text: &str) -> Option<Json> {
    let t = text.trim();
    match ty {
        "boolean" => match t {
            "true" | "True" => Some(Json::Bool(true)),
            "false" | "False" => Some(Json::Bool(false)),
            _ => None,
        },
        "null" => matches!(t, "null" | "None").then_some(Json::Null),
        "integer" => match serde_json::from_str::<Json>(t).ok()? {
            Json::Number(n) if n.is_i64() || n.is_u64() => Some(Json::Number(n)),
            // 3.0 is an integer to JSON schema.
            Json::Number(n) => {
                let f = n.as_f64()?;
                (f.fract() == 0.0 && f.abs() < 9.0e15).then(|| Json::from(f as i64))
            }
            _ => None,
        },
        "number" => serde_json::from_str::<Json>(t).ok().filter(Json::is_number),
        "object" => serde_json::from_str::<Map<String, Json>>(t)
            .ok()
            .map(Json::Object),
        "array" => serde_json::from_str::<Vec<Json>>(t).ok().map(Json::Array),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn checks_the_request_tools() {
        let ok = json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},
                        {"type": "function", "function": {"name": "g"}}]);
        assert_eq!(ToolSchemas::check_request_tools(&ok), Ok(()));
        let cases = [
            (json!({}), "tools: expected a list"),
            (
                json!([{"function": {"name": "f"}}]),
                "tools[0].type: expected \"function\"",
            ),
            (
                json!([{"type": "function"}]),
                "tools[0].function: expected an object",
            ),
            (
                json!([{"type": "function", "function": {"name": ""}}]),
                "tools[0].function.name: missing (a non-empty string)",
            ),
            (
                json!([{"type": "function", "function": {"name": "f", "parameters": "x"}}]),
                "tools[0].function.parameters: expected an object",
            ),
        ];
        for (tools, want) in cases {
            assert_eq!(
                ToolSchemas::check_request_tools(&tools),
                Err(want.to_string()),
                "{tools}"
            );
        }
    }

    fn schemas() -> ToolSchemas {
        ToolSchemas::from_tools(&[
            json!({"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
                "s": {"type": "string"},
                "i": {"type": "integer"},
                "n": {"type": "number"},
                "b": {"type": "boolean"},
                "o": {"type": "object"},
                "a": {"type": "array", "items": {"type": "integer"}},
                "z": {"type": "null"},
                "maybe": {"type": ["integer", "null"]},
                "first_string": {"type": ["string", "integer"]},
                "any": {"anyOf": [{"type": "number"}, {"type": "string"}]},
                "untyped": {"description": "no type"},
            }}}}),
            json!({"name": "bare", "parameters": {"properties": {"k": {"type": "integer"}}}}),
            json!("not a tool"),
        ])
    }

    #[test]
    fn values_take_the_schema_type() {
        let s = schemas();
        let cases = [
            ("s", "42", json!("42")),
            ("s", " spaced \n", json!(" spaced \n")),
            ("i", "42", json!(42)),
            ("i", "-7", json!(-7)),
            ("i", "3.0", json!(3)),
            ("i", "3.5", json!("3.5")),
            ("i", "forty", json!("forty")),
            ("n", "2.5e3", json!(2500.0)),
            ("n", "NaN", json!("NaN")),
            ("b", "true", json!(true)),
            ("b", "False", json!(false)),
            ("b", "yes", json!("yes")),
            (
                "o",
                r#"{"x": [1, {"y": "é"}]}"#,
                json!({"x": [1, {"y": "é"}]}),
            ),
            ("o", "[1]", json!("[1]")),
            ("o", "{bad", json!("{bad")),
            ("a", "[1, 2]", json!([1, 2])),
            ("z", "None", json!(null)),
            ("maybe", "null", json!(null)),
            ("maybe", "5", json!(5)),
            ("first_string", "5", json!("5")),
            ("any", "5", json!(5)),
            ("any", "five", json!("five")),
            ("untyped", "5", json!("5")),
            ("unknown", "5", json!("5")),
        ];
        for (param, text, want) in cases {
            assert_eq!(s.typed_value("f", param, text), want, "{param} = {text:?}");
        }
        assert_eq!(s.typed_value("bare", "k", "1"), json!(1));
        assert_eq!(
            s.typed_value("f", "s", "  3\n"),
            json!("  3\n"),
            "strings verbatim"
        );
        assert_eq!(s.typed_value("nope", "i", "1"), json!("1"));
        assert!(s.has_tool("f") && s.has_tool("bare") && !s.has_tool("nope"));
    }
}
