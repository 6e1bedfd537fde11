//! `generate` as one rank of a plan (`mpirun -n N qwen-gdn generate ...` or `--ranks N`,
//! `--parallel pipeline|experts`): every rank tokenizes the prompt and runs the same loop.
//! - pipeline: each rank holds its layers only ([`Pipeline`]), the last picks each token with
//!   the sampler and sends it to the others;
//! - experts: each rank holds every layer but only its share of the experts
//!   ([`ExpertParallel`]); every rank computes the same logits and its sampler (same seed)
//!   picks the same token, which the ranks check against each other every step.
//!
//! Rank 0 streams the text and prints the stats. The plan itself is `rank_plan.rs`. A prompt
//! cache file and speculative decoding are single-process features and are refused here.

use crate::cli::generate::{encode_prompt, print_stats, Args};
use crate::cli::rank_plan::RankPlan;
use crate::engine::eos_ids;
use crate::engine::sampler::Sampler;
use crate::text::stream::TokenStream;
use crate::ui::output::{emit, eprint_line};
use anyhow::{bail, Result};
use qwen_gdn_collective::World;
use qwen_gdn_model::Config;
use std::process::ExitCode;
use std::time::Instant;

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
    let config = Config::from_dir(&checkpoint.dir)?;
    let layers = config.num_hidden_layers;
    let pipeline = RankPlan::new(args.ranks.parallel, world, &config)?;
    eprint_line(&pipeline.layout_line());
    let mut model = args
        .model
        .load_model_part(&checkpoint, context, pipeline.part(layers))?;
    pipeline.ready(&mut model)?;
    let eos = eos_ids(&checkpoint, &model.config().eos_token_id)?;
    let max_positions = model.config().max_position_embeddings;
    let seed = pipeline.seed(args.sampling.seed)?;
    let mut sampler = pipeline
        .picks()
        .then(|| Sampler::new(args.sampling.sampler(), seed));
    let printer = pipeline.rank() == 0;
    let mut out = std::io::stdout().lock();
    if printer && args.verbose {
        emit(&mut out, "==========\n")?;
    }

    let start = Instant::now();
    let mut cache = model.new_cache();
    let (&last, head) = ids.split_last().expect("the prompt has tokens");
    pipeline.prefill(&model, head, &mut cache, args.model.prefill_chunk_size)?;
    let mut history = ids.clone();
    let mut stream = TokenStream::new();
    let (mut next, mut generated, mut first_token_at) = (last, 0, None);
    let mut printing = printer;
    while generated < args.sampling.max_tokens && cache.offset < max_positions {
        let logits = pipeline.forward_last(&model, &[next], &mut cache)?;
        let chosen = match (logits, sampler.as_mut()) {
            (Some(logits), Some(sampler)) => {
                let mut row = logits.flatten_all()?.to_vec1::<f32>()?;
                Some(sampler.sample(&mut row, &history))
            }
            _ => None,
        };
        let token = pipeline.share_token(chosen)?;
        first_token_at.get_or_insert_with(Instant::now);
        if eos.contains(&token) {
            break;
        }
        generated += 1;
        history.push(token);
        if printing {
            if let Some(text) = stream.push(&checkpoint.tokenizer, token)? {
                // A closed stdout stops the printing, not the other ranks' loop.
                printing = emit(&mut out, &text)?;
            }
        }
        next = token;
    }
    if printer {
        if printing {
            emit(&mut out, &stream.finish(&checkpoint.tokenizer)?)?;
        }
        emit(&mut out, if args.verbose { "\n==========\n" } else { "\n" })?;
        drop(out);
        if args.verbose {
            let first = first_token_at.unwrap_or_else(Instant::now);
            print_stats(
                ids.len(),
                Some(first - start),
                generated,
                (generated > 1).then(|| first.elapsed()),
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
