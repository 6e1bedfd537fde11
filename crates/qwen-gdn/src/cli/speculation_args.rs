//! The speculative-decoding flags (`--draft-tokens`, `--no-mtp`, `--mtp-from`,
//! `--draft-model`), shared by `generate`, `chat`, `serve` and `bench`, the one place that
//! turns them into a drafter (a loaded MTP head, or a draft model) and a draft length, and the
//! stats line that reports what speculation did.

use crate::hub::{resolve_mtp_from, MtpSource};
use crate::ui::output::eprint_line;
use anyhow::{bail, Result};
use qwen_gdn_model::speculative::{DraftLength, DrafterSource, SpecStats, ADAPTIVE_MAX};
use qwen_gdn_model::{Model, MtpPrecision};
use std::path::Path;

/// Draft tokens per step when only `--mtp-from` asks for speculation.
const DEFAULT_DRAFT_TOKENS: usize = 2;
/// The largest fixed `--draft-tokens`.
const MAX_DRAFT_TOKENS: usize = 16;

/// `--draft-tokens`: a number, or `auto`.
#[derive(Clone, Copy, Debug, PartialEq)]
enum DraftTokens {
    Fixed(usize),
    Auto,
}

fn parse_draft_tokens(text: &str) -> Result<DraftTokens, String> {
    if text == "auto" {
        return Ok(DraftTokens::Auto);
    }
    match text.parse::<usize>() {
        Ok(n) if (1..=MAX_DRAFT_TOKENS).contains(&n) => Ok(DraftTokens::Fixed(n)),
        _ => Err(format!(
            "expected a number from 1 to {MAX_DRAFT_TOKENS}, or auto"
        )),
    }
}

#[derive(clap::Args)]
pub struct SpeculationArgs {
    /// Speculative decoding with the checkpoint's multi-token-prediction head: draft N tokens
    /// per step and verify them in one forward pass (greedy: the same text as without; at
    /// --temp > 0 speculative sampling, the same distribution). `auto` chooses N from 1 to 6
    /// before each step from the acceptance so far (docs/mtp.md)
    #[arg(long, value_name = "N|auto", value_parser = parse_draft_tokens)]
    draft_tokens: Option<DraftTokens>,
    /// Never use the MTP head (overrides --draft-tokens and --mtp-from)
    #[arg(long)]
    no_mtp: bool,
    /// Take the MTP head from this checkpoint folder or Hub repo (the original checkpoint of a
    /// conversion that dropped it): only its mtp.* tensors' byte ranges are fetched, and cached
    /// in the Hugging Face cache. A local folder may also be mlx-vlm's separate drafter
    /// (`mlx_vlm.convert --mtp`, model_type qwen4_exp_mtp, bf16 or quantized). Turns speculation on (2 draft tokens unless --draft-tokens);
    /// a repo without a head is reported and generation goes on without speculation, unless
    /// --draft-tokens asked for it
    #[arg(long, value_name = "FOLDER|REPO")]
    mtp_from: Option<String>,
    /// Keep the --mtp-from head's matrices as stored (bf16) rather than quantizing them on load
    /// to the main checkpoint's bits
    #[arg(long, requires = "mtp_from")]
    mtp_keep_dtype: bool,
    /// Draft with this separate small model (a folder or Hub repo sharing the main model's
    /// tokenizer) instead of an MTP head, as mlx-lm's --draft-model; 2 draft tokens unless
    /// --draft-tokens. mlx-vlm's MTP drafter (model_type qwen4_exp_mtp), a folder or a Hub repo,
    /// is taken as the head, as mlx-vlm's --draft-model does (the same as --mtp-from)
    #[arg(long, value_name = "FOLDER|REPO", conflicts_with_all = ["mtp_from", "no_mtp"])]
    pub draft_model: Option<String>,
}

impl SpeculationArgs {
    /// Whether the flags ask for speculation (the head may still turn out to be missing).
    pub fn requested(&self) -> bool {
        !self.no_mtp
            && (self.draft_tokens.is_some()
                || self.mtp_from.is_some()
                || self.draft_model.is_some())
    }

    /// What the flags ask for, for `model` loaded from `main` with `main_args` for runs of at
    /// most `context` positions: the draft length (`None`: plain decoding; the MTP head is
    /// loaded into `model` when it drafts) and the drafter.
    pub fn prepare(
        &self,
        model: &mut Model,
        main_args: &crate::load::ModelArgs,
        main: &crate::load::Checkpoint,
        context: usize,
    ) -> Result<(Option<DraftLength>, DrafterSource)> {
        // mlx-vlm's drafter (a folder or a Hub repo) given to --draft-model is the head, as
        // mlx-vlm takes it; asked once (a repo's config.json is fetched for it).
        let draft_is_head = match (&self.draft_model, self.no_mtp) {
            (Some(source), false) => crate::hub::names_a_drafter(source)?,
            _ => false,
        };
        let length = self.load(model, &main.dir, draft_is_head)?;
        // The draft model runs up to a step's drafts past the main model's positions.
        let drafter = self.drafter(main_args, main, context + MAX_DRAFT_TOKENS, draft_is_head)?;
        Ok((length, drafter))
    }

    /// The drafter the flags ask for: `--draft-model`'s model, loaded with `main_args`'
    /// settings for runs of at most `context` positions, or the MTP head.
    fn drafter(
        &self,
        main_args: &crate::load::ModelArgs,
        main: &crate::load::Checkpoint,
        context: usize,
        draft_is_head: bool,
    ) -> Result<DrafterSource> {
        Ok(match &self.draft_model {
            Some(source) if !draft_is_head => DrafterSource::Model {
                model: super::draft_model::load(source, main_args, main, context)?,
                prefill_chunk: main_args.prefill_chunk_size,
            },
            _ => DrafterSource::Head,
        })
    }

    /// Where the head comes from other than the main checkpoint, and the flag that named it:
    /// `--mtp-from`, or `--draft-model` of an MTP drafter (`draft_is_head`).
    fn head_source(&self, draft_is_head: bool) -> Option<(&str, &'static str)> {
        match (&self.mtp_from, &self.draft_model) {
            (Some(source), _) => Some((source, "--mtp-from")),
            (None, Some(source)) if draft_is_head => Some((source, "--draft-model")),
            _ => None,
        }
    }

    /// Loads the head the flags ask for into `model` and returns the draft length, or `None`
    /// for plain decoding (a draft model is loaded by [`SpeculationArgs::drafter`]).
    fn load(
        &self,
        model: &mut Model,
        checkpoint: &Path,
        draft_is_head: bool,
    ) -> Result<Option<DraftLength>> {
        if !self.requested() {
            return Ok(None);
        }
        let k = match self.draft_tokens {
            None => DraftLength::Fixed(DEFAULT_DRAFT_TOKENS),
            Some(DraftTokens::Fixed(n)) => DraftLength::Fixed(n),
            Some(DraftTokens::Auto) => DraftLength::adaptive(ADAPTIVE_MAX),
        };
        let head_source = self.head_source(draft_is_head);
        if self.draft_model.is_some() && head_source.is_none() {
            return Ok(Some(k)); // the draft model drafts: no head to load
        }
        let required = self.draft_tokens.is_some();
        let (dir, flag) = match head_source {
            None => (checkpoint.to_path_buf(), "--draft-tokens"),
            Some((source, flag)) => match resolve_mtp_from(source)? {
                MtpSource::Folder(dir) => (dir, flag),
                MtpSource::Absent(why) if required => {
                    bail!("{flag}: {why}, and --draft-tokens asks for speculation")
                }
                MtpSource::Absent(why) => {
                    eprint_line(&format!("{flag}: {why}; generating without speculation"));
                    return Ok(None);
                }
            },
        };
        // The checkpoint's own head is used as it is; one from elsewhere matches the main
        // checkpoint's bits unless asked otherwise (a quantized drafter's matrices stay as
        // they are: only float ones are quantized).
        let precision = match head_source.is_some() && !self.mtp_keep_dtype {
            true => MtpPrecision::MainBits,
            false => MtpPrecision::AsStored,
        };
        if model.load_mtp_with(&dir, precision)? {
            return Ok(Some(k));
        }
        if !required {
            eprint_line(&format!(
                "{flag}: {} has no MTP head (mtp.* tensors); generating without speculation",
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

/// The stats line: what was asked, the draft lengths used (when adaptive), the acceptance and
/// the tokens per verify step.
pub fn stats_line(stats: &SpecStats, length: &DraftLength) -> String {
    let used = match length {
        DraftLength::Fixed(_) => String::new(),
        DraftLength::Adaptive(_) => {
            let per_k: Vec<String> = (stats.steps_at.iter().enumerate())
                .filter(|&(_, &n)| n > 0)
                .map(|(k, n)| format!("{k}:{n}"))
                .collect();
            format!(
                ", k used {:.2} per step (k:steps {})",
                stats.mean_draft_tokens(),
                per_k.join(" ")
            )
        }
    };
    format!(
        "Speculative: {length}{used}, acceptance {:.3} ({}/{}), {:.2} tokens per verify step ({} steps)",
        stats.acceptance(),
        stats.accepted,
        stats.drafted,
        stats.tokens_per_step(),
        stats.steps
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draft_tokens_take_a_number_or_auto() {
        assert_eq!(parse_draft_tokens("auto"), Ok(DraftTokens::Auto));
        assert_eq!(parse_draft_tokens("16"), Ok(DraftTokens::Fixed(16)));
        for bad in ["0", "17", "-1", "Auto", ""] {
            assert!(parse_draft_tokens(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_stats_line_names_the_draft_lengths_used() {
        let stats = SpecStats {
            steps: 4,
            drafted: 7,
            accepted: 5,
            tokens: 9,
            drafted_at: vec![],
            accepted_at: vec![],
            steps_at: vec![0, 1, 3],
        };
        assert_eq!(
            stats_line(&stats, &DraftLength::adaptive(2)),
            "Speculative: adaptive draft tokens (1–2), k used 1.75 per step (k:steps 1:1 2:3), \
             acceptance 0.714 (5/7), 2.25 tokens per verify step (4 steps)"
        );
        assert_eq!(
            stats_line(&stats, &DraftLength::Fixed(2)),
            "Speculative: 2 draft tokens, acceptance 0.714 (5/7), 2.25 tokens per verify step (4 steps)"
        );
    }
}
