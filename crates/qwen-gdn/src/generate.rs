//! `qwen-gdn generate`: mlx_lm.generate's flow. Chat-template the prompt, prefill all but the
//! last prompt token in chunks, run the last one alone (its logits give the first token), then
//! decode one token at a time, streaming the text; stats go to stderr in mlx-lm's format.

use crate::chat_template::{ChatTemplate, RESERVED_VARIABLES};
use crate::load::{positive_usize, read_json_opt, Checkpoint, ModelArgs};
use crate::output::{emit, eprint_line};
use crate::sampler::{Sampler, SamplerConfig};
use crate::stream::TokenStream;
use anyhow::{bail, Context, Result};
use candle_core::{DType, IndexOp, Tensor};
use qwen_gdn_model::{diagnose, Model};
use serde_json::{json, Map, Value as Json};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

#[derive(clap::Args)]
// Negative numbers reach the value parsers, which then say what range is allowed.
#[command(
    allow_negative_numbers = true,
    group(clap::ArgGroup::new("input").required(true).args(["prompt", "prompt_file"])),
    after_help = "The prompt must fit the model's context: a prompt longer than \
                  max_position_embeddings (config.json) is an error, and generation stops when \
                  the context is full.\nCtrl-C stops generation and still prints the stats."
)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Prompt text; `-` reads it from stdin
    #[arg(long, short = 'p')]
    prompt: Option<String>,
    /// Read the prompt from this file
    #[arg(long, value_name = "FILE")]
    prompt_file: Option<PathBuf>,
    /// System message placed before the prompt (with a chat template)
    #[arg(long)]
    system_prompt: Option<String>,
    /// Maximum number of tokens to generate
    #[arg(long, default_value_t = 256, value_name = "N", value_parser = positive_usize)]
    max_tokens: usize,
    /// Sampling temperature; 0 picks the most likely token (greedy)
    #[arg(long, default_value_t = 0.0, value_parser = non_negative)]
    temp: f32,
    /// Nucleus sampling: sample among the most likely tokens holding this much probability
    #[arg(long, default_value_t = 1.0, value_parser = probability_above_zero)]
    top_p: f32,
    /// Sample among the K most likely tokens; 0 = all
    #[arg(long, default_value_t = 0, value_name = "K")]
    top_k: usize,
    /// Drop tokens less likely than this fraction of the most likely one; 0 = off
    #[arg(long, default_value_t = 0.0, value_parser = probability)]
    min_p: f32,
    /// Penalise tokens seen in the last --repetition-context-size tokens (> 1 discourages repeats)
    #[arg(long, value_parser = positive)]
    repetition_penalty: Option<f32>,
    /// How many recent tokens --repetition-penalty looks at
    #[arg(long, default_value_t = 20, value_name = "N", value_parser = positive_usize)]
    repetition_context_size: usize,
    /// Seed of the sampler's random generator (reproducible sampling)
    #[arg(long)]
    seed: Option<u64>,
    /// Feed the prompt as raw text instead of through the model's chat template
    #[arg(long)]
    ignore_chat_template: bool,
    /// Passed to the chat template as `enable_thinking` [default: true when the vocabulary
    /// has <think>]
    #[arg(long, value_name = "true|false", value_parser = clap::value_parser!(bool))]
    enable_thinking: Option<bool>,
    /// Extra chat-template variables as a JSON object, e.g. '{"enable_thinking": false}'
    #[arg(long, alias = "chat-template-config", value_name = "JSON", value_parser = template_args)]
    chat_template_args: Option<Map<String, Json>>,
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
    verbose: bool,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let checkpoint = args.model.open()?;
    let limit = &checkpoint.input_limit;
    let (prompt, what) = limit.read(
        args.prompt.as_deref(),
        args.prompt_file.as_deref(),
        "--prompt",
    )?;
    let prompt_ids = encode_prompt(&args, &checkpoint, &prompt, &what)?;
    limit.check_fits(prompt_ids.len(), &what)?;
    let model = args
        .model
        .load_model(&checkpoint, prompt_ids.len() + args.max_tokens)?;
    // GPU shader compilation, before the prompt's clock starts; reported on its own.
    let compile_time = model.warm_up()?;
    let eos = eos_ids(&checkpoint, &model.config().eos_token_id)?;
    let mut sampler = Sampler::new(
        SamplerConfig {
            temp: args.temp,
            top_p: args.top_p,
            min_p: args.min_p,
            top_k: args.top_k,
            repetition_penalty: args.repetition_penalty,
            repetition_context_size: args.repetition_context_size,
        },
        args.seed,
    );
    let stop = ctrl_c_flag()?;
    let max_positions = model.config().max_position_embeddings;

    let mut out = std::io::stdout().lock();
    if args.verbose {
        emit(&mut out, "==========\n")?;
    }
    let mut stream = TokenStream::new(&checkpoint.tokenizer);
    let mut cache = model.new_cache();
    let (head, last) = prompt_ids.split_at(prompt_ids.len() - 1);
    let start = Instant::now();
    let mut prompt_time = None;
    let mut generated = 0usize;
    // mlx-lm's logits processors see only tokens that went through the decode step: the last
    // prompt token and the generated ones, not the prefilled chunks.
    let mut history = last.to_vec();
    'run: {
        for chunk in head.chunks(args.model.prefill_chunk_size) {
            if stop.load(Ordering::Relaxed) {
                break 'run;
            }
            model.prefill(chunk, &mut cache, chunk.len())?;
        }
        let mut logits = model.forward_last(last, &mut cache)?;
        loop {
            let mut row = last_row(&logits)?;
            if row.iter().any(|x| !x.is_finite()) {
                let seen: Vec<u32> = head.iter().chain(&history).copied().collect();
                return Err(non_finite_logits(
                    &model,
                    &seen,
                    args.model.prefill_chunk_size,
                ));
            }
            let token = sampler.sample(&mut row, &history);
            prompt_time.get_or_insert_with(|| start.elapsed());
            generated += 1; // counted even when it is EOS, as mlx-lm does
            history.push(token);
            if eos.contains(&token) {
                break;
            }
            if let Some(text) = stream.push(token)? {
                if !emit(&mut out, &text)? {
                    break 'run;
                }
            }
            if generated == args.max_tokens
                || cache.offset >= max_positions
                || stop.load(Ordering::Relaxed)
            {
                break;
            }
            logits = model.forward_last(&[token], &mut cache)?;
        }
    }
    let generation_time = prompt_time.map(|p| start.elapsed() - p);
    let frame = if args.verbose { "\n==========\n" } else { "\n" };
    emit(&mut out, &(stream.finish()? + frame))?;
    drop(out);
    if args.verbose {
        if !compile_time.is_zero() {
            eprintln!(
                "Warm-up (GPU kernel compilation): {:.3} s",
                compile_time.as_secs_f64()
            );
        }
        print_stats(prompt_ids.len(), prompt_time, generated, generation_time);
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
fn encode_prompt(
    args: &Args,
    checkpoint: &Checkpoint,
    prompt: &str,
    what: &str,
) -> Result<Vec<u32>> {
    let tokenizer = &checkpoint.tokenizer;
    let limit = &checkpoint.input_limit;
    let template = if args.ignore_chat_template {
        None
    } else {
        ChatTemplate::from_dir(&checkpoint.dir, checkpoint.tokenizer_config.as_ref())?
            // The prompt, the system prompt and what the template adds around them.
            .map(|t| {
                let system = args.system_prompt.as_ref().map_or(0, String::len);
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
            if let Some(system) = &args.system_prompt {
                messages.push(json!({"role": "system", "content": system}));
            }
            messages.push(json!({"role": "user", "content": prompt}));
            let mut vars = special_tokens(checkpoint.tokenizer_config.as_ref());
            // mlx-lm turns thinking on when the vocabulary has think tags; flags override it.
            if tokenizer.token_to_id("<think>").is_some()
                && tokenizer.token_to_id("</think>").is_some()
            {
                vars.insert("enable_thinking".into(), true.into());
            }
            vars.extend(args.chat_template_args.clone().unwrap_or_default());
            if let Some(on) = args.enable_thinking {
                vars.insert("enable_thinking".into(), on.into());
            }
            // The template already wrote the special tokens it wants.
            (template.render(&messages, None, true, &vars)?, false)
        }
        None => {
            if args.system_prompt.is_some() {
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

/// bos_token, eos_token, ... of tokenizer_config.json, which transformers passes to templates.
pub(crate) fn special_tokens(tokenizer_config: Option<&Json>) -> Map<String, Json> {
    let mut vars = Map::new();
    for key in ["bos_token", "eos_token", "unk_token", "pad_token"] {
        let value = tokenizer_config.and_then(|c| c.get(key));
        // Older files store {"content": "<s>", ...} instead of the string.
        if let Some(s) = value.and_then(|v| v.as_str().or_else(|| v.get("content")?.as_str())) {
            vars.insert(key.into(), s.into());
        }
    }
    vars
}

/// Stop tokens: generation_config.json's eos_token_id, else config.json's, else the tokenizer's
/// eos_token (mlx-lm's order).
pub(crate) fn eos_ids(checkpoint: &Checkpoint, config_eos: &[u32]) -> Result<Vec<u32>> {
    let path = checkpoint.dir.join("generation_config.json");
    if let Some(ids) = read_json_opt(&path)?.and_then(|g| g.get("eos_token_id").cloned()) {
        let ids = match &ids {
            Json::Array(list) => list.iter().map(Json::as_u64).collect::<Option<Vec<_>>>(),
            Json::Number(n) => n.as_u64().map(|n| vec![n]),
            _ => None,
        };
        let ids = ids.with_context(|| {
            format!(
                "{}: eos_token_id is not a token id or a list of them",
                path.display()
            )
        })?;
        return Ok(ids.into_iter().map(|id| id as u32).collect());
    }
    if !config_eos.is_empty() {
        return Ok(config_eos.to_vec());
    }
    let eos = special_tokens(checkpoint.tokenizer_config.as_ref()).remove("eos_token");
    Ok(eos
        .and_then(|t| checkpoint.tokenizer.token_to_id(t.as_str()?))
        .into_iter()
        .collect())
}

pub(crate) fn last_row(logits: &Tensor) -> Result<Vec<f32>> {
    let rows = logits.dim(0)?;
    Ok(logits.i(rows - 1)?.to_dtype(DType::F32)?.to_vec1()?)
}

/// The error for NaN or Inf logits after `tokens`, naming the part of the model that first
/// produced them (found by running the tokens again, part by part).
pub fn non_finite_logits(model: &Model, tokens: &[u32], chunk: usize) -> anyhow::Error {
    let origin = match diagnose::first_non_finite(model, tokens, chunk) {
        Ok(origin) => origin.to_string(),
        Err(e) => format!("unknown (re-running the model failed: {e})"),
    };
    anyhow::anyhow!(
        "the model produced NaN or Inf logits after {} tokens; first produced by {origin} \
         (broken weights, or a config.json that does not match the checkpoint)",
        tokens.len()
    )
}

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
fn print_stats(
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
        crate::memory::peak().0 as f64 / 1e9
    ));
}

fn parse_f32(s: &str) -> Result<f32, String> {
    s.parse::<f32>()
        .ok()
        .filter(|x| x.is_finite())
        .ok_or_else(|| "expected a number".into())
}

fn non_negative(s: &str) -> Result<f32, String> {
    parse_f32(s).and_then(|x| {
        if x >= 0.0 {
            Ok(x)
        } else {
            Err("must be 0 or more".into())
        }
    })
}

fn positive(s: &str) -> Result<f32, String> {
    parse_f32(s).and_then(|x| {
        if x > 0.0 {
            Ok(x)
        } else {
            Err("must be more than 0".into())
        }
    })
}

fn probability(s: &str) -> Result<f32, String> {
    parse_f32(s).and_then(|x| {
        if (0.0..=1.0).contains(&x) {
            Ok(x)
        } else {
            Err("must be between 0 and 1".into())
        }
    })
}

fn probability_above_zero(s: &str) -> Result<f32, String> {
    probability(s).and_then(|x| {
        if x > 0.0 {
            Ok(x)
        } else {
            Err("must be more than 0 and at most 1".into())
        }
    })
}

/// `--chat-template-args`: a JSON object that leaves the variables we fill in alone.
fn template_args(s: &str) -> Result<Map<String, Json>, String> {
    match serde_json::from_str(s) {
        Ok(Json::Object(map)) => match RESERVED_VARIABLES.iter().find(|k| map.contains_key(**k)) {
            Some(key) => Err(format!(
                "`{key}` is set by qwen-gdn (from --prompt and --system-prompt) and cannot be overridden"
            )),
            None => Ok(map),
        },
        Ok(_) => Err("expected a JSON object".into()),
        Err(e) => Err(format!("invalid JSON: {e}")),
    }
}
