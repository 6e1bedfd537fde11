//! The speculative-decoding flags (`--draft-tokens`, `--no-mtp`, `--mtp-from`) and the one
//! place that turns them into a loaded MTP head and a draft length.

use crate::hub::{resolve_mtp_from, MtpSource};
use crate::ui::output::eprint_line;
use anyhow::{bail, Result};
use qwen_gdn_model::{Model, MtpPrecision};
use std::path::Path;

/// Draft tokens per step when only `--mtp-from` asks for speculation.
const DEFAULT_DRAFT_TOKENS: usize = 2;

#[derive(clap::Args)]
pub struct SpeculationArgs {
    /// Speculative decoding with the checkpoint's multi-token-prediction head: draft N tokens
    /// per step and verify them in one forward pass (greedy: the same text as without; at
    /// --temp > 0 speculative sampling, the same distribution)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=16))]
    draft_tokens: Option<u16>,
    /// Never use the MTP head (overrides --draft-tokens and --mtp-from)
    #[arg(long)]
    no_mtp: bool,
    /// Take the MTP head from this checkpoint folder or Hub repo (the original checkpoint of a
    /// conversion that dropped it): only its mtp.* tensors' byte ranges are fetched, and cached
    /// in the Hugging Face cache. Turns speculation on (2 draft tokens unless --draft-tokens);
    /// a repo without a head is reported and generation goes on without speculation, unless
    /// --draft-tokens asked for it
    #[arg(long, value_name = "FOLDER|REPO")]
    mtp_from: Option<String>,
    /// Keep the --mtp-from head's matrices as stored (bf16) rather than quantizing them on load
    /// to the main checkpoint's bits
    #[arg(long, requires = "mtp_from")]
    mtp_keep_dtype: bool,
}

impl SpeculationArgs {
    /// Loads the head the flags ask for into `model` and returns the draft length, or `None`
    /// for plain decoding.
    pub fn load(&self, model: &mut Model, checkpoint: &Path) -> Result<Option<usize>> {
        if self.no_mtp || (self.draft_tokens.is_none() && self.mtp_from.is_none()) {
            return Ok(None);
        }
        let k = self.draft_tokens.map_or(DEFAULT_DRAFT_TOKENS, usize::from);
        let required = self.draft_tokens.is_some();
        let (dir, flag) = match &self.mtp_from {
            None => (checkpoint.to_path_buf(), "--draft-tokens"),
            Some(source) => match resolve_mtp_from(source)? {
                MtpSource::Folder(dir) => (dir, "--mtp-from"),
                MtpSource::Absent(why) if required => {
                    bail!("--mtp-from: {why}, and --draft-tokens asks for speculation")
                }
                MtpSource::Absent(why) => {
                    eprint_line(&format!(
                        "--mtp-from: {why}; generating without speculation"
                    ));
                    return Ok(None);
                }
            },
        };
        // The checkpoint's own head is used as it is; one from elsewhere matches the main
        // checkpoint's bits unless asked otherwise.
        let precision = match self.mtp_from.is_some() && !self.mtp_keep_dtype {
            true => MtpPrecision::MainBits,
            false => MtpPrecision::AsStored,
        };
        if model.load_mtp_with(&dir, precision)? {
            return Ok(Some(k));
        }
        if !required {
            eprint_line(&format!(
                "--mtp-from: {} has no MTP head (mtp.* tensors); generating without speculation",
                dir.display()
            ));
            return Ok(None);
        }
        bail!(
            "{flag}: {} has no MTP head (mtp.* tensors); run without it or with --no-mtp",
            dir.display()
        )
    }
}
