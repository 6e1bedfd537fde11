//! The command-line side of prompt-cache files: what `cache-prompt` prefills and writes, and
//! how `generate --prompt-cache-file` puts a file's state in front of its own prompt. The file
//! format and its checks against the model are the model crate's
//! (`qwen_gdn_model::prompt_cache::{save_snapshot, load_snapshot}`); loading goes through
//! `Engine::load_prompt_cache_file`.

use crate::cli::template_args::TemplateArgs;
use crate::engine::{Engine, PromptTokens};
use crate::load::Checkpoint;
use crate::text::chat_template::ChatTemplate;
use crate::text::prompt_split;
use anyhow::{bail, Context, Result};
use qwen_gdn_model::prompt_cache::{read_snapshot_header, save_snapshot};
use std::path::Path;
use std::sync::atomic::AtomicBool;

/// Prefills `tokens` as `generate` prefills a prompt (all but the last token in chunks, the
/// last alone: a request resumed from the file then runs the steps the prompt cache's own
/// snapshots give) and writes the state after them to `out`, with the model's identity and
/// whether `tokens` came through the chat template.
pub fn prefill_and_save(
    engine: &mut Engine,
    tokens: &[u32],
    out: &Path,
    chat_template: bool,
) -> Result<()> {
    let never = AtomicBool::new(false);
    let cache = engine
        .prompt_state(&PromptTokens::plain(tokens.to_vec()), &never)?
        .context("the prefill was cancelled")?;
    save_snapshot(out, tokens, &cache, &engine.identity()?, chat_template)
}

/// An error unless the file at `path` was made as this run reads its prompt: through the chat
/// template (`chat_template`) or as raw text.
fn check_made_alike(path: &Path, chat_template: bool) -> Result<()> {
    let header = read_snapshot_header(path)?;
    match (header.chat_template, chat_template) {
        (true, false) => bail!(
            "{}: made through the chat template, but this run reads the prompt as raw text \
             (--ignore-chat-template, or no template); use the same setting as cache-prompt",
            path.display()
        ),
        (false, true) => bail!(
            "{}: made with --ignore-chat-template (raw text), but this run uses the chat \
             template; pass --ignore-chat-template, or re-create the file without it",
            path.display()
        ),
        _ => Ok(()),
    }
}

/// An error naming `path` unless it is a readable file.
pub fn check_readable(path: &Path) -> Result<()> {
    // Not opened: a FIFO would block the open.
    std::fs::metadata(path)
        .with_context(|| format!("cannot read prompt cache {}", path.display()))
        .and_then(|m| {
            if m.is_file() {
                Ok(())
            } else {
                bail!("prompt cache {} is not a file", path.display())
            }
        })
}

/// The text that follows the prefix cached in `file`: through the chat template, the rest of
/// the user message the prefix opened (`prompt`, the end of the message, the generation
/// prompt); raw, `prompt` itself. No special tokens are added: the sequence has already begun.
/// The file must have been made the same way (with the chat template or without): otherwise
/// the two halves would not make one prompt.
pub fn continuation(
    file: &Path,
    template: &TemplateArgs,
    checkpoint: &Checkpoint,
    prompt: &str,
    what: &str,
) -> Result<Vec<u32>> {
    if template.system_prompt.is_some() {
        bail!(
            "--system-prompt cannot be used with --prompt-cache-file: the system prompt is part \
             of the cached prefix (pass it to cache-prompt)"
        );
    }
    let chat_template = if template.ignore_chat_template {
        None
    } else {
        ChatTemplate::from_dir(&checkpoint.dir, checkpoint.tokenizer_config.as_ref())?
    };
    check_made_alike(file, chat_template.is_some())?;
    let text = match chat_template {
        Some(t) => prompt_split::message_rest(&t, prompt, &template.vars(checkpoint))?,
        None => prompt.to_string(),
    };
    checkpoint
        .input_limit
        .check_tokens(&checkpoint.tokenizer, &text, what)?;
    let ids = checkpoint
        .tokenizer
        .encode(text, false)
        .map_err(|e| anyhow::anyhow!("tokenizing {what}: {e}"))?
        .get_ids()
        .to_vec();
    if ids.is_empty() {
        bail!("{what} has no tokens");
    }
    Ok(ids)
}
