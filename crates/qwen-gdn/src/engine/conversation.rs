//! A conversation rendered through the chat template into tokens, with the token positions
//! where its messages end: the prompt cache snapshots there, so that the next request that
//! shares those messages prefills only what follows them.

use super::PromptTokens;
use crate::text::chat_template::ChatTemplate;
use anyhow::{bail, Result};
use serde_json::{json, Map, Value as Json};
use tokenizers::Tokenizer;

/// Stands in for a message after a prefix the template refuses to render alone (Qwen's
/// templates raise "No user query found" for a system message by itself).
const PROBE: &str = "\u{1}qwen-gdn boundary probe\u{1}";

/// Message ends considered at the tail of a conversation: the previous request's prompt ended
/// within the last few messages (its user or tool message, the reply, the new message), so
/// older ends would only repeat snapshots an earlier request made. With the first message's
/// end (a system prompt other conversations share), rendering stays linear in the length of
/// the conversation instead of quadratic.
const RECENT_MESSAGES: usize = 4;

/// Renders and tokenizes `messages`. A boundary is kept where the tokens of a rendered prefix
/// of the conversation (with and without the generation prompt after a user or tool message:
/// the latter is where the previous request's prompt ended) are a prefix of the whole
/// rendering's tokens; templates that rewrite history (Qwen3.5 drops earlier reasoning) give
/// no boundary where the texts diverge.
pub fn render_conversation(
    template: &ChatTemplate,
    tokenizer: &Tokenizer,
    messages: &[Json],
    tools: Option<&Json>,
    add_generation_prompt: bool,
    vars: &Map<String, Json>,
) -> Result<PromptTokens> {
    let full = template.render(messages, tools, add_generation_prompt, vars)?;
    let ids = encode(tokenizer, &full)?;
    if ids.is_empty() {
        bail!("the prompt has no tokens");
    }
    let mut boundaries = Vec::new();
    let recent = messages.len().saturating_sub(RECENT_MESSAGES);
    for i in (0..messages.len()).filter(|&i| i == 0 || i >= recent) {
        let prefix = &messages[..=i];
        let role = messages[i].get("role").and_then(Json::as_str);
        let mut texts = vec![prefix_text(template, prefix, tools, false, vars, &full)];
        if matches!(role, Some("user" | "tool")) {
            texts.push(prefix_text(template, prefix, tools, true, vars, &full));
        }
        for text in texts.into_iter().flatten() {
            let prefix_ids = encode(tokenizer, &text)?;
            if !prefix_ids.is_empty()
                && prefix_ids.len() < ids.len()
                && ids.starts_with(&prefix_ids)
            {
                boundaries.push(prefix_ids.len());
            }
        }
    }
    boundaries.sort_unstable();
    boundaries.dedup();
    Ok(PromptTokens { ids, boundaries })
}

/// The rendering of `prefix` when it is a text prefix of `full`. A prefix the template
/// refuses is rendered with a probe message after it, and cut where it leaves `full`.
fn prefix_text(
    template: &ChatTemplate,
    prefix: &[Json],
    tools: Option<&Json>,
    add_generation_prompt: bool,
    vars: &Map<String, Json>,
    full: &str,
) -> Option<String> {
    match template.render(prefix, tools, add_generation_prompt, vars) {
        Ok(text) => full.starts_with(&text).then_some(text),
        Err(_) if !add_generation_prompt => {
            let mut probed = prefix.to_vec();
            probed.push(json!({"role": "user", "content": PROBE}));
            let text = template.render(&probed, tools, false, vars).ok()?;
            let common = text
                .char_indices()
                .zip(full.chars())
                .find(|((_, a), b)| a != b)
                .map_or(text.len().min(full.len()), |((i, _), _)| i);
            (common > 0).then(|| full[..common].to_string())
        }
        Err(_) => None,
    }
}

fn encode(tokenizer: &Tokenizer, text: &str) -> Result<Vec<u32>> {
    // The template already wrote the special tokens it wants.
    Ok(tokenizer
        .encode(text, false)
        .map_err(|e| anyhow::anyhow!("tokenizing the prompt: {e}"))?
        .get_ids()
        .to_vec())
}
