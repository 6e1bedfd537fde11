//! `qwen-gdn cache-prompt`: prefill a prompt once and save the model's cache to a file, like
//! mlx_lm.cache_prompt; `generate --prompt-cache-file` then starts from it, so a long shared
//! prefix (a document, instructions) is not prefilled again. Through the chat template the
//! prompt is the beginning of a user message that the later prompt finishes
//! ([`crate::text::prompt_split`]).

use crate::cli::prompt_args::PromptArgs;
use crate::cli::prompt_cache_file;
use crate::cli::template_args::TemplateArgs;
use crate::engine::Engine;
use crate::load::ModelArgs;
use crate::text::chat_template::ChatTemplate;
use crate::text::prompt_split;
use crate::ui::output::eprint_line;
use anyhow::{bail, Context, Result};
use qwen_gdn_model::PromptCache;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

#[derive(clap::Args)]
#[command(
    after_help = "Through the chat template (the default), the prompt is the start of a user \
                  message: `generate --prompt-cache-file P --prompt Q` continues it with Q, the \
                  end of the message and the generation prompt, as one message holding both \
                  texts. With --ignore-chat-template the prompt is raw text and Q follows it \
                  as raw text; generate must use the same setting (the file records it).\nThe \
                  file records the model it was made with (config, weights, GDN state dtype, \
                  compute dtype); another model refuses it. A checksum of every tensor and of \
                  the token ids is checked when it is loaded."
)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    prompt: PromptArgs,
    /// Where to write the prompt cache (safetensors)
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
    /// Replace --out when it already exists (only an earlier prompt-cache file is ever
    /// replaced)
    #[arg(long)]
    force: bool,
    #[command(flatten)]
    template: TemplateArgs,
}

pub fn run(args: Args) -> Result<ExitCode> {
    // Before anything is loaded: the user's file is not replaced without --force.
    refuse_existing(&args.out, args.force)?;
    let checkpoint = args.model.open()?;
    let limit = &checkpoint.input_limit;
    let (prompt, what) = args.prompt.read(limit)?;
    let template = if args.template.ignore_chat_template {
        None
    } else {
        ChatTemplate::from_dir(&checkpoint.dir, checkpoint.tokenizer_config.as_ref())?
    };
    let (text, add_special_tokens) = match &template {
        Some(template) => {
            let vars = args.template.vars(&checkpoint);
            let system = args.template.system_prompt.as_deref();
            (
                prompt_split::open_message(template, system, &prompt, &vars)?,
                false,
            )
        }
        None => {
            if args.template.system_prompt.is_some() {
                eprint_line("warning: --system-prompt is ignored without a chat template");
            }
            (prompt, true)
        }
    };
    limit.check_tokens(&checkpoint.tokenizer, &text, &what)?;
    let ids = checkpoint
        .tokenizer
        .encode(text, add_special_tokens)
        .map_err(|e| anyhow::anyhow!("tokenizing {what}: {e}"))?
        .get_ids()
        .to_vec();
    if ids.is_empty() {
        bail!("{what} has no tokens");
    }
    // A later prompt must still fit after it.
    limit.check_fits(ids.len() + 1, &what)?;
    let model = args.model.load_model(&checkpoint, ids.len() + 1)?;
    // One prompt, saved: the prompt cache itself keeps nothing.
    let mut engine = Engine::new(
        checkpoint,
        model,
        args.model.prefill_chunk_size,
        PromptCache::new(0),
        None,
    )?;
    let start = Instant::now();
    prompt_cache_file::prefill_and_save(&mut engine, &ids, &args.out, template.is_some())?;
    let prefill_time = start.elapsed();
    let bytes = std::fs::metadata(&args.out).map_or(0, |m| m.len());
    eprint_line(&format!(
        "Cached {} prompt tokens ({:.3} tokens-per-sec) in {} ({:.1} MB)",
        ids.len(),
        ids.len() as f64 / prefill_time.as_secs_f64().max(1e-9),
        args.out.display(),
        bytes as f64 / 1e6
    ));
    Ok(ExitCode::SUCCESS)
}

/// An error when `out` exists (a dangling link counts) and `force` is off.
fn refuse_existing(out: &Path, force: bool) -> Result<()> {
    if !force && out.symlink_metadata().is_ok() {
        bail!(
            "--out {} already exists; not overwritten (--force replaces it)",
            out.display()
        );
    }
    if out.is_dir() {
        bail!("--out {} is a folder", out.display());
    }
    if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
        if !parent.is_dir() {
            return Err(anyhow::anyhow!("no such folder"))
                .with_context(|| format!("--out {}", out.display()));
        }
    }
    Ok(())
}
