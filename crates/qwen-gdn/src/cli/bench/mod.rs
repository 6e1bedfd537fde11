//! `qwen-gdn bench`: prompt-processing and generation speed, in the spirit of llama-bench and
//! mlx_lm.benchmark. A seeded random prompt of `-p` token ids is prefilled in chunks (the last
//! chunk through the output head, so the first token is sampled from it), then `-g` tokens are
//! decoded greedily one at a time. One warm-up repetition (not reported), then `-r` timed ones;
//! each starts from an empty cache.

mod batch;
mod common;
mod decode_profile;
use decode_profile::Profiled;
mod prefill_profile;
mod prompt_cache;
mod random_weights;
mod speculative;
mod verify_cost;

use crate::cli::speculation_args::SpeculationArgs;
use crate::load::{positive_usize, ModelArgs};
use crate::ui::output::emit;
use anyhow::{bail, Context, Result};
use common::{
    backend_name, checkpoint_size, display_name, gdn_state_dtype, greedy, human_size,
    markdown_table, token_bound, Stats, PROMPT_SEED,
};
use qwen_gdn_model::{Model, StateDtype};
use rand::{rngs::StdRng, Rng, SeedableRng};
use serde_json::json;
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[derive(clap::Args)]
#[command(
    allow_negative_numbers = true,
    after_help = "\
The prompt is -p random token ids (fixed seed, below the tokenizer's special tokens). Prompt speed \
is -p tokens over the time to prefill them and compute the logits of the last one; generation \
speed is -g tokens over the time of -g greedy single-token decode steps right after the prompt \
(at context depth -p, as mlx_lm.benchmark does; llama-bench's tg starts from an empty context). \
Each repetition starts from an empty cache; one warm-up repetition runs first and is not \
reported. The table shows the median ± the sample standard deviation and the min – max over \
the repetitions.

--json prints one object:
  model              --model as given (with --random-weights, the --config path)
  model_type         config.json's model_type
  size_bytes         total size of the checkpoint's *.safetensors files (with \
                     --random-weights, 0: there is none)
  backend            \"cpu\", \"cuda\" or \"metal\" (--device)
  prompt_tokens      -p
  gen_tokens         -g
  repetitions        -r (timed repetitions; the warm-up is not counted)
  prefill_chunk_size --prefill-chunk-size
  gdn_state_dtype    \"f32\" or \"bf16\"
  prompt_tps         {median, stddev, min, max, samples}: prompt tokens per second
  generation_tps     {median, stddev, min, max, samples}: generated tokens per second
  peak_memory_bytes  on a GPU, its peak allocated memory (sampled before each host sync; \
                     on CUDA the device's used memory); on the CPU the process's peak resident \
                     set size (getrusage), loading included
  peak_memory_source \"gpu\" or \"rss\": which of the two peak_memory_bytes is
  prefill_profile    with --profile: the time of each prefill phase
  batch              with --batch (instead of prefill_chunk_size, gdn_state_dtype, \
                     prompt_tps, generation_tps): per batch size {batch, aggregate_tps, \
                     per_sequence_tps}, each {median, stddev, min, max, samples}
  speculative        with --draft-tokens N|auto (or --mtp-from): the tg test again with \
                     speculative decoding: {draft_tokens (N or \"auto\"), generation_tps \
                     {median, stddev, min, max, samples}, speedup (its median over \
                     generation_tps's), acceptance (accepted over drafted), tokens_per_step, \
                     mean_draft_tokens, steps, drafted, accepted, steps_at (steps per draft \
                     length, index = length), same_tokens (whether the greedy tokens are plain \
                     decoding's)}
  verify_cost        with --verify-cost K: {pass_seconds (per k = 0..K, {median, stddev, \
                     min, max, samples}), pass_launches, pass_read_backs (per k: one \
                     pass's kernel launches and host reads, the logits' included), fused \
                     (the fused verify pass, else the composed one: QWEN_GDN_VERIFY), \
                     ratio_to_one_token (t(k+1)/t(1)), tg_step_seconds, \
                     output_head_seconds, draft_call_estimate_seconds, projected_tps (per k: \
                     tps at acceptances 0.6, 0.7, 0.8, 0.9)}
  decode_profile     with --profile-decode: every kernel of one decode step (op, layer, \
                     label, grids, seconds, bytes read and written, bytes per second, percent \
                     of the copy bandwidth), sums by op and by layer kind, the copy bandwidth, \
                     the step's wall time and launch counts
  verify_profile     with --profile-verify T: the same for one verify pass of T tokens
  batch_profile      with --profile-batch B: the same for one batched step of B sequences \
                     (its `sequences`)
(samples: one value per timed repetition, in order; stddev: sample standard deviation, 0 for \
one repetition).

Without a checkpoint: --config <config.json> --random-weights times the model the config \
describes with random weights of its real shapes and quantized layouts (--seed, and for \
qwen4_exp --ngram-rows); the prompt is -p random ids below the vocabulary size."
)]
// --model is optional here: --config with --random-weights replaces it (`random_weights.rs`
// refuses both or neither in one line).
#[command(mut_arg("model", |a| a.required(false).default_value("").hide_default_value(true)))]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    random: random_weights::RandomWeightArgs,
    /// Prompt length in tokens (the pp test)
    #[arg(short = 'p', long, default_value_t = 512, value_name = "N", value_parser = positive_usize)]
    prompt_tokens: usize,
    /// Tokens to generate after the prompt (the tg test)
    #[arg(short = 'g', long, default_value_t = 128, value_name = "N", value_parser = positive_usize)]
    gen_tokens: usize,
    /// Timed repetitions, after one warm-up
    #[arg(short = 'r', long, default_value_t = 3, value_name = "N", value_parser = positive_usize)]
    repetitions: usize,
    /// Print one JSON object (keys below) instead of the table
    #[arg(long)]
    json: bool,
    /// The prompt-cache scenario instead of pp/tg: time to first token of a -p-token request
    /// that shares its first N tokens with an earlier one (resumed from the prompt cache),
    /// against the same request with an empty cache (-g is not used)
    #[arg(long, value_name = "N", value_parser = positive_usize,
          conflicts_with_all = ["draft_tokens", "mtp_from"])]
    prompt_cache: Option<usize>,
    /// After the timed repetitions, one more prefill of the prompt with the device drained
    /// around every phase of every layer, and the time of each phase printed to stderr (and
    /// as `prefill_profile` in --json). The profiled run is slower; the reported speeds are
    /// not affected
    #[arg(long)]
    profile: bool,
    /// After the timed repetitions, one more fused decode step at depth -p, run eagerly (not
    /// replayed from a CUDA graph) with each kernel timed alone, its bytes, bandwidth and
    /// grid printed to stderr with sums per op and per layer kind, against the device's
    /// measured copy bandwidth (and as `decode_profile` in --json). Needs the fused decode
    /// step (a GPU, or --dtype bf16 on the CPU)
    #[arg(long, conflicts_with = "prompt_cache")]
    profile_decode: bool,
    /// After the timed repetitions, one verify pass of speculative decoding of T tokens (the
    /// step's token and T − 1 drafts) at depth -p, profiled as --profile-decode profiles a
    /// step: run eagerly, each kernel timed alone (`verify_profile` in --json). Needs the
    /// fused verify pass (a hybrid model on a GPU, or --dtype bf16 on the CPU)
    #[arg(long, value_name = "T", value_parser = positive_usize,
          conflicts_with_all = ["prompt_cache", "batch", "draft_tokens", "mtp_from", "draft_model"])]
    profile_verify: Option<usize>,
    /// After the timed repetitions, one batched decode step of B sequences (each at depth -p
    /// of its own prompt) profiled as --profile-decode profiles a step: run eagerly, each
    /// kernel timed alone (`batch_profile` in --json). Needs the fused step (a GPU, or --dtype
    /// bf16 on the CPU)
    #[arg(long, value_name = "B", value_parser = positive_usize,
          conflicts_with_all = ["prompt_cache", "batch", "draft_tokens", "mtp_from", "draft_model"])]
    profile_batch: Option<usize>,
    /// Batched decode instead of pp/tg: for each batch size of the list (e.g. 1,2,4,8,16),
    /// that many sequences of their own -p-token prompts decode -g greedy steps together;
    /// prints the aggregate and the per-sequence generation speed
    #[arg(long, value_name = "B,...", value_delimiter = ',', value_parser = positive_usize,
          conflicts_with_all = ["prompt_cache", "profile", "profile_decode", "draft_tokens", "mtp_from", "draft_model"])]
    batch: Vec<usize>,
    /// With --batch: how the batched step's products treat the rows. `each-row-alone`: every
    /// sequence gets the bits it gets alone (the CPU's default); `shared`: one product over
    /// all rows, the fewest weight reads (the GPU's default). Default: the plan's
    #[arg(long, value_enum, requires = "batch")]
    batch_products: Option<batch::ProductsArg>,
    /// With --batch or --profile-batch: how the fused batched step runs the MoE experts over
    /// the rows. `gathered`: one product per (row, expert) pair, no read-back (the default);
    /// `grouped`: the prefill's expert-grouped products, each expert read once for all the
    /// rows that chose it, after reading the routing back
    #[arg(long, value_enum)]
    batch_moe: Option<batch::MoeArg>,
    /// After the tg test: the verify pass of speculative decoding for k = 0..=K drafts timed
    /// at depth -p (its t(k+1)/t(1)), and the speed it projects at acceptances 0.6–0.9
    /// (random weights make real acceptance meaningless; this needs no MTP head)
    #[arg(long, value_name = "K", value_parser = positive_usize,
          conflicts_with_all = ["prompt_cache", "batch", "draft_tokens", "mtp_from", "draft_model"])]
    verify_cost: Option<usize>,
    /// With --draft-tokens: the tg test is run again with speculative decoding (its speed, the
    /// speedup, the acceptance)
    #[command(flatten)]
    speculation: SpeculationArgs,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let random = args.random.config(&args.model)?;
    if let Some((path, config)) = random {
        return run_random(&args, path, config);
    }
    if let Some(shared) = args.prompt_cache {
        return prompt_cache::run(
            &args.model,
            args.prompt_tokens,
            shared,
            args.repetitions,
            args.json,
        );
    }
    let checkpoint = args.model.open()?;
    let (p, g) = (args.prompt_tokens, args.gen_tokens);
    // -p and -g each go up to usize::MAX: their true sum, in u128, is what the error shows.
    let limit = &checkpoint.input_limit;
    let sum = p as u128 + g as u128;
    if sum > limit.max_tokens as u128 {
        return Err(limit.too_long(&format!("-p {p} plus -g {g}"), &format!("{sum} tokens")));
    }
    let mut model = args.model.load_model(&checkpoint, p + g)?;
    let (draft_length, drafter) =
        args.speculation
            .prepare(&mut model, &args.model, &checkpoint, p + g)?;
    let bound = token_bound(&checkpoint.tokenizer, model.config().vocab_size);
    let source = Source {
        name: args.model.model.clone(),
        size: checkpoint_size(&checkpoint.dir)?,
    };
    measure(&args, model, &source, bound, (draft_length, drafter))
}

/// Where the model came from, as the report names it.
struct Source {
    /// --model, or the --config path with --random-weights.
    name: String,
    /// Bytes of its *.safetensors files (0 with random weights).
    size: u64,
}

/// `--random-weights`: the same runs on a model of random weights (no tokenizer, no
/// speculative decoding, no prompt cache: clap refuses those with it).
fn run_random(
    args: &Args,
    path: std::path::PathBuf,
    config: qwen_gdn_model::Config,
) -> Result<ExitCode> {
    let (p, g) = (args.prompt_tokens, args.gen_tokens);
    let positions = config.max_position_embeddings;
    if p as u128 + g as u128 > positions as u128 {
        anyhow::bail!(
            "{}: -p {p} plus -g {g} is past max_position_embeddings ({positions})",
            path.display()
        );
    }
    let built = args.random.load(&args.model, path, config, p + g)?;
    for note in &built.notes {
        crate::ui::output::eprint_line(note);
    }
    let bound = u32::try_from(built.model.config().vocab_size).unwrap_or(u32::MAX);
    let source = Source {
        name: built.name,
        size: 0,
    };
    measure(
        args,
        built.model,
        &source,
        bound,
        (None, Default::default()),
    )
}

/// The timed runs and the report, whatever the model's source; prompt ids are below `bound`.
fn measure(
    args: &Args,
    mut model: Model,
    source: &Source,
    bound: u32,
    (draft_length, drafter): (
        Option<qwen_gdn_model::speculative::DraftLength>,
        qwen_gdn_model::speculative::DrafterSource,
    ),
) -> Result<ExitCode> {
    let (p, g) = (args.prompt_tokens, args.gen_tokens);
    if let Some(moe) = args.batch_moe {
        if args.batch.is_empty() && args.profile_batch.is_none() {
            bail!("--batch-moe applies to batched steps: give --batch or --profile-batch");
        }
        model.set_batch_moe(moe.into());
    }
    if args.profile_decode || args.profile_batch.is_some() {
        decode_profile::check_fused(&model)?;
    }
    if let Some(t) = args.profile_verify {
        decode_profile::check_fused_verify(&model, t, args.prompt_tokens)?;
    }
    let mut rng = StdRng::seed_from_u64(PROMPT_SEED);
    let prompt: Vec<u32> = (0..p).map(|_| rng.random_range(0..bound)).collect();
    let chunk = args.model.prefill_chunk_size;
    if !args.batch.is_empty() {
        if let Some(products) = args.batch_products {
            model.set_batch_products(products.into());
        }
        let rows = batch::run(&model, &args.batch, (p, g), bound, chunk, args.repetitions)?;
        return batch_report(args, source, &model, &rows);
    }

    repetition(&model, &prompt, g, chunk).context("warm-up repetition")?;
    let (mut pp, mut tg) = (Vec::new(), Vec::new());
    let mut plain_tokens = Vec::new();
    for i in 0..args.repetitions {
        let (prompt_time, gen_time, tokens) = repetition(&model, &prompt, g, chunk)
            .with_context(|| format!("repetition {}", i + 1))?;
        pp.push(rate(p, prompt_time));
        tg.push(rate(g, gen_time));
        plain_tokens = tokens;
    }
    let (pp, tg) = (Stats::new(pp), Stats::new(tg));
    let speculative = match &draft_length {
        Some(length) => Some(speculative::SpeculativeTg::run(
            &model,
            &prompt,
            g,
            chunk,
            args.repetitions,
            (length, &drafter),
            &plain_tokens,
        )?),
        None => None,
    };
    let verify_cost = match args.verify_cost {
        Some(k) => Some(
            verify_cost::VerifyCost::run(
                &model,
                &prompt,
                chunk,
                (k, args.repetitions.max(8)),
                tg.median,
            )
            .context("timing the verify pass (--verify-cost)")?,
        ),
        None => None,
    };
    let profile = if args.profile {
        Some(prefill_profile::profile_prefill(&model, &prompt, chunk)?)
    } else {
        None
    };
    let decode_profile = if args.profile_decode {
        Some(
            decode_profile::profile_decode(&model, &prompt, chunk, Profiled::DecodeStep)
                .context("profiling a decode step (--profile-decode)")?,
        )
    } else {
        None
    };
    let verify_profile = match args.profile_verify {
        Some(t) => Some(
            decode_profile::profile_decode(&model, &prompt, chunk, Profiled::VerifyPass(t))
                .context("profiling a verify pass (--profile-verify)")?,
        ),
        None => None,
    };
    let batch_profile = match args.profile_batch {
        Some(b) => Some(
            decode_profile::profile_decode(&model, &prompt, chunk, Profiled::BatchStep(b))
                .context("profiling a batched decode step (--profile-batch)")?,
        ),
        None => None,
    };
    let (peak, peak_source) = crate::cli::memory::peak();
    let size = source.size;
    let state_dtype = match gdn_state_dtype(&model) {
        StateDtype::F32 => "f32",
        StateDtype::Bf16 => "bf16",
    };

    if let Some(profile) = &profile {
        eprint!("{}", profile.table());
    }
    for profile in decode_profile
        .iter()
        .chain(&verify_profile)
        .chain(&batch_profile)
    {
        eprint!("{}", profile.table());
    }
    let mut out = std::io::stdout().lock();
    if args.json {
        let mut report = report_head(args, source, &model);
        report["prefill_chunk_size"] = json!(chunk);
        report["gdn_state_dtype"] = json!(state_dtype);
        report["prompt_tps"] = json!(pp);
        report["generation_tps"] = json!(tg);
        report["peak_memory_bytes"] = json!(peak);
        report["peak_memory_source"] = json!(peak_source);
        if let Some(spec) = &speculative {
            report["speculative"] = spec.json(&tg);
        }
        if let Some(cost) = &verify_cost {
            report["verify_cost"] = cost.json();
        }
        if let Some(profile) = &profile {
            report["prefill_profile"] = profile.json();
        }
        if let Some(profile) = &decode_profile {
            report["decode_profile"] = profile.json();
        }
        if let Some(profile) = &verify_profile {
            report["verify_profile"] = profile.json();
        }
        if let Some(profile) = &batch_profile {
            report["batch_profile"] = profile.json();
        }
        emit(&mut out, &format!("{report}\n"))?;
    } else {
        let name = display_name(&source.name);
        let mut rows = vec![(format!("pp{p}"), &pp), (format!("tg{g}"), &tg)];
        if let Some(spec) = &speculative {
            rows.push((spec.label(g), &spec.tps));
        }
        let text = format!(
            "{}\nt/s: median ± stddev over {} repetition(s) after 1 warm-up; tg{g} runs at depth {p}; \
             GDN state {state_dtype}; prefill chunk {chunk}\npeak memory: {:.3} GB ({peak_source})\n{}",
            table(&name, size, backend_name(model.device()), &rows),
            args.repetitions,
            peak as f64 / 1e9,
            speculative.as_ref().map_or(String::new(), |s| s.summary(&tg))
        ) + &verify_cost.as_ref().map_or(String::new(), |c| c.table());
        // A closed stdout (`| head`) is not an error, as in `generate`.
        emit(&mut out, &text)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The keys every `--json` report starts with.
fn report_head(args: &Args, source: &Source, model: &Model) -> serde_json::Value {
    json!({
        "model": source.name,
        "model_type": model.config().model_type,
        "size_bytes": source.size,
        "backend": backend_name(model.device()),
        "prompt_tokens": args.prompt_tokens,
        "gen_tokens": args.gen_tokens,
        "repetitions": args.repetitions,
    })
}

/// `--batch`'s table or JSON object.
fn batch_report(
    args: &Args,
    source: &Source,
    model: &Model,
    rows: &[batch::BatchRow],
) -> Result<ExitCode> {
    let (p, g) = (args.prompt_tokens, args.gen_tokens);
    let (peak, peak_source) = crate::cli::memory::peak();
    let size = source.size;
    let backend = backend_name(model.device());
    let mut out = std::io::stdout().lock();
    if args.json {
        let mut report = report_head(args, source, model);
        report["batch"] = json!(rows.iter().map(batch::BatchRow::json).collect::<Vec<_>>());
        report["batch_products"] = json!(format!("{:?}", model.batch_products()));
        report["batch_moe"] = json!(format!("{:?}", model.batch_moe()));
        report["dense_rows"] = json!(format!("{:?}", gdn_ops::ops::affine::dense_rows()));
        report["peak_memory_bytes"] = json!(peak);
        report["peak_memory_source"] = json!(peak_source);
        emit(&mut out, &format!("{report}\n"))?;
    } else {
        let name = display_name(&source.name);
        let labelled: Vec<(String, &Stats)> = rows
            .iter()
            .flat_map(|r| {
                [
                    (format!("tg{g} B={} aggregate", r.batch), &r.aggregate),
                    (format!("tg{g} B={} per sequence", r.batch), &r.per_sequence),
                ]
            })
            .collect();
        let text = format!(
            "{}\nt/s: median ± stddev over {} repetition(s) after 1 warm-up; each sequence at depth {p}; \
             products: {:?}, MoE: {:?}, dense rows: {:?}\npeak memory: {:.3} GB ({peak_source})\n",
            table(&name, size, backend, &labelled),
            args.repetitions,
            model.batch_products(),
            model.batch_moe(),
            gdn_ops::ops::affine::dense_rows(),
            peak as f64 / 1e9
        );
        emit(&mut out, &text)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// One repetition from an empty cache: (prompt time, generation time, the generated tokens
/// after the first).
fn repetition(
    model: &Model,
    prompt: &[u32],
    gen_tokens: usize,
    chunk: usize,
) -> Result<(Duration, Duration, Vec<u32>)> {
    let mut cache = model.new_cache();
    let start = Instant::now();
    // All chunks but the last skip the output head; the last one gives the first token.
    let chunks: Vec<&[u32]> = prompt.chunks(chunk).collect();
    let (last, head) = chunks.split_last().context("empty prompt")?;
    for part in head {
        model.prefill(part, &mut cache, chunk)?;
    }
    let mut seen = prompt.to_vec();
    let mut token = greedy(model, &model.forward_last(last, &mut cache)?, &seen, chunk)?;
    let prompt_time = start.elapsed();

    let start = Instant::now();
    for _ in 0..gen_tokens {
        seen.push(token);
        token = greedy(
            model,
            &model.forward_last(&[token], &mut cache)?,
            &seen,
            chunk,
        )?;
    }
    let gen_time = start.elapsed();
    seen.push(token);
    Ok((prompt_time, gen_time, seen.split_off(prompt.len() + 1)))
}

fn rate(tokens: usize, time: Duration) -> f64 {
    tokens as f64 / time.as_secs_f64().max(1e-9)
}

/// llama-bench's Markdown table.
fn table(model: &str, size: u64, backend: &str, rows: &[(String, &Stats)]) -> String {
    let header = ["model", "size", "backend", "test", "t/s", "min – max"];
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|(test, s)| {
            vec![
                model.to_string(),
                human_size(size),
                backend.to_uppercase(),
                test.clone(),
                format!("{:.2} ± {:.2}", s.median, s.stddev),
                format!("{:.2} – {:.2}", s.min, s.max),
            ]
        })
        .collect();
    markdown_table(&header, &body, |i| i == 1 || i >= 4)
}
