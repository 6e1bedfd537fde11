//! A chat-templated prompt cut in two around the user's text, as mlx_lm.cache_prompt and
//! `mlx_lm.generate --prompt-cache-file` cut it: a saved prompt cache holds the rendering up
//! to the end of the first text (the user message left open), and a later prompt supplies
//! the rest: its text, the end of the message and the generation prompt. The two together
//! are the rendering of one user message holding both texts.

use crate::text::chat_template::ChatTemplate;
use anyhow::{bail, Result};
use serde_json::{json, Map, Value as Json};

/// Stands in for the user's text, to find where the template puts it.
const PROBE: &str = "\u{1}qwen-gdn user text\u{1}";

fn messages(system: Option<&str>, content: &str) -> Vec<Json> {
    let mut messages = Vec::new();
    if let Some(system) = system {
        messages.push(json!({"role": "system", "content": system}));
    }
    messages.push(json!({"role": "user", "content": content}));
    messages
}

/// The rendering of the probe, and where the probe starts and ends in it.
fn probe(
    template: &ChatTemplate,
    system: Option<&str>,
    vars: &Map<String, Json>,
) -> Result<(String, usize, usize)> {
    let text = template.render(&messages(system, PROBE), None, true, vars)?;
    match text.find(PROBE) {
        Some(start) => Ok((text, start, start + PROBE.len())),
        None => bail!("the chat template does not write the user's text verbatim"),
    }
}

/// The rendering of `text` as a user message up to the end of `text` (what cache-prompt
/// prefills). The text is rendered with the probe after it and cut at the probe, so that its
/// end stays as it is: a template that trims the message (Qwen's do) trims the whole
/// message's ends, never the two halves' ends at the split.
pub fn open_message(
    template: &ChatTemplate,
    system: Option<&str>,
    text: &str,
    vars: &Map<String, Json>,
) -> Result<String> {
    let (probed, _, end) = probe(template, system, vars)?;
    let tail = &probed[end..];
    let full = template.render(
        &messages(system, &format!("{text}{PROBE}")),
        None,
        true,
        vars,
    )?;
    match full.rfind(PROBE) {
        Some(at) if &full[at + PROBE.len()..] == tail => Ok(full[..at].to_string()),
        _ => bail!("the chat template ends this user message differently from others"),
    }
}

/// The rendering of `text` as a user message from `text` on (what follows a saved prompt
/// cache): the text, the end of the message and the generation prompt. As in
/// [`open_message`], the text is rendered behind the probe, so its start stays as it is.
pub fn message_rest(
    template: &ChatTemplate,
    text: &str,
    vars: &Map<String, Json>,
) -> Result<String> {
    let (probed, start, _) = probe(template, None, vars)?;
    let head = &probed[..start];
    let full = template.render(&messages(None, &format!("{PROBE}{text}")), None, true, vars)?;
    match full.find(PROBE) {
        Some(at) if &full[..at] == head => Ok(full[at + PROBE.len()..].to_string()),
        _ => bail!("the chat template starts this user message differently from others"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::tiny_template;

    #[test]
    fn the_two_halves_make_one_message_of_both_texts() {
        let t = tiny_template();
        let vars = Map::from_iter([("enable_thinking".to_string(), Json::Bool(true))]);
        let head = open_message(&t, Some("sys"), "Read this document.\nIt says", &vars).unwrap();
        let rest = message_rest(&t, "what?", &vars).unwrap();
        let whole = t
            .render(
                &messages(Some("sys"), "Read this document.\nIt sayswhat?"),
                None,
                true,
                &vars,
            )
            .unwrap();
        assert_eq!(head.clone() + &rest, whole);
        assert!(head.ends_with("It says"), "{head:?}");
        assert!(rest.starts_with("what?<|im_end|>"), "{rest:?}");
    }

    /// The template trims a message's ends; the split between the halves keeps its
    /// whitespace, on either side of it.
    #[test]
    fn whitespace_at_the_split_is_kept() {
        let t = tiny_template();
        let vars = Map::new();
        for (first, second) in [
            ("The sea is", " blue"),
            ("The sea is ", "blue"),
            ("The sea is\n\n", "  blue"),
        ] {
            let head = open_message(&t, None, first, &vars).unwrap();
            let rest = message_rest(&t, second, &vars).unwrap();
            let whole = t
                .render(
                    &messages(None, &format!("{first}{second}")),
                    None,
                    true,
                    &vars,
                )
                .unwrap();
            assert_eq!(head.clone() + &rest, whole, "{first:?} + {second:?}");
            assert!(head.ends_with(first), "{head:?}");
            assert!(rest.starts_with(second), "{rest:?}");
        }
        // The whole message's own ends are still trimmed, as the template trims them.
        let head = open_message(&t, None, "  The sea", &vars).unwrap();
        assert!(head.ends_with("user\nThe sea"), "{head:?}");
        let rest = message_rest(&t, " is blue \n", &vars).unwrap();
        assert!(rest.starts_with(" is blue<|im_end|>"), "{rest:?}");
    }
}
