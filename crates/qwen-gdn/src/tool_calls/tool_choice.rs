//! The request's `tool_choice`: whether tool calls are recognised, and whether one is required.

use serde_json::Value as Json;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model decides (OpenAI's default when tools are given).
    Auto,
    /// No calls: the output is all content, even if it looks like a call.
    None,
    /// The model must call some tool.
    Required,
    /// The model must call this function.
    Function(String),
}

impl ToolChoice {
    /// Reads `tool_choice` (absent or null is `auto`): `"auto"`, `"none"`, `"required"`, or
    /// `{"type": "function", "function": {"name": …}}`. The error names the problem in one line
    /// (the server answers it as a 400 on param `tool_choice`).
    pub fn from_request(value: Option<&Json>) -> Result<Self, String> {
        match value {
            None | Some(Json::Null) => Ok(Self::Auto),
            Some(Json::String(s)) => match s.as_str() {
                "auto" => Ok(Self::Auto),
                "none" => Ok(Self::None),
                "required" => Ok(Self::Required),
                other => Err(format!(
                    "tool_choice: unknown value {other:?} (expected \"auto\", \"none\", \"required\" or a function)"
                )),
            },
            Some(Json::Object(o)) => {
                if o.get("type").and_then(Json::as_str) != Some("function") {
                    return Err("tool_choice: an object must have \"type\": \"function\"".into());
                }
                match o.get("function").and_then(|f| f.get("name")).and_then(Json::as_str) {
                    Some(name) if !name.is_empty() => Ok(Self::Function(name.to_string())),
                    _ => Err("tool_choice: missing function.name".into()),
                }
            }
            Some(_) => Err("tool_choice: expected a string or an object".into()),
        }
    }

    /// Whether calls in the output are recognised, given the request's tools.
    pub fn recognises_calls(&self, tools_given: bool) -> bool {
        tools_given && *self != Self::None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_every_form() {
        let f = |v: Json| ToolChoice::from_request(Some(&v));
        assert_eq!(ToolChoice::from_request(None), Ok(ToolChoice::Auto));
        assert_eq!(f(json!(null)), Ok(ToolChoice::Auto));
        assert_eq!(f(json!("none")), Ok(ToolChoice::None));
        assert_eq!(f(json!("required")), Ok(ToolChoice::Required));
        assert_eq!(
            f(json!({"type": "function", "function": {"name": "g"}})),
            Ok(ToolChoice::Function("g".into()))
        );
        for bad in [
            json!("any"),
            json!(3),
            json!({"type": "function"}),
            json!({"function": {"name": "g"}}),
        ] {
            let e = f(bad.clone()).unwrap_err();
            assert!(e.starts_with("tool_choice: "), "{bad}: {e}");
        }
        assert!(ToolChoice::Auto.recognises_calls(true));
        assert!(!ToolChoice::Auto.recognises_calls(false));
        assert!(!ToolChoice::None.recognises_calls(true));
    }
}
