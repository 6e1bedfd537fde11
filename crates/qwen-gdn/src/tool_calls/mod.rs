//! Tool calls and thinking in a Qwen model's reply, and OpenAI messages for its chat template.
//!
//! - [`OutputParser`] reads a reply as it streams: [`Event`]s of content, reasoning and whole
//!   tool calls. [`parse_complete`] reads a finished reply with the same parser.
//! - Both tool-call formats of the family are read: Qwen XML (Qwen3.5/3.6/Coder) and Hermes JSON
//!   (Qwen3-Next); [`ToolCallFormat::detect`] tells which one a template asks for.
//! - [`normalize_messages_for_template`] turns OpenAI messages (text parts, JSON-string
//!   arguments) into what the templates render.

mod call_body;
mod complete;
mod format;
mod hermes_json;
mod messages;
mod output_parser;
mod parse_call_body;
mod qwen_xml;
mod schema;
mod tool_call;
mod tool_choice;

#[cfg(test)]
mod tests;

pub use complete::from_events;
#[cfg(test)]
pub use complete::parse_complete;
pub use format::ToolCallFormat;
pub use messages::normalize_messages_for_template;
pub use output_parser::{Event, OutputParser, ParserOptions};
pub use schema::{schema_types, ToolSchemas};
#[cfg(test)]
pub use tool_call::ToolCall;
pub use tool_choice::ToolChoice;
