//! `generate` as one rank of a plan (`mpirun -n N qwen-gdn generate ...` or `--ranks N`,
//! `--parallel pipeline|experts`): every rank tokenizes the prompt and runs the same loop.
//! - pipeline: each rank holds its layers only ([`Pipeline`]), the last picks each token with
//!   the sampler and sends it to the others;
//! - experts: each rank holds every layer but only its share of the experts
//!   ([`ExpertParallel`]); every rank computes the same logits and its sampler (same seed)
//!   picks the same token, which the ranks check against each other every step.
//!
//! Rank 0 streams the text and prints the stats. The prompt cache and speculative decoding
//! are single-process features and are refused here.

use crate::cli::generate::{encode_prompt, print_stats, Args};
use crate::cli::ranks::ParallelKind;
use crate::engine::eos_ids;
use crate::engine::sampler::Sampler;
use crate::text::stream::TokenStream;
use crate::ui::output::{emit, eprint_line};
use anyhow::ensure;
use anyhow::{bail, Result};
use candle_core::Tensor;
use qwen_gdn_collective::World;
use qwen_gdn_model::expert_parallel::ExpertParallel;
use qwen_gdn_model::pipeline::Pipeline;
use qwen_gdn_model::split_plan::SplitPlan;
use qwen_gdn_model::tensor_and_experts::TensorAndExperts;
use qwen_gdn_model::tensor_parallel::TensorParallel;
use qwen_gdn_model::{Cache, Config, Model, ModelPart};
use std::process::ExitCode;
use std::time::Instant;

/// The plan this rank runs: a pipeline stage, or a share of every layer (expert or tensor
/// parallel), where every rank has the logits.
enum RankPlan {
    Pipeline(Pipeline),
    Split(Box<dyn SplitPlan>, World),
}

impl RankPlan {
    fn layout_line(&self, host: &str) -> String {
        match self {
            Self::Pipeline(p) => p.layout_line(host),
            Self::Split(e, _) => e.layout_line(host),
        }
    }

    fn rank(&self) -> usize {
        match self {
            Self::Pipeline(p) => p.rank(),
            Self::Split(e, _) => e.rank(),
        }
    }

    fn part(&self, layers: usize) -> ModelPart {
        match self {
            Self::Pipeline(p) => p.part(layers),
            Self::Split(e, _) => e.part(),
        }
    }

    /// Whether this rank has logits to pick tokens from.
    fn picks(&self) -> bool {
        match self {
            Self::Pipeline(p) => p.is_last(),
            Self::Split(..) => true,
        }
    }

    /// The sampler's seed: `asked`, or under a split plan (where every rank samples the same
    /// logits and must draw the same token) rank 0's random one, on every rank.
    fn seed(&self, asked: Option<u64>) -> Result<Option<u64>> {
        match (self, asked) {
            (Self::Split(_, world), None) => {
                Ok(Some(world.all_gather_u64(rand::random::<u64>())?[0]))
            }
            _ => Ok(asked),
        }
    }

    /// Ready `model` (loaded with [`RankPlan::part`]) and check every rank agrees on it.
    fn ready(&self, model: &mut Model) -> Result<()> {
        match self {
            Self::Pipeline(p) => p.ensure_agreement(model),
            Self::Split(e, _) => {
                e.apply(model)?;
                e.ensure_agreement(model)
            }
        }
    }

    fn prefill(
        &self,
        model: &Model,
        tokens: &[u32],
        cache: &mut Cache,
        chunk: usize,
    ) -> Result<()> {
        match self {
            Self::Pipeline(p) => p.prefill(model, tokens, cache, chunk),
            Self::Split(..) => model.prefill(tokens, cache, chunk),
        }
    }

    fn forward_last(
        &self,
        model: &Model,
        tokens: &[u32],
        cache: &mut Cache,
    ) -> Result<Option<Tensor>> {
        match self {
            Self::Pipeline(p) => p.forward_last(model, tokens, cache),
            Self::Split(..) => Ok(Some(model.forward_last(tokens, cache)?)),
        }
    }

    /// The token every rank continues with (`chosen` where this rank picked one).
    fn share_token(&self, chosen: Option<u32>) -> Result<u32> {
        match self {
            Self::Pipeline(p) => p.share_token(chosen),
            Self::Split(_, world) => {
                let token = chosen.ok_or_else(|| anyhow::anyhow!("a rank picked no token"))?;
                let all = world.all_gather_u64(u64::from(token))?;
                let differ = all.iter().position(|&t| t != u64::from(token));
                ensure!(
                    differ.is_none(),
                    "rank {} picked token {} where rank {} picked {token}: the ranks' logits differ",
                    differ.unwrap_or(0),
                    all[differ.unwrap_or(0)],
                    self.rank()
                );
                Ok(token)
            }
        }
    }
}

/// `generate`: in one process, as a pipeline stage when `mpirun` started this process among
/// several, or, with `--ranks N`, by starting `mpirun -n N` of this binary.
pub fn dispatch(args: Args) -> Result<ExitCode> {
    if let Some(ranks) = args.ranks.ranks {
        return crate::cli::ranks::spawn_under_mpirun(ranks);
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
    let pipeline = match args.ranks.parallel {
        ParallelKind::Pipeline => RankPlan::Pipeline(Pipeline::new(world, layers)?),
        ParallelKind::Experts => RankPlan::Split(
            Box::new(ExpertParallel::new(world.clone(), config.num_experts)?),
            world,
        ),
        ParallelKind::Tensor => RankPlan::Split(
            Box::new(TensorParallel::new(world.clone(), &config)?),
            world,
        ),
        ParallelKind::TensorExperts => RankPlan::Split(
            Box::new(TensorAndExperts::new(world.clone(), &config)?),
            world,
        ),
    };
    eprint_line(&pipeline.layout_line(&host_name()));
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

/// This host's name, for the layout line.
fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; the name is cut at its first NUL below.
    let ok = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } == 0;
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    match ok && end > 0 {
        true => String::from_utf8_lossy(&buf[..end]).into_owned(),
        false => "this host".into(),
    }
}
