//! Splits the generated text of a chat reply into content, reasoning and tool calls, as it
//! streams. The adapter between the server and the tool-call / reasoning parsers.

use serde_json::Value as Json;

#[derive(Debug, Clone, PartialEq)]
pub enum Delta {
    Content(String),
    Reasoning(String),
    /// A complete call: `arguments` is a JSON text.
    ToolCall {
        index: usize,
        id: String,
        name: String,
        arguments: String,
    },
}

pub struct OutputParser {
    _tools: Vec<Json>,
}

impl OutputParser {
    /// `tools`: the definitions shown to the model (empty: never parse calls);
    /// `opens_thinking`: the prompt ended inside `<think>`.
    pub fn new(tools: &[Json], _opens_thinking: bool) -> Self {
        Self {
            _tools: tools.to_vec(),
        }
    }

    pub fn push(&mut self, text: &str) -> Vec<Delta> {
        vec![Delta::Content(text.to_string())]
    }

    /// Whatever is still held back at the end of the output.
    pub fn finish(&mut self) -> Vec<Delta> {
        vec![]
    }
}
