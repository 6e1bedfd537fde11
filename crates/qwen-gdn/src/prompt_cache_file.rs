//! The command-line side of prompt-cache files: what `cache-prompt` prefills and writes, and
//! how `generate --prompt-cache-file` puts a file's state in front of its own prompt. The file
//! format and its checks against the model are the model crate's
//! (`qwen_gdn_model::prompt_cache::{save_snapshot, load_snapshot}`).

use crate::chat_template::ChatTemplate;
use crate::load::Checkpoint;
use crate::prompt_split;
use crate::template_args::TemplateArgs;
use anyhow::{bail, Context, Result};
use qwen_gdn_model::prompt_cache::{load_snapshot, save_snapshot, ModelIdentity, Snapshot};
use qwen_gdn_model::{Cache, Model};
use std::path::Path;

/// The state after `tokens`, computed with the splits a prompt's end gets in `generate` (all
/// but the last token in chunks, the last alone): a request resumed from it then runs the
/// steps the prompt cache's own snapshots give.
pub fn prefill(model: &Model, tokens: &[u32], chunk: usize) -> Result<Cache> {
    let Some((last, head)) = tokens.split_last() else {
        bail!("nothing to prefill");
    };
    let mut cache = model.new_cache();
    for part in head.chunks(chunk) {
        model.prefill(part, &mut cache, part.len())?;
    }
    model.forward_last(&[*last], &mut cache)?;
    Ok(cache)
}

/// Writes the state of `cache` after `tokens` to `out` with the model's identity.
pub fn save(
    out: &Path,
    checkpoint: &Checkpoint,
    model: &Model,
    tokens: &[u32],
    cache: &Cache,
) -> Result<()> {
    let identity = ModelIdentity::of(&checkpoint.dir, model)?;
    save_snapshot(out, tokens, cache, &identity)
}

/// The tokens and the state a file holds, refused unless `model` made it.
pub fn load(path: &Path, checkpoint: &Checkpoint, model: &Model) -> Result<(Vec<u32>, Snapshot)> {
    let identity = ModelIdentity::of(&checkpoint.dir, model)?;
    load_snapshot(path, model, &identity)
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

/// The text that follows a cached prefix: through the chat template, the rest of the user
/// message the prefix opened (`prompt`, the end of the message, the generation prompt); raw,
/// `prompt` itself. No special tokens are added: the sequence has already begun.
pub fn continuation(
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
