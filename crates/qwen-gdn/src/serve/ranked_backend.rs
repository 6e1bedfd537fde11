//! The server's backend over ranks (`serve --ranks N`, or `serve` under `mpirun`): rank 0
//! renders and tokenizes each request as the one-process backend does (prompt_encoder.rs)
//! and leads it over the ranks (cli/ranked_turns.rs: the turn header with the request's
//! seed, token limit and sampling, its prompt and message boundaries; the verdict gathered
//! after each token, so that a client that went away or a stop string ends the turn on every
//! rank). Requests run one at a time, first come first served: a request is admitted and run
//! to its end in one call (no batching over ranks). What needs the model outside the turn
//! (log-probabilities' scoring pass, a constraint on the picking rank) is refused in one line.

use super::backend::{ended, sampler_config};
use super::error::ApiError;
use super::job::{Event, Finish, JobSpec, Usage};
use super::metrics::PromptCacheStats;
use super::model_facts::ModelFacts;
use super::prompt_encoder::PromptEncoder;
use super::scheduler::{Backend, JobId, JobOutput, JobResult};
use super::Args;
use crate::cli::ranked_turns::{follow_turns, RankSetup, RankedTurns};
use crate::engine::{GenerateParams, ReplySink};
use crate::load::Checkpoint;
use crate::ui::output::eprint_line;
use anyhow::{bail, Result};
use qwen_gdn_collective::World;
use std::ops::ControlFlow;

/// The flags a server over ranks refuses (checked by `--ranks` before it starts the ranks, so
/// that the line is printed once).
pub fn check_args(args: &Args) -> Result<()> {
    if args.speculation.requested() {
        bail!("speculative decoding is not supported over ranks yet");
    }
    if args.max_batch.is_some_and(|n| n > 1) {
        bail!("--max-batch: over ranks the server runs one request at a time (no batching over ranks yet)");
    }
    Ok(())
}

/// This rank's share of the model under `args`' plan over `world`: rank 0's backend, or, on
/// the other ranks, `None` once rank 0 ended the job (they run its requests until then).
pub fn load(
    args: &Args,
    checkpoint: Checkpoint,
    context: usize,
    world: World,
) -> Result<Option<RankedBackend>> {
    check_args(args)?;
    let setup = RankSetup {
        parallel: args.ranks.parallel,
        model: &args.model,
        prompt_cache: &args.prompt_cache,
    };
    let turns = RankedTurns::load(&setup, &checkpoint, context, world)?;
    if turns.rank() != 0 {
        follow_turns(&checkpoint, turns)?;
        return Ok(None);
    }
    let plan = clap::ValueEnum::to_possible_value(&args.ranks.parallel)
        .map_or_else(String::new, |v| v.get_name().to_string());
    eprint_line(&format!(
        "qwen-gdn serve: over {} ranks (--parallel {plan}), one request at a time (no batching \
         over ranks)",
        turns.world().size(),
    ));
    Ok(Some(RankedBackend::new(checkpoint, turns)?))
}

pub struct RankedBackend {
    checkpoint: Checkpoint,
    prompts: PromptEncoder,
    /// Rank 0's share of the model and its prompt cache, leading the other ranks.
    turns: RankedTurns,
    /// Set while a turn runs: a panic then leaves the ranks out of step.
    in_turn: bool,
}

impl RankedBackend {
    pub fn new(checkpoint: Checkpoint, turns: RankedTurns) -> Result<Self> {
        let prompts = PromptEncoder::new(&checkpoint, turns.eos())?;
        Ok(Self {
            checkpoint,
            prompts,
            turns,
            in_turn: false,
        })
    }

    pub fn model_facts(&self) -> ModelFacts {
        self.prompts.model_facts(&self.checkpoint)
    }
}

/// A request's text and its client's cancel, as a turn's sink.
struct OutputSink<'a>(&'a JobOutput);

impl ReplySink for OutputSink<'_> {
    fn text(&mut self, text: &str) -> ControlFlow<()> {
        self.0.send(Event::Text(text.to_string()))
    }

    fn cancelled(&self) -> bool {
        self.0.cancelled()
    }
}

/// A turn failed on rank 0: the ranks are out of step, so the job ends (the other ranks,
/// waiting in the turn, are stopped by the launcher or give up within --rank-timeout).
fn out_of_step(why: &str) -> ! {
    crate::ui::output::eprint_line(&format!("error: rank 0: {why}"));
    std::process::exit(1)
}

/// Why a request cannot run over ranks yet; `None`: it can.
fn refused(job: &JobSpec, forced_call_grammar: bool) -> Option<ApiError> {
    let (param, what) = if job.logprobs.is_some() {
        ("logprobs", "log-probabilities are")
    } else if job.format.is_some() {
        ("response_format", "structured output is")
    } else if forced_call_grammar {
        ("tool_choice", "a forced tool call is")
    } else {
        return None;
    };
    Some(ApiError::invalid_param(
        param,
        format!("{what} not available when the server runs over ranks (--ranks, mpirun)"),
    ))
}

impl Backend for RankedBackend {
    fn admit(
        &mut self,
        job: &JobSpec,
        mut choices: Vec<(JobId, JobOutput)>,
    ) -> Result<Option<(Finish, Usage)>, ApiError> {
        // Requests are validated to at most --max-batch (1 over ranks) choices.
        let (Some((_, output)), true) = (choices.pop(), choices.is_empty()) else {
            return Err(ApiError::invalid("n: one choice at a time over ranks"));
        };
        let (prompt, info, call_grammar) =
            (self.prompts).encode(&self.checkpoint, &job.prompt, job.format.is_some())?;
        if let Some(error) = refused(job, call_grammar.is_some()) {
            return Err(error);
        }
        let usage = Usage {
            prompt_tokens: prompt.ids.len(),
            ..Usage::default()
        };
        if output.send(Event::Prompt(info)).is_break() {
            return Ok(Some((Finish::Cancelled, usage)));
        }
        let params = GenerateParams {
            max_tokens: job.max_tokens,
            sampler: sampler_config(&job.sampling),
            seed: job.sampling.seed,
            stop_strings: job.stop.clone(),
        };
        // A failed turn leaves the ranks out of step: the error ends the job on every rank
        // (the others are waiting in the turn and give up within --rank-timeout).
        self.in_turn = true;
        let led = (self.turns).lead(&self.checkpoint, &prompt, &params, &mut OutputSink(&output));
        self.in_turn = false;
        let outcome = led.unwrap_or_else(|e| out_of_step(&format!("{e:#}")));
        let (finish, usage) = ended(
            &self.checkpoint,
            &output,
            &job.stop,
            usage.prompt_tokens,
            outcome,
        );
        Ok(Some((finish, usage)))
    }

    fn step(&mut self) -> Vec<(JobId, JobResult)> {
        vec![] // every request ran to its end in `admit`
    }

    /// A panic while a request was admitted: harmless while its prompt was rendered; in its
    /// turn, the ranks are out of step.
    fn recover(&mut self, _running: bool) -> Vec<JobId> {
        if self.in_turn {
            out_of_step("a request's turn panicked");
        }
        vec![]
    }

    fn prompt_cache_stats(&mut self) -> Option<PromptCacheStats> {
        Some(PromptCacheStats::of(self.turns.prompt_cache()))
    }
}
