//! The Hermes tool-call body that the Qwen3-Next templates ask for:
//! `<tool_call>\n{"name": "f", "arguments": {"k": 1}}\n</tool_call>`.

use super::call_body::{BodyError, CallBody};
use serde_json::{Map, Value as Json};

/// Reads `{"name": …, "arguments": {…}}` (`parameters` is accepted for `arguments`, and
/// arguments given as a JSON string holding an object are unwrapped; missing arguments are `{}`).
pub fn parse_hermes_call(body: &str) -> Result<CallBody, BodyError> {
    let value: Json = match serde_json::from_str(body.trim()) {
        Ok(v) => v,
        // Cut off inside the object (or inside a string that contains `</tool_call>`).
        Err(e) if e.is_eof() => return Err(BodyError::Unterminated),
        Err(_) => return Err(BodyError::Malformed),
    };
    let Json::Object(mut call) = value else {
        return Err(BodyError::Malformed);
    };
    let name = match call.remove("name") {
        Some(Json::String(name)) if !name.trim().is_empty() => name.trim().to_string(),
        _ => return Err(BodyError::Malformed),
    };
    let arguments = match call
        .remove("arguments")
        .or_else(|| call.remove("parameters"))
    {
        None | Some(Json::Null) => Map::new(),
        Some(Json::Object(args)) => args,
        Some(Json::String(s)) if s.trim().is_empty() => Map::new(),
        Some(Json::String(s)) => {
            serde_json::from_str::<Map<String, Json>>(&s).map_err(|_| BodyError::Malformed)?
        }
        Some(_) => return Err(BodyError::Malformed),
    };
    Ok(CallBody { name, arguments })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_name_and_arguments() {
        let ok = |body: &str| {
            let c = parse_hermes_call(body).unwrap();
            (c.name, Json::Object(c.arguments))
        };
        assert_eq!(
            ok("\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"n\": [1, {\"x\": null}]}}\n"),
            ("get_weather".into(), json!({"city": "Paris", "n": [1, {"x": null}]}))
        );
        assert_eq!(ok(r#"{"name": "f"}"#), ("f".into(), json!({})));
        assert_eq!(
            ok(r#"{"name": "f", "parameters": {"a": 1}}"#),
            ("f".into(), json!({"a": 1}))
        );
        assert_eq!(
            ok(r#"{"name": "f", "arguments": "{\"a\": \"</tool_call>\"}"}"#),
            ("f".into(), json!({"a": "</tool_call>"}))
        );
    }

    #[test]
    fn tells_unfinished_from_malformed() {
        use BodyError::*;
        let cases = [
            (r#"{"name": "f", "arguments": {"s": "a"#, Unterminated),
            (r#"{"name": "f""#, Unterminated),
            (r#"{"name": "f", "arguments": {}} trailing"#, Malformed),
            (r#"{"name": "", "arguments": {}}"#, Malformed),
            (r#"{"name": 3, "arguments": {}}"#, Malformed),
            (r#"{"name": "f", "arguments": [1]}"#, Malformed),
            (r#"{"name": "f", "arguments": "not json"}"#, Malformed),
            (r#"{name: f}"#, Malformed),
            ("[1, 2]", Malformed),
        ];
        for (body, want) in cases {
            assert_eq!(parse_hermes_call(body), Err(want), "{body}");
        }
    }
}
