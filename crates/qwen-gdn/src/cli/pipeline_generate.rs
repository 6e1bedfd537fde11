//! `generate` as one rank of a plan (`mpirun -n N qwen-gdn generate ...` or `--ranks N`,
//! `--parallel pipeline|experts`): every rank tokenizes the prompt and runs the same loop.
//! - pipeline: each rank holds its layers only ([`Pipeline`]), the last picks each token with
//!   the sampler and sends it to the others;
//! - experts: each rank holds every layer but only its share of the experts
//!   ([`ExpertParallel`]); every rank computes the same logits and its sampler (same seed)
//!   picks the same token, which the ranks check against each other every step.
//!
//! Rank 0 streams the text and prints the stats. The loop is the one `chat` and `serve` run over
//! ranks (ranked_turns.rs: one turn, without the prompt cache; every rank has read the prompt
//! itself, so nothing is broadcast); the plan itself is `rank_plan.rs`. A prompt cache file and
//! speculative decoding are single-process features and are refused here.

use crate::cli::generate::{encode_prompt, print_stats, Args};
use crate::cli::prompt_cache_args::PromptCacheArgs;
use crate::cli::ranked_turns::{RankSetup, RankedTurns};
use crate::engine::{FinishReason, GenerateParams, PromptTokens, ReplySink};
use crate::ui::output::emit;
use anyhow::{bail, Result};
use qwen_gdn_collective::World;
use std::ops::ControlFlow;
use std::process::ExitCode;

/// `generate`: in one process, as a pipeline stage when `mpirun` started this process among
/// several, or, with `--ranks N`, by starting `mpirun -n N` of this binary.
pub fn dispatch(args: Args) -> Result<ExitCode> {
    if let Some(ranks) = args.ranks.ranks {
        return crate::cli::ranks::spawn_ranks(ranks, args.model.device);
    }
    match crate::cli::ranks::launched_world(args.ranks.rank_timeout)? {
        Some(world) => run(&args, world),
        None => crate::cli::generate::run(args),
    }
}

fn run(args: &Args, world: World) -> Result<ExitCode> {
    if args.prompt_cache_file.is_some() {
        bail!("--prompt-cache-file is not supported over ranks yet");
    }
    if args.speculation.requested() {
        bail!("speculative decoding is not supported over ranks yet");
    }
    let checkpoint = args.model.open()?;
    let limit = &checkpoint.input_limit;
    let (prompt, what) = args.prompt.read(limit)?;
    let ids = encode_prompt(args, &checkpoint, &prompt, &what)?;
    limit.check_fits(ids.len(), &what)?;
    let context = ids.len() + args.sampling.max_tokens;
    // One turn, without the prompt cache (a budget of 0 keeps nothing).
    let no_cache = PromptCacheArgs {
        prompt_cache_every: None,
        prompt_cache_bytes: Some(0),
    };
    let setup = RankSetup {
        parallel: args.ranks.parallel,
        model: &args.model,
        prompt_cache: &no_cache,
    };
    let mut turns = RankedTurns::load(&setup, &checkpoint, context, world)?;
    let params = GenerateParams {
        max_tokens: args.sampling.max_tokens,
        sampler: args.sampling.sampler(),
        seed: turns.seed(args.sampling.seed)?,
        stop_strings: Vec::new(),
    };
    let prompt = PromptTokens::plain(ids);
    if turns.rank() != 0 {
        turns.run(&checkpoint, &prompt, &params, None)?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut sink = Stdout {
        out: std::io::stdout().lock(),
        error: None,
    };
    if args.verbose {
        emit(&mut sink.out, "==========\n")?;
    }
    let outcome = turns.run(&checkpoint, &prompt, &params, Some(&mut sink))?;
    if let Some(e) = sink.error {
        return Err(e);
    }
    let mut out = sink.out;
    emit(&mut out, if args.verbose { "\n==========\n" } else { "\n" })?;
    drop(out);
    if args.verbose {
        // The end-of-sequence token is not part of the text, nor counted.
        let eos = outcome.finish == FinishReason::Stop;
        let generated = outcome.generated - usize::from(eos);
        print_stats(
            prompt.ids.len(),
            outcome.prompt_time,
            generated,
            outcome.generation_time.filter(|_| generated > 1),
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Rank 0's text on stdout. A closed stdout ends the turn on every rank; another write error
/// too, kept to be reported.
struct Stdout<'a> {
    out: std::io::StdoutLock<'a>,
    error: Option<anyhow::Error>,
}

impl ReplySink for Stdout<'_> {
    fn text(&mut self, text: &str) -> ControlFlow<()> {
        match emit(&mut self.out, text) {
            Ok(true) => ControlFlow::Continue(()),
            Ok(false) => ControlFlow::Break(()),
            Err(e) => {
                self.error = Some(e);
                ControlFlow::Break(())
            }
        }
    }

    fn cancelled(&self) -> bool {
        false
    }
}
