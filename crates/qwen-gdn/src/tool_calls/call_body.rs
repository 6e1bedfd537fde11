//! What the text between `<tool_call>` and `</tool_call>` reads as, in either format: a
//! complete call, an unfinished one, or not a call at all (`parse_call_body.rs` reads it).

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
