//! OpenAI chat messages turned into what the Qwen templates expect.
//!
//! OpenAI clients send `content` as a string or as a list of parts, and a call's `arguments` as
//! a JSON *string*. The Qwen3.5/3.6 templates iterate `tool_call.arguments|items` (a string
//! makes them fail) and the Qwen3-Next ones paste a string in verbatim, so arguments become an
//! object here; text parts become one string (joined with nothing, as the Qwen3.5 template joins
//! them).

use serde_json::{Map, Value as Json};
use std::fmt;

/// A message the request cannot contain; `param` is the OpenAI error's `param`
/// (`messages[2].content[1]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidMessage {
    pub param: String,
    pub message: String,
}

impl fmt::Display for InvalidMessage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.param, self.message)
    }
}

impl std::error::Error for InvalidMessage {}

fn invalid(param: String, message: impl Into<String>) -> InvalidMessage {
    InvalidMessage {
        param,
        message: message.into(),
    }
}

/// Checks the request's messages and rewrites them for the chat template: `content` becomes a
/// string (or stays null in an assistant message with tool calls), `developer` becomes `system`, each tool call's `function.arguments`
/// becomes an object. Other fields (`tool_call_id`, `name`, `reasoning_content`, …) pass through.
pub fn normalize_messages_for_template(messages: &[Json]) -> Result<Vec<Json>, InvalidMessage> {
    if messages.is_empty() {
        return Err(invalid("messages".into(), "must not be empty"));
    }
    messages
        .iter()
        .enumerate()
        .map(|(i, m)| normalize_message(&format!("messages[{i}]"), m))
        .collect()
}

fn normalize_message(at: &str, message: &Json) -> Result<Json, InvalidMessage> {
    let Json::Object(m) = message else {
        return Err(invalid(at.into(), "expected an object"));
    };
    let mut out = m.clone();
    let role = match m.get("role").and_then(Json::as_str) {
        Some("developer") => "system",
        Some(r @ ("system" | "user" | "assistant" | "tool")) => r,
        Some(other) => {
            return Err(invalid(
                format!("{at}.role"),
                format!(
                    "unknown role {other:?} (expected system, developer, user, assistant or tool)"
                ),
            ))
        }
        None => return Err(invalid(format!("{at}.role"), "missing (a string)")),
    };
    out.insert("role".into(), role.into());
    match m.get("content") {
        // OpenAI's rule: only an assistant message that carries tool calls may leave out its
        // content (or send null); a null elsewhere would render as "None" or nothing.
        None | Some(Json::Null) if role == "assistant" && has_tool_calls(m) => {}
        None | Some(Json::Null) => {
            let needs = if role == "assistant" {
                "required unless the message carries `tool_calls`"
            } else {
                "required"
            };
            return Err(invalid(
                format!("{at}.content"),
                format!("{needs} in a {role} message (a string or a list of text parts)"),
            ));
        }
        Some(Json::String(_)) => {}
        Some(Json::Array(parts)) => {
            out.insert(
                "content".into(),
                text_of_parts(&format!("{at}.content"), parts)?.into(),
            );
        }
        Some(_) => {
            return Err(invalid(
                format!("{at}.content"),
                "expected a string or a list of text parts",
            ))
        }
    }
    match m.get("tool_calls") {
        None | Some(Json::Null) => {}
        Some(Json::Array(calls)) if role == "assistant" => {
            let calls = calls
                .iter()
                .enumerate()
                .map(|(j, c)| normalize_call(&format!("{at}.tool_calls[{j}]"), c))
                .collect::<Result<Vec<_>, _>>()?;
            out.insert("tool_calls".into(), Json::Array(calls));
        }
        Some(Json::Array(_)) => {
            return Err(invalid(
                format!("{at}.tool_calls"),
                "only assistant messages carry tool calls",
            ))
        }
        Some(_) => return Err(invalid(format!("{at}.tool_calls"), "expected a list")),
    }
    Ok(Json::Object(out))
}

fn has_tool_calls(message: &Map<String, Json>) -> bool {
    matches!(message.get("tool_calls"), Some(Json::Array(calls)) if !calls.is_empty())
}

fn text_of_parts(at: &str, parts: &[Json]) -> Result<String, InvalidMessage> {
    let mut text = String::new();
    for (j, part) in parts.iter().enumerate() {
        let at = format!("{at}[{j}]");
        match part.get("type").and_then(Json::as_str) {
            Some("text") | None => match part.get("text") {
                Some(Json::String(s)) => text.push_str(s),
                _ => return Err(invalid(at, "a text part needs a string \"text\"")),
            },
            Some(other) => {
                return Err(invalid(
                    at,
                    format!(
                        "content part type {other:?} is not supported: this model reads text only"
                    ),
                ))
            }
        }
    }
    Ok(text)
}

/// `{"id", "type": "function", "function": {"name", "arguments"}}` (or the flat
/// `{"name", "arguments"}`), with `arguments` made an object.
fn normalize_call(at: &str, call: &Json) -> Result<Json, InvalidMessage> {
    let Json::Object(c) = call else {
        return Err(invalid(at.into(), "expected an object"));
    };
    let mut out = c.clone();
    let (function, at) = match c.get("function") {
        Some(Json::Object(f)) => (f, format!("{at}.function")),
        Some(_) => return Err(invalid(format!("{at}.function"), "expected an object")),
        None => (c, at.to_string()),
    };
    if !matches!(function.get("name"), Some(Json::String(n)) if !n.is_empty()) {
        return Err(invalid(
            format!("{at}.name"),
            "missing (a non-empty string)",
        ));
    }
    let arguments = match function.get("arguments") {
        None | Some(Json::Null) => Map::new(),
        Some(Json::Object(a)) => a.clone(),
        Some(Json::String(s)) if s.trim().is_empty() => Map::new(),
        Some(Json::String(s)) => serde_json::from_str::<Map<String, Json>>(s).map_err(|e| {
            invalid(
                format!("{at}.arguments"),
                format!("not a JSON object ({e})"),
            )
        })?,
        Some(_) => {
            return Err(invalid(
                format!("{at}.arguments"),
                "expected a JSON object or a string holding one",
            ))
        }
    };
    let mut function = function.clone();
    function.insert("arguments".into(), Json::Object(arguments));
    if c.contains_key("function") {
        out.insert("function".into(), Json::Object(function));
        Ok(Json::Object(out))
    } else {
        Ok(Json::Object(function))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rewrites_openai_messages() {
        let got = normalize_messages_for_template(&[
            json!({"role": "developer", "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}]}),
            json!({"role": "user", "content": "Weather?"}),
            json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "w", "arguments": "{\"city\":\"Paris\",\"n\":[1,{\"x\":true}]}"}},
                {"name": "flat", "arguments": ""},
            ]}),
            json!({"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "14°"}]}),
        ])
        .unwrap();
        assert_eq!(
            got,
            vec![
                json!({"role": "system", "content": "Be brief."}),
                json!({"role": "user", "content": "Weather?"}),
                json!({"role": "assistant", "content": null, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "w", "arguments": {"city": "Paris", "n": [1, {"x": true}]}}},
                    {"name": "flat", "arguments": {}},
                ]}),
                json!({"role": "tool", "tool_call_id": "c1", "content": "14°"}),
            ]
        );
    }

    #[test]
    fn rejects_what_the_model_cannot_read() {
        let cases = [
            (json!([]), "messages: must not be empty"),
            (json!(["hi"]), "messages[0]: expected an object"),
            (
                json!([{"content": "x"}]),
                "messages[0].role: missing (a string)",
            ),
            (
                json!([{"role": "bot", "content": "x"}]),
                "messages[0].role: unknown role \"bot\"",
            ),
            (
                json!([{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "x"}}]}]),
                "messages[0].content[1]: content part type \"image_url\" is not supported",
            ),
            (
                json!([{"role": "user", "content": [{"type": "text"}]}]),
                "messages[0].content[0]: a text part needs",
            ),
            (
                json!([{"role": "user", "content": 3}]),
                "messages[0].content: expected a string or a list",
            ),
            (
                json!([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{bad"}}]}]),
                "messages[0].tool_calls[0].function.arguments: not a JSON object",
            ),
            (
                json!([{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}]),
                "messages[0].tool_calls[0].function.arguments: not a JSON object",
            ),
            (
                json!([{"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}]),
                "messages[0].tool_calls[0].function.name: missing",
            ),
            (
                json!([{"role": "user", "content": "x", "tool_calls": []}]),
                "messages[0].tool_calls: only assistant",
            ),
            (
                json!([{"role": "user", "content": null}]),
                "messages[0].content: required in a user message",
            ),
            (
                json!([{"role": "user", "content": "x"}, {"role": "system"}]),
                "messages[1].content: required in a system message",
            ),
            (
                json!([{"role": "tool", "tool_call_id": "c1", "content": null}]),
                "messages[0].content: required in a tool message",
            ),
            (
                json!([{"role": "assistant", "content": null}]),
                "messages[0].content: required unless the message carries `tool_calls`",
            ),
            (
                json!([{"role": "assistant", "content": null, "tool_calls": []}]),
                "messages[0].content: required unless",
            ),
        ];
        for (messages, want) in cases {
            let e = normalize_messages_for_template(messages.as_array().unwrap()).unwrap_err();
            assert!(e.to_string().starts_with(want), "{messages}: {e}");
        }
    }
}
