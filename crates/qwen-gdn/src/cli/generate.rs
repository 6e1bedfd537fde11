//! `qwen-gdn generate`: mlx_lm.generate's flow. Chat-template the prompt, prefill all but the
//! last prompt token in chunks, run the last one alone (its logits give the first token), then
//! decode one token at a time, streaming the text; stats go to stderr in mlx-lm's format.

use crate::cli::prompt_args::PromptArgs;
use crate::cli::prompt_cache_file;
use crate::cli::ranks::RankArgs;
use crate::cli::sampling_args::SamplingArgs;
use crate::cli::speculation_args::{stats_line, SpeculationArgs};
use crate::cli::template_args::TemplateArgs;
use crate::engine::{Engine, GenerateParams, PromptTokens};
use crate::load::{Checkpoint, ModelArgs};
use crate::text::chat_template::ChatTemplate;
use crate::ui::output::{emit, eprint_line};
use anyhow::{bail, Context, Result};
use qwen_gdn_model::PromptCache;
use serde_json::json;
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

#[derive(clap::Args)]
// Negative numbers reach the value parsers, which then say what range is allowed.
#[command(
    allow_negative_numbers = true,
    after_help = "The prompt must fit the model's context: a prompt longer than \
                  max_position_embeddings (config.json) is an error, and generation stops when \
                  the context is full.\nCtrl-C stops generation and still prints the stats."
)]
pub struct Args {
    #[command(flatten)]
    pub(crate) model: ModelArgs,
    #[command(flatten)]
    pub(crate) prompt: PromptArgs,
    /// Start from the prompt cache this file holds (made by `qwen-gdn cache-prompt`): the
    /// prompt continues it
    #[arg(long, value_name = "FILE")]
    pub(crate) prompt_cache_file: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) sampling: SamplingArgs,
    #[command(flatten)]
    pub(crate) template: TemplateArgs,
    #[command(flatten)]
    pub(crate) speculation: SpeculationArgs,
    /// Print the ========== frame and the stats (as mlx_lm.generate); `--verbose false` prints
    /// only the text
    #[arg(
        long,
        value_name = "true|false",
        num_args = 0..=1,
        default_value_t = true,
        default_missing_value = "true",
        action = clap::ArgAction::Set,
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub(crate) verbose: bool,
    #[command(flatten)]
    pub(crate) ranks: RankArgs,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let checkpoint = args.model.open()?;
    let limit = &checkpoint.input_limit;
    let (prompt, what) = args.prompt.read(limit)?;
    let mut prompt_ids = match &args.prompt_cache_file {
        Some(path) => {
            // Before gigabytes of weights are loaded for nothing.
            prompt_cache_file::check_readable(path)?;
            prompt_cache_file::continuation(path, &args.template, &checkpoint, &prompt, &what)?
        }
        None => encode_prompt(&args, &checkpoint, &prompt, &what)?,
    };
    limit.check_fits(prompt_ids.len(), &what)?;
    let context = prompt_ids.len() + args.sampling.max_tokens;
    let mut model = args.model.load_model(&checkpoint, context)?;
    let (draft_length, drafter) =
        args.speculation
            .prepare(&mut model, &args.model, &checkpoint, context)?;
    // GPU shader compilation, before the prompt's clock starts; reported on its own.
    let compile_time = model.warm_up()?;
    // One request: a prompt cache would only copy state that is never used again, except the
    // state a --prompt-cache-file brings, which the prompt continues.
    let budget = if args.prompt_cache_file.is_some() {
        u64::MAX
    } else {
        0
    };
    let mut engine = Engine::new(
        checkpoint,
        model,
        args.model.prefill_chunk_size,
        PromptCache::new(budget),
        None,
    )?;
    engine.set_drafter(drafter);
    engine.set_draft_length(draft_length.clone())?;
    if let Some(path) = &args.prompt_cache_file {
        let cached = engine.load_prompt_cache_file(path)?;
        prompt_ids.splice(0..0, cached);
        let whole = format!("the prompt cache {} plus {what}", path.display());
        engine
            .checkpoint()
            .input_limit
            .check_fits(prompt_ids.len(), &whole)?;
    }
    let params = GenerateParams {
        max_tokens: args.sampling.max_tokens,
        sampler: args.sampling.sampler(),
        seed: args.sampling.seed,
        stop_strings: Vec::new(),
    };
    let stop = ctrl_c_flag()?;

    let mut out = std::io::stdout().lock();
    if args.verbose {
        emit(&mut out, "==========\n")?;
    }
    let mut write_error = None;
    let mut on_text = |text: &str| match emit(&mut out, text) {
        Ok(true) => ControlFlow::Continue(()),
        // stdout closed (e.g. `| head`): stop quietly.
        Ok(false) => ControlFlow::Break(()),
        Err(e) => {
            write_error = Some(e);
            ControlFlow::Break(())
        }
    };
    let outcome = engine.generate(
        &PromptTokens::plain(prompt_ids),
        &params,
        stop,
        &mut on_text,
    )?;
    if let Some(e) = write_error {
        return Err(e);
    }
    let frame = if args.verbose { "\n==========\n" } else { "\n" };
    emit(&mut out, frame)?;
    drop(out);
    if args.verbose {
        if !compile_time.is_zero() {
            eprintln!(
                "Warm-up (GPU kernel compilation): {:.3} s",
                compile_time.as_secs_f64()
            );
        }
        if let Some(path) = &args.prompt_cache_file {
            eprint_line(&format!(
                "Prompt cache: {} tokens from {}, {} prefilled",
                outcome.cached_tokens,
                path.display(),
                outcome.prefilled_tokens
            ));
        }
        print_stats(
            outcome.prompt_tokens,
            outcome.prompt_time,
            outcome.generated,
            outcome.generation_time,
        );
        if let (Some(stats), Some(length)) = (&outcome.speculation, &draft_length) {
            eprint_line(&stats_line(stats, length));
        }
    }
    // 130 = interrupted by SIGINT, as shells report it.
    Ok(if stop.load(Ordering::Relaxed) {
        ExitCode::from(130)
    } else {
        ExitCode::SUCCESS
    })
}

/// Chat-templated (unless there is no template or --ignore-chat-template) and tokenized prompt;
/// `what` names it in errors.
pub(crate) fn encode_prompt(
    args: &Args,
    checkpoint: &Checkpoint,
    prompt: &str,
    what: &str,
) -> Result<Vec<u32>> {
    let tokenizer = &checkpoint.tokenizer;
    let limit = &checkpoint.input_limit;
    let template = if args.template.ignore_chat_template {
        None
    } else {
        ChatTemplate::from_dir(&checkpoint.dir, checkpoint.tokenizer_config.as_ref())?
            // The prompt, the system prompt and what the template adds around them.
            .map(|t| {
                let system = args.template.system_prompt.as_ref().map_or(0, String::len);
                t.limit_output(
                    usize::try_from(limit.max_bytes)
                        .unwrap_or(usize::MAX)
                        .saturating_add(system)
                        .saturating_add(TEMPLATE_OVERHEAD),
                )
            })
    };
    let (text, add_special_tokens) = match template {
        Some(template) => {
            let mut messages = Vec::new();
            if let Some(system) = &args.template.system_prompt {
                messages.push(json!({"role": "system", "content": system}));
            }
            messages.push(json!({"role": "user", "content": prompt}));
            let vars = args.template.vars(checkpoint);
            // The template already wrote the special tokens it wants.
            (template.render(&messages, None, true, &vars)?, false)
        }
        None => {
            if args.template.system_prompt.is_some() {
                eprint_line("warning: --system-prompt is ignored without a chat template");
            }
            (prompt.to_string(), true)
        }
    };
    limit.check_tokens(tokenizer, &text, what)?;
    let encoding = tokenizer
        .encode(text, add_special_tokens)
        .map_err(|e| anyhow::anyhow!("tokenizing the prompt: {e}"))?;
    let ids = encoding.get_ids().to_vec();
    if ids.is_empty() {
        bail!("the prompt has no tokens");
    }
    Ok(ids)
}

/// Bytes a chat template may add around the prompt and the system prompt.
const TEMPLATE_OVERHEAD: usize = 1 << 20;

/// The first Ctrl-C asks the loop to stop (it then prints the stats); a second one exits at once,
/// e.g. while a long prefill chunk runs.
fn ctrl_c_flag() -> Result<&'static AtomicBool> {
    static STOP: AtomicBool = AtomicBool::new(false);
    ctrlc::set_handler(|| {
        if STOP.swap(true, Ordering::Relaxed) {
            std::process::exit(130);
        }
    })
    .context("installing the Ctrl-C handler")?;
    Ok(&STOP)
}

/// mlx-lm's report. Prompt speed covers prefill plus the first sampled token; generation speed
/// divides all generated tokens (the first included) by the time after the first, as mlx-lm does.
pub(crate) fn print_stats(
    prompt_tokens: usize,
    prompt_time: Option<Duration>,
    generated: usize,
    generation_time: Option<Duration>,
) {
    let rate =
        |n: usize, t: Option<Duration>| t.map_or(0.0, |t| n as f64 / t.as_secs_f64().max(1e-9));
    eprint_line(&format!(
        "Prompt: {prompt_tokens} tokens, {:.3} tokens-per-sec",
        rate(prompt_tokens, prompt_time)
    ));
    eprint_line(&format!(
        "Generation: {generated} tokens, {:.3} tokens-per-sec",
        rate(generated, generation_time)
    ));
    eprint_line(&format!(
        "Peak memory: {:.3} GB",
        crate::cli::memory::peak().0 as f64 / 1e9
    ));
}
