//! `qwen-gdn chat`: an interactive conversation, like mlx_lm.chat. Each turn renders the whole
//! conversation through the chat template and hands it to the engine, whose prompt cache
//! resumes from the longest prefix it holds, so only the new tokens are prefilled. Over ranks
//! (`--ranks N`, or under `mpirun`) rank 0 runs this session and hands each turn to the ranks
//! (chat_ranks.rs).

use crate::cli::chat_args::Args;
use crate::cli::chat_command::{self, Input, HELP};
use crate::cli::chat_ranks::{rank_setup, RankedReplies};
use crate::cli::conversation::Conversation;
use crate::cli::ranked_turns::{follow_turns, RankedTurns};
use crate::cli::replier::Replier;
use crate::cli::speculation_args::stats_line;
use crate::engine::{
    render_conversation, Engine, FinishReason, GenerateParams, Outcome, PromptTokens,
};
use crate::load::Checkpoint;
use crate::text::chat_template::ChatTemplate;
use crate::ui::chat_input::{Line, LineReader};
use crate::ui::output::eprint_line;
use crate::ui::reply_display::{ReplyDisplay, ThinkingStyle};
use anyhow::{bail, Context, Result};
use qwen_gdn_model::speculative::DraftLength;
use serde_json::{Map, Value as Json};
use std::io::IsTerminal;
use std::ops::ControlFlow;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Positions the GPU memory check sizes the KV cache for: a conversation rarely comes near
/// the hundreds of thousands of positions these models declare, and checking for all of them
/// would refuse models that chat comfortably.
const PREFLIGHT_CONTEXT: usize = 32 * 1024;

/// Set while a reply is being generated; Ctrl-C then stops the reply instead of the session.
static GENERATING: AtomicBool = AtomicBool::new(false);
/// Asks the engine to stop the current reply.
static CANCEL: AtomicBool = AtomicBool::new(false);

pub fn run(args: Args) -> Result<ExitCode> {
    if let Some(ranks) = args.ranks.ranks {
        return crate::cli::ranks::spawn_ranks(ranks, args.model.device);
    }
    let world = crate::cli::ranks::launched_world(args.ranks.rank_timeout)?;
    if world.is_some() && args.speculation.requested() {
        bail!("speculative decoding is not supported over ranks yet");
    }
    if args.template.ignore_chat_template {
        bail!("--ignore-chat-template: chat renders the conversation through the chat template");
    }
    let checkpoint = args.model.open()?;
    let template = ChatTemplate::from_dir(&checkpoint.dir, checkpoint.tokenizer_config.as_ref())?
        .with_context(|| {
        format!(
            "{}: chat needs a chat template (chat_template.jinja, or chat_template in \
                 tokenizer_config.json)",
            checkpoint.dir.display()
        )
    })?;
    let max_positions = checkpoint.input_limit.max_tokens;
    let context = max_positions.min(PREFLIGHT_CONTEXT);
    let vars = args.template.vars(&checkpoint);
    let ranked = world.is_some();
    let (replier, compile_time, draft_length): (Box<dyn Replier>, _, _) = match world {
        Some(world) => {
            let turns = RankedTurns::load(&rank_setup(&args), &checkpoint, context, world)?;
            if turns.rank() != 0 {
                follow_turns(&checkpoint, turns)?;
                return Ok(ExitCode::SUCCESS);
            }
            let replies = RankedReplies::new(checkpoint, turns);
            (Box::new(replies), Duration::ZERO, None)
        }
        None => {
            let (engine, compile_time, draft_length) = load_engine(&args, checkpoint, context)?;
            (Box::new(engine), compile_time, draft_length)
        }
    };
    let mut session = Session {
        vars,
        template,
        replier,
        draft_length,
        conversation: Conversation::new(args.template.system_prompt.clone()),
        style: if args.hide_thinking {
            ThinkingStyle::Hidden
        } else if !ranked && std::io::stdout().is_terminal() {
            // (Under mpirun stdout is the launcher's pseudo-terminal whatever it writes to.)
            ThinkingStyle::Dim
        } else {
            ThinkingStyle::Plain
        },
        turns: 0,
        stdout_closed: false,
        args: &args,
    };
    install_ctrl_c()?;
    let mut reader = LineReader::new(session.replier.checkpoint().input_limit.max_bytes)?;
    let result = session.talk(&mut reader, compile_time);
    // The other ranks end with the session, however it ended.
    let ended = session.replier.end();
    result?;
    ended?;
    Ok(ExitCode::SUCCESS)
}

/// The model and its engine in this process, and the warm-up's compile time.
fn load_engine(
    args: &Args,
    checkpoint: Checkpoint,
    context: usize,
) -> Result<(Engine, Duration, Option<DraftLength>)> {
    let mut model = args.model.load_model(&checkpoint, context)?;
    let (draft_length, drafter) =
        args.speculation
            .prepare(&mut model, &args.model, &checkpoint, context)?;
    let compile_time = model.warm_up()?;
    let prompt_cache = args.prompt_cache.prompt_cache(model.device());
    let mut engine = Engine::new(
        checkpoint,
        model,
        args.model.prefill_chunk_size,
        prompt_cache,
        args.prompt_cache.prompt_cache_every,
    )?;
    engine.set_drafter(drafter);
    engine.set_draft_length(draft_length.clone())?;
    Ok((engine, compile_time, draft_length))
}

impl Session<'_> {
    /// The session's loop: a line read, a command or a message's turn, until the end.
    fn talk(&mut self, reader: &mut LineReader, compile_time: Duration) -> Result<()> {
        if reader.is_terminal() {
            if !compile_time.is_zero() {
                eprint_line(&format!(
                    "Warm-up (GPU kernel compilation): {:.3} s",
                    compile_time.as_secs_f64()
                ));
            }
            eprint_line(&format!(
                "Chatting with {}. /help lists the commands; Ctrl-C stops a reply, Ctrl-D leaves.",
                self.args.model.model
            ));
        }
        loop {
            let line = match reader.read(">> ")? {
                Line::Text(line) => line,
                Line::Interrupted | Line::End => break,
                Line::Invalid(problem) => {
                    eprint_line(&format!("error: {problem}"));
                    continue;
                }
                Line::TooLong => {
                    let limit = &self.replier.checkpoint().input_limit;
                    return Err(limit.too_long(
                        "a line of stdin",
                        &format!("more than {} bytes", limit.max_bytes),
                    ));
                }
                Line::Binary => {
                    bail!("a line of stdin holds a NUL byte: chat reads lines of text")
                }
            };
            match chat_command::parse(&line) {
                Err(problem) => eprint_line(&format!("error: {problem}")),
                Ok(Input::Nothing) => {}
                Ok(Input::Exit) => break,
                Ok(Input::Help) => eprint_line(HELP),
                Ok(Input::Reset) => {
                    self.conversation.reset();
                    eprint_line("(conversation reset)");
                }
                Ok(Input::Save(path)) => match self.conversation.save(&path) {
                    Ok(()) => eprint_line(&format!(
                        "(saved {} messages to {})",
                        self.conversation.messages().len(),
                        path.display()
                    )),
                    Err(e) => eprint_line(&format!("error: {}", one_line(&e))),
                },
                Ok(Input::Message(text)) => {
                    if let Err(e) = self.turn(&text) {
                        if self.replier.errors_end_session() {
                            return Err(e);
                        }
                        eprint_line(&format!("error: {}", one_line(&e)));
                    }
                    if self.stdout_closed {
                        break;
                    }
                }
            }
        }
        Ok(())
    }
}

struct Session<'a> {
    template: ChatTemplate,
    vars: Map<String, Json>,
    replier: Box<dyn Replier>,
    /// Speculative decoding's draft length, for the stats line.
    draft_length: Option<DraftLength>,
    conversation: Conversation,
    style: ThinkingStyle,
    turns: u64,
    /// Set once stdout is closed: the session ends after the turn that found it so.
    stdout_closed: bool,
    args: &'a Args,
}

impl Session<'_> {
    /// One exchange: the message, the streamed reply, and the reply kept in the conversation
    /// (as far as it got, when Ctrl-C stopped it). A message the model cannot take (too long
    /// for the context, refused by the template) leaves the conversation as it was.
    fn turn(&mut self, text: &str) -> Result<()> {
        self.conversation.push_user(text);
        let result = self.reply();
        if result.is_err() {
            self.conversation.pop();
        }
        result
    }

    fn reply(&mut self) -> Result<()> {
        let (prompt, thinking) = self.render()?;
        let limit = &self.replier.checkpoint().input_limit;
        let max_positions = limit.max_tokens;
        // One position is left for the reply's first token.
        limit.check_fits(prompt.ids.len() + 1, CONVERSATION)?;
        let params = GenerateParams {
            max_tokens: self.args.sampling.max_tokens,
            sampler: self.args.sampling.sampler(),
            // Each turn draws differently from the last, reproducibly; the first turn draws
            // as `generate --seed` does.
            seed: self.args.sampling.seed.map(|s| s.wrapping_add(self.turns)),
            stop_strings: Vec::new(),
        };
        self.turns += 1;
        let mut display = ReplyDisplay::new(std::io::stdout().lock(), self.style, thinking);
        let mut reply = String::new();
        let mut display_error = None;
        CANCEL.store(false, Ordering::SeqCst);
        GENERATING.store(true, Ordering::SeqCst);
        let outcome = self
            .replier
            .generate(&prompt, &params, &CANCEL, &mut |piece| {
                reply.push_str(piece);
                match display.push(piece) {
                    // stdout closed (e.g. `| head`): nobody reads the rest.
                    Ok(()) if !display.is_open() => ControlFlow::Break(()),
                    Ok(()) => ControlFlow::Continue(()),
                    Err(e) => {
                        display_error = Some(e);
                        ControlFlow::Break(())
                    }
                }
            });
        GENERATING.store(false, Ordering::SeqCst);
        let finished = display.finish();
        self.stdout_closed = !display.is_open();
        drop(display);
        let outcome = outcome?;
        if let Some(e) = display_error {
            return Err(e);
        }
        finished?;
        if outcome.generated == 0 {
            // Stopped during the prefill: nothing was said, so the message is taken back.
            self.conversation.pop();
        } else {
            self.conversation.push_assistant(&reply);
        }
        match outcome.finish {
            FinishReason::Cancelled if !self.stdout_closed => eprint_line("(reply stopped)"),
            FinishReason::Cancelled => {}
            FinishReason::ContextFull => eprint_line(&format!(
                "(the context is full: {max_positions} positions; /reset starts over)"
            )),
            FinishReason::Stop | FinishReason::Length => {}
        }
        if self.args.verbose {
            print_stats(&outcome);
            if let (Some(stats), Some(length)) = (&outcome.speculation, &self.draft_length) {
                eprint_line(&stats_line(stats, length));
            }
        }
        Ok(())
    }

    /// The conversation through the chat template, tokenized with its message boundaries
    /// (where the prompt cache snapshots), and whether the rendered prompt leaves the reply
    /// inside a thinking block (it ends with an open `<think>`).
    fn render(&self) -> Result<(PromptTokens, bool)> {
        let messages = self.conversation.messages();
        let checkpoint = self.replier.checkpoint();
        // The text is checked against the context before the boundaries are worked out (each
        // costs a rendering and a tokenization of a prefix).
        let text = self.template.render(messages, None, true, &self.vars)?;
        let thinking = text
            .rfind("<think>")
            .is_some_and(|open| text.rfind("</think>").is_none_or(|close| close < open));
        checkpoint
            .input_limit
            .check_tokens(&checkpoint.tokenizer, &text, CONVERSATION)?;
        let prompt = render_conversation(
            &self.template,
            &checkpoint.tokenizer,
            messages,
            None,
            true,
            &self.vars,
        )?;
        Ok((prompt, thinking))
    }
}

/// Names the conversation in errors about its length.
const CONVERSATION: &str = "the conversation (/reset starts over)";

/// Ctrl-C during a reply stops it (a second one leaves at once, e.g. during a long prefill);
/// anywhere else it leaves. At the line editor's prompt the terminal is in raw mode and the
/// editor reads Ctrl-C as a key instead.
fn install_ctrl_c() -> Result<()> {
    ctrlc::set_handler(|| {
        if GENERATING.load(Ordering::SeqCst) && !CANCEL.swap(true, Ordering::SeqCst) {
            return;
        }
        // 130 = interrupted by SIGINT, as shells report it.
        std::process::exit(130);
    })
    .context("installing the Ctrl-C handler")
}

/// The turn's counts and speeds, in the shape of `generate`'s stats. The prompt speed counts
/// the prefilled tokens only: the cached ones cost nothing.
fn print_stats(outcome: &Outcome) {
    let rate =
        |n: usize, t: Option<Duration>| t.map_or(0.0, |t| n as f64 / t.as_secs_f64().max(1e-9));
    eprint_line(&format!(
        "Prompt: {} tokens, {} cached, {} prefilled, {:.3} tokens-per-sec",
        outcome.prompt_tokens,
        outcome.cached_tokens,
        outcome.prefilled_tokens,
        rate(outcome.prefilled_tokens, outcome.prompt_time)
    ));
    eprint_line(&format!(
        "Generation: {} tokens, {:.3} tokens-per-sec",
        outcome.generated,
        rate(outcome.generated, outcome.generation_time)
    ));
    eprint_line(&format!(
        "Peak memory: {:.3} GB",
        crate::cli::memory::peak().0 as f64 / 1e9
    ));
}

/// An error on one line, as `main` prints them.
fn one_line(e: &anyhow::Error) -> String {
    format!("{e:#}")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}
