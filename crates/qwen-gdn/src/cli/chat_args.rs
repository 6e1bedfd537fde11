//! `qwen-gdn chat`'s flags: shared by the session (chat.rs) and, over ranks, by every rank
//! (chat_ranks.rs), which loads its part of the model and runs each turn with them.

use crate::cli::prompt_cache_args::PromptCacheArgs;
use crate::cli::ranks::RankArgs;
use crate::cli::sampling_args::SamplingArgs;
use crate::cli::speculation_args::SpeculationArgs;
use crate::cli::template_args::TemplateArgs;
use crate::load::ModelArgs;

#[derive(clap::Args)]
#[command(
    allow_negative_numbers = true,
    after_help = "Type a message and press Enter. /help lists the commands (/reset, /save \
                  <file>, /exit). Ctrl-C stops the reply being written and keeps the \
                  conversation; at the prompt, Ctrl-C or Ctrl-D leaves.\nWhen stdin is not a \
                  terminal, each line is a message or a command, and the replies (each ending \
                  with a newline) are all that goes to stdout."
)]
pub struct Args {
    #[command(flatten)]
    pub(crate) model: ModelArgs,
    #[command(flatten)]
    pub(crate) sampling: SamplingArgs,
    #[command(flatten)]
    pub(crate) template: TemplateArgs,
    #[command(flatten)]
    pub(crate) prompt_cache: PromptCacheArgs,
    #[command(flatten)]
    pub(crate) speculation: SpeculationArgs,
    /// Leave the model's thinking (<think>…</think>) out of the replies shown; it is still
    /// part of the conversation as the chat template keeps it
    #[arg(long)]
    pub(crate) hide_thinking: bool,
    /// After each reply, print the prompt tokens (cached and prefilled), the speeds, the peak
    /// memory and what speculative decoding did to stderr
    #[arg(long)]
    pub(crate) verbose: bool,
    #[command(flatten)]
    pub(crate) ranks: RankArgs,
}
