//! A parsed tool call and its OpenAI wire shapes.

use serde_json::{json, Value as Json};

/// One call the model made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCall {
    /// Position among this reply's calls, from 0 (the `index` of a streamed delta).
    pub index: usize,
    /// `call_…`, unique within the server's lifetime for practical purposes.
    pub id: String,
    pub name: String,
    /// The arguments object as compact JSON text, which is what OpenAI's `arguments` holds.
    pub arguments_json: String,
}

impl ToolCall {
    /// An entry of a message's `tool_calls`:
    /// `{"id", "type": "function", "function": {"name", "arguments"}}`.
    pub fn to_openai(&self) -> Json {
        json!({
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments_json},
        })
    }

    /// An entry of a streamed `choices[].delta.tool_calls`: the whole call in one delta,
    /// `{"index", "id", "type": "function", "function": {"name", "arguments"}}`. Clients
    /// concatenate `arguments` across deltas of the same index, so a single delta is complete.
    pub fn to_openai_delta(&self) -> Json {
        json!({
            "index": self.index,
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments_json},
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openai_shapes() {
        let call = ToolCall {
            index: 1,
            id: "call_x1".into(),
            name: "get_weather".into(),
            arguments_json: r#"{"city":"Paris"}"#.into(),
        };
        assert_eq!(
            serde_json::to_string(&call.to_openai()).unwrap(),
            r#"{"id":"call_x1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}"#
        );
        assert_eq!(
            serde_json::to_string(&call.to_openai_delta()).unwrap(),
            r#"{"index":1,"id":"call_x1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}"#
        );
    }
}
