//! The text between `<tool_call>` and `</tool_call>`, read in whichever of the family's two
//! formats it is written. The parsers of each format sit below this file and return the
//! shared [`CallBody`]/[`BodyError`] of `call_body.rs`.

use super::call_body::{BodyError, CallBody};
use super::hermes_json::parse_hermes_call;
use super::qwen_xml::parse_xml_call;
use super::schema::ToolSchemas;

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
