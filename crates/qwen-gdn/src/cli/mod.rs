//! The command line: one file per subcommand (`generate`, `eval`, `bench`, `cache-prompt`,
//! `chat`; `serve`'s flags are in `serve/cli.rs`), the argument structs they share, and `main`'s
//! dispatch. The flags follow `mlx_lm.generate` so that users of mlx-lm and llama.cpp feel at
//! home.

pub mod arg_ranges;
mod bench;
mod cache_prompt;
mod chat;
mod chat_args;
mod chat_command;
mod chat_ranks;
mod compare_state;
mod conversation;
pub mod draft_model;
mod eval;
mod generate;
mod memory;
mod pipeline_generate;
mod process;
mod prompt_args;
pub mod prompt_cache_args;
mod prompt_cache_file;
mod rank_plan;
pub mod ranked_turns;
pub mod ranks;
mod replier;
pub mod sampling_args;
pub mod speculation_args;
pub mod template_args;
mod turn_message;

use crate::serve;
use crate::ui::output;
use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "qwen-gdn",
    version,
    about = "Inference for Qwen3-Next / Qwen3.5 hybrid (Gated DeltaNet + attention) models"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt, streaming it to stdout (like mlx_lm.generate).
    Generate(generate::Args),
    /// Score a text teacher-forced: per-token log-probabilities and perplexity.
    Eval(eval::Args),
    /// Measure prompt and generation speed and peak memory (like llama-bench).
    Bench(bench::Args),
    /// Prefill a prompt once and save the cache to a file, for `generate --prompt-cache-file`
    /// (like mlx_lm.cache_prompt).
    CachePrompt(cache_prompt::Args),
    /// Chat with the model in the terminal, keeping the conversation (like mlx_lm.chat).
    Chat(chat_args::Args),
    /// Serve the model over an OpenAI-compatible HTTP API (like mlx_lm.server, vLLM).
    Serve(serve::Args),
}

/// The whole `qwen-gdn` binary: parse the command line, run the subcommand, print an error as
/// one line.
pub fn main() -> ExitCode {
    process::configure();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // --help and --version are "errors" to clap; they print to stdout and succeed.
        Err(e) if !e.use_stderr() => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
        // A bare `qwen-gdn` shows the help rather than a one-line error.
        Err(e) if e.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            return ExitCode::from(2);
        }
        Err(e) => {
            output::eprint_line(&format!("error: {}", clap_one_line(&e)));
            return ExitCode::from(2);
        }
    };
    let result = match cli.command {
        Command::Generate(args) => pipeline_generate::dispatch(args),
        Command::Eval(args) => eval::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Chat(args) => chat::run(args),
        Command::CachePrompt(args) => cache_prompt::run(args),
        Command::Serve(args) => serve::run(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            print_error(&e);
            ExitCode::FAILURE
        }
    }
}

/// Prints `e` as this process's last line, `error: ...`.
pub fn print_error(e: &anyhow::Error) {
    // A pipeline rank's own error is its one last line (no launcher-stop line after).
    qwen_gdn_collective::ending_with_own_line();
    // `{:#}` joins the context chain with ": "; any newline inside a message (e.g. from a
    // template error) is folded so that the error stays one line.
    output::eprint_line(&format!(
        "error: {}",
        format!("{e:#}")
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    ));
}

/// clap's errors span several lines (usage, tips); scripts and users get one line instead,
/// which still names the flag and the bad value.
fn clap_one_line(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let parts: Vec<&str> = text
        .lines()
        .map(str::trim)
        .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"))
        .filter(|l| !l.is_empty() && !l.starts_with("tip:"))
        .collect();
    parts.join(" ").trim_start_matches("error: ").to_string()
}
