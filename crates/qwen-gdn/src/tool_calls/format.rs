//! Which tool-call format a chat template teaches the model.
//!
//! - Qwen3.5, Qwen3.6 and Qwen3-Coder: XML, `<tool_call>\n<function=NAME>\n<parameter=KEY>\n…`.
//! - Qwen3-Next-80B (Instruct and Thinking), like Qwen3 / Qwen2.5: Hermes JSON,
//!   `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>`.
//!
//! The parser reads both whatever the template says (see `parse_call_body`); the format matters when
//! the server writes the start of a call itself, to force one (`tool_choice` required/named).

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolCallFormat {
    QwenXml,
    HermesJson,
}

impl ToolCallFormat {
    /// The format a template's source asks for; None when it shows no tool-call format at all.
    pub fn detect(template_source: &str) -> Option<Self> {
        if template_source.contains("<function=") {
            Some(Self::QwenXml)
        } else if template_source.contains("<tool_call>") {
            Some(Self::HermesJson)
        } else {
            None
        }
    }

    /// The text that opens a call in this format, as the template writes it; with `function`,
    /// up to where the arguments start. Appending it to the prompt forces a call; the parser
    /// must then be fed this same text first, since it is part of the reply.
    pub fn call_opening(self, function: Option<&str>) -> String {
        match (self, function) {
            (_, None) => "<tool_call>\n".into(),
            (Self::QwenXml, Some(name)) => format!("<tool_call>\n<function={name}>\n"),
            (Self::HermesJson, Some(name)) => format!(
                "<tool_call>\n{{\"name\": {}, \"arguments\": ",
                serde_json::Value::from(name)
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template(file: &str) -> String {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/data/chat-templates");
        std::fs::read_to_string(dir.join(file)).unwrap()
    }

    #[test]
    fn detects_the_format_of_the_real_templates() {
        assert_eq!(
            ToolCallFormat::detect(&template("qwen3.5.jinja")),
            Some(ToolCallFormat::QwenXml)
        );
        assert_eq!(
            ToolCallFormat::detect(&template("qwen3.6.jinja")),
            Some(ToolCallFormat::QwenXml)
        );
        for next in ["qwen3-next-instruct.jinja", "qwen3-next-thinking.jinja"] {
            assert_eq!(
                ToolCallFormat::detect(&template(next)),
                Some(ToolCallFormat::HermesJson),
                "{next}"
            );
        }
        assert_eq!(ToolCallFormat::detect("{{ messages }}"), None);
    }

    #[test]
    fn call_openings() {
        assert_eq!(
            ToolCallFormat::QwenXml.call_opening(Some("f")),
            "<tool_call>\n<function=f>\n"
        );
        assert_eq!(
            ToolCallFormat::HermesJson.call_opening(Some("f\"")),
            "<tool_call>\n{\"name\": \"f\\\"\", \"arguments\": "
        );
        assert_eq!(
            ToolCallFormat::HermesJson.call_opening(None),
            "<tool_call>\n"
        );
    }
}
