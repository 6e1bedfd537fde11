//! A whole reply parsed at once (non-streamed responses), through the streaming parser so that
//! both always agree.

use super::output_parser::Event;
#[cfg(test)]
use super::output_parser::{OutputParser, ParserOptions};
use super::tool_call::ToolCall;
use serde_json::{json, Map, Value as Json};

/// The parts of an assistant reply.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ParsedMessage {
    /// The answer; None when the reply is only tool calls (OpenAI's `"content": null`).
    pub content: Option<String>,
    /// The thinking; None when there was none.
    pub reasoning_content: Option<String>,
    pub tool_calls: Vec<ToolCall>,
}

/// Parses a finished reply.
#[cfg(test)]
pub fn parse_complete(text: &str, options: ParserOptions) -> ParsedMessage {
    let mut parser = OutputParser::new(options);
    let mut events = parser.push(text);
    events.extend(parser.finish());
    from_events(events)
}

/// Gathers streamed events into one message.
pub fn from_events(events: impl IntoIterator<Item = Event>) -> ParsedMessage {
    let (mut content, mut reasoning, mut tool_calls) = (String::new(), String::new(), Vec::new());
    for e in events {
        match e {
            Event::Content(s) => content.push_str(&s),
            Event::Reasoning(s) => reasoning.push_str(&s),
            Event::ToolCall(c) => tool_calls.push(c),
        }
    }
    ParsedMessage {
        content: (!content.is_empty() || tool_calls.is_empty()).then_some(content),
        reasoning_content: (!reasoning.is_empty()).then_some(reasoning),
        tool_calls,
    }
}

impl ParsedMessage {
    /// The OpenAI `choices[].message`: `{"role": "assistant", "content", "reasoning_content"?,
    /// "tool_calls"?}` (the last two only when present).
    pub fn to_openai_message(&self) -> Json {
        let mut m = Map::new();
        m.insert("role".into(), json!("assistant"));
        m.insert("content".into(), json!(self.content));
        if let Some(r) = &self.reasoning_content {
            m.insert("reasoning_content".into(), json!(r));
        }
        if !self.tool_calls.is_empty() {
            let calls = self.tool_calls.iter().map(ToolCall::to_openai).collect();
            m.insert("tool_calls".into(), Json::Array(calls));
        }
        Json::Object(m)
    }

    /// `"tool_calls"` when the reply made calls and stopped by itself; else `fallback`
    /// (`"stop"`, or `"length"`, which wins: the reply was cut).
    #[cfg(test)]
    pub fn finish_reason<'a>(&self, fallback: &'a str) -> &'a str {
        if self.tool_calls.is_empty() || fallback == "length" {
            fallback
        } else {
            "tool_calls"
        }
    }
}
