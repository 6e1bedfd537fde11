//! The XML tool-call body of the Qwen3.5 / Qwen3.6 / Qwen3-Coder templates:
//! `<tool_call>\n<function=NAME>\n<parameter=KEY>\nVALUE\n</parameter>\n</function>\n</tool_call>`.
//!
//! A value is raw text and may itself contain `<`, newlines, or even `</parameter>`. The template
//! always follows a value's closing `</parameter>` with the next `<parameter=`, with
//! `</function>`, or with the end of the call, so only a `</parameter>` followed by one of those
//! closes the value.

use super::call_body::{BodyError, CallBody};
use super::schema::ToolSchemas;
use serde_json::Map;

const FUNCTION: &str = "<function=";
const FUNCTION_END: &str = "</function>";
const PARAMETER: &str = "<parameter=";
const PARAMETER_END: &str = "</parameter>";

/// Reads one `<function=…>` body, typing each value by the tool's schema. A missing final
/// `</function>` is forgiven (the parameters are all there); a value without its closing
/// `</parameter>` is [`BodyError::Unterminated`]; any other text is [`BodyError::Malformed`].
pub fn parse_xml_call(body: &str, schemas: &ToolSchemas) -> Result<CallBody, BodyError> {
    let rest = body
        .trim_start()
        .strip_prefix(FUNCTION)
        .ok_or(BodyError::Malformed)?;
    let (name, mut rest) = tag_name(rest)?;
    let mut arguments = Map::new();
    loop {
        rest = rest.trim_start();
        if rest.is_empty() {
            break;
        }
        if let Some(after) = rest.strip_prefix(FUNCTION_END) {
            if !after.trim().is_empty() {
                return Err(BodyError::Malformed);
            }
            break;
        }
        let after = rest.strip_prefix(PARAMETER).ok_or(BodyError::Malformed)?;
        let (key, region) = tag_name(after)?;
        let (value_end, next) = parameter_close(region).ok_or(BodyError::Unterminated)?;
        let value = strip_one_newline(&region[..value_end]);
        arguments.insert(key.to_string(), schemas.typed_value(name, key, value));
        rest = &region[next..];
    }
    Ok(CallBody {
        name: name.to_string(),
        arguments,
    })
}

/// The name in `NAME>rest` (after `<function=` or `<parameter=`) and the text after `>`.
fn tag_name(text: &str) -> Result<(&str, &str), BodyError> {
    let gt = text.find('>').ok_or(BodyError::Malformed)?;
    let name = text[..gt].trim();
    if name.is_empty() || name.contains(['<', '\n']) {
        return Err(BodyError::Malformed);
    }
    Ok((name, &text[gt + 1..]))
}

/// In the text after `<parameter=KEY>`: where the value ends and where the text after its
/// closing `</parameter>` starts.
fn parameter_close(region: &str) -> Option<(usize, usize)> {
    region.match_indices(PARAMETER_END).find_map(|(i, _)| {
        let next = i + PARAMETER_END.len();
        let after = region[next..].trim_start();
        (after.is_empty() || after.starts_with(PARAMETER) || after.starts_with(FUNCTION_END))
            .then_some((i, next))
    })
}

/// The template writes `>\n` before a value and `\n</` after it; exactly those two newlines go.
fn strip_one_newline(value: &str) -> &str {
    let value = value.strip_prefix('\n').unwrap_or(value);
    value.strip_suffix('\n').unwrap_or(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value as Json};

    fn schemas() -> ToolSchemas {
        ToolSchemas::from_tools(&[json!({"type": "function", "function": {
            "name": "write_file",
            "parameters": {"type": "object", "properties": {
                "path": {"type": "string"},
                "content": {"type": "string"},
                "mode": {"type": "integer"},
                "append": {"type": "boolean"},
                "tags": {"type": "array"},
                "meta": {"type": "object"},
            }},
        }})])
    }

    fn parse(body: &str) -> Result<(String, Json), BodyError> {
        parse_xml_call(body, &schemas()).map(|c| (c.name, Json::Object(c.arguments)))
    }

    #[test]
    fn reads_typed_parameters() {
        let body = "\n<function=write_file>\n<parameter=path>\n/tmp/a b.txt\n</parameter>\n\
            <parameter=content>\n\nline 1 < 2\n</parameter> not yet\n  indented «ü» 🙂\n\n</parameter>\n\
            <parameter=mode>\n420\n</parameter>\n<parameter=append>\nTrue\n</parameter>\n\
            <parameter=tags>\n[\"a\", [1, {\"b\": null}]]\n</parameter>\n\
            <parameter=meta>\n{\"k\": {\"n\": [1.5]}}\n</parameter>\n\
            <parameter=extra>\n7\n</parameter>\n</function>\n";
        let (name, args) = parse(body).unwrap();
        assert_eq!(name, "write_file");
        assert_eq!(
            args,
            json!({
                "path": "/tmp/a b.txt",
                "content": "\nline 1 < 2\n</parameter> not yet\n  indented «ü» 🙂\n",
                "mode": 420,
                "append": true,
                "tags": ["a", [1, {"b": null}]],
                "meta": {"k": {"n": [1.5]}},
                "extra": "7",
            })
        );
        // Keys keep the order the model wrote them in.
        let keys: Vec<_> = args.as_object().unwrap().keys().cloned().collect();
        assert_eq!(keys[..3], ["path", "content", "mode"]);
    }

    #[test]
    fn forgives_layout_but_not_junk() {
        use BodyError::*;
        assert_eq!(
            parse("<function=write_file><parameter=path>p</parameter></function>"),
            Ok(("write_file".into(), json!({"path": "p"})))
        );
        assert_eq!(
            parse("<function=write_file>\n<parameter=path>\np\n</parameter>\n"),
            Ok(("write_file".into(), json!({"path": "p"}))),
            "no </function>"
        );
        assert_eq!(
            parse("<function=f>\n</function>"),
            Ok(("f".into(), json!({})))
        );
        let cases = [
            ("<function=write_file>\n<parameter=path>\np", Unterminated),
            (
                "<function=write_file>\n<parameter=path>\np\n</parameter>x",
                Unterminated,
            ),
            ("<function=write_file>\nhello\n</function>", Malformed),
            ("<function=write_file>\n</function>\ntrailing", Malformed),
            ("<function=>\n</function>", Malformed),
            ("<function=a\nb>\n</function>", Malformed),
            ("<function=f", Malformed),
            (
                "<function=f>\n<parameter=>\nv\n</parameter>\n</function>",
                Malformed,
            ),
            ("text <function=f>\n</function>", Malformed),
        ];
        for (body, want) in cases {
            assert_eq!(parse(body), Err(want), "{body:?}");
        }
    }
}
