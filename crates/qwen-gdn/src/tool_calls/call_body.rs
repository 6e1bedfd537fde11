//! The text between `<tool_call>` and `</tool_call>`: which format it is in, and whether it is a
//! complete call, an unfinished one, or not a call at all.

use super::hermes_json::parse_hermes_call;
use super::qwen_xml::parse_xml_call;
use super::schema::ToolSchemas;
use serde_json::{Map, Value as Json};

/// A call read from its body: the function name and its arguments.
#[derive(Clone, Debug, PartialEq)]
pub struct CallBody {
    pub name: String,
    pub arguments: Map<String, Json>,
}

/// Why a body is not a call (yet).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyError {
    /// The body stops inside a value (an open parameter, an unclosed JSON string): a
    /// `</tool_call>` seen there belongs to the value, and the call may still end later.
    Unterminated,
    /// Not a call in either format; its text is content.
    Malformed,
}

/// Reads a body in whichever format it is written: the Qwen XML form starts with `<function=`,
/// the Hermes form with `{`. Accepting both whatever the template says costs nothing and
/// catches a model that answers in the other family's format.
pub fn parse_call_body(body: &str, schemas: &ToolSchemas) -> Result<CallBody, BodyError> {
    let start = body.trim_start();
    if start.starts_with("<function=") {
        parse_xml_call(body, schemas)
    } else if start.starts_with('{') {
        parse_hermes_call(body)
    } else {
        Err(BodyError::Malformed)
    }
}
