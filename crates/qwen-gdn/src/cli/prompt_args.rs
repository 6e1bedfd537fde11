//! `--prompt` / `--prompt-file`: the one prompt of `generate` and `cache-prompt`, exactly one of
//! the two required.

use crate::load::input::InputLimit;
use anyhow::Result;
use std::path::PathBuf;

#[derive(clap::Args)]
#[group(id = "input", required = true, multiple = false)]
pub struct PromptArgs {
    /// Prompt text; `-` reads it from stdin
    #[arg(long, short = 'p')]
    prompt: Option<String>,
    /// Read the prompt from this file
    #[arg(long, value_name = "FILE")]
    prompt_file: Option<PathBuf>,
}

impl PromptArgs {
    /// The prompt's text, within `limit`, and its name for errors ("--prompt from stdin", the
    /// file's path, …).
    pub fn read(&self, limit: &InputLimit) -> Result<(String, String)> {
        limit.read(
            self.prompt.as_deref(),
            self.prompt_file.as_deref(),
            "--prompt",
        )
    }
}
