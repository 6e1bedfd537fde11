//! `qwen-gdn bench --prompt-cache N`: what the prompt cache saves. A request of -p random
//! tokens whose first N tokens an earlier request already had (a message boundary there, as a
//! shared system prompt or document gives) is timed to its first token twice: resumed from
//! the snapshot the earlier request left at N, and with an empty cache. Both go through the
//! engine that `chat` and `serve` use, so lookup, restore and snapshot copies are counted.

use super::common::{
    backend_name, checkpoint_size, display_name, gdn_state_dtype, human_size, markdown_table,
    token_bound, Stats, PROMPT_SEED,
};
use crate::engine::sampler::SamplerConfig;
use crate::engine::{Engine, GenerateParams, Outcome, PromptTokens};
use crate::load::ModelArgs;
use crate::ui::output::emit;
use anyhow::{bail, Context, Result};
use qwen_gdn_model::{PromptCache, StateDtype};
use rand::{rngs::StdRng, Rng, SeedableRng};
use serde_json::json;
use std::ops::ControlFlow;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;

pub fn run(
    model_args: &ModelArgs,
    p: usize,
    shared: usize,
    repetitions: usize,
    as_json: bool,
) -> Result<ExitCode> {
    if shared >= p {
        bail!("--prompt-cache {shared} must be less than -p {p} (the request needs tokens of its own)");
    }
    let checkpoint = model_args.open()?;
    checkpoint
        .input_limit
        .check_fits(p + 1, &format!("-p {p} plus the first token"))?;
    let model = model_args.load_model(&checkpoint, p + 1)?;
    let bound = token_bound(&checkpoint.tokenizer, model.config().vocab_size);
    let mut rng = StdRng::seed_from_u64(PROMPT_SEED);
    let mut random =
        |n: usize| -> Vec<u32> { (0..n).map(|_| rng.random_range(0..bound)).collect() };
    let earlier = random(p);
    // The same first `shared` tokens, then its own.
    let request: Vec<u32> = earlier[..shared]
        .iter()
        .copied()
        .chain(random(p - shared))
        .collect();
    let size = checkpoint_size(&checkpoint.dir)?;
    let state_dtype = match gdn_state_dtype(&model) {
        StateDtype::F32 => "f32",
        StateDtype::Bf16 => "bf16",
    };
    let (backend, model_type) = (
        backend_name(model.device()),
        model.config().model_type.clone(),
    );
    let chunk = model_args.prefill_chunk_size;
    let mut engine = Engine::new(checkpoint, model, chunk, PromptCache::new(u64::MAX), None)?;
    let earlier = PromptTokens {
        ids: earlier,
        boundaries: vec![shared],
    };
    let request = PromptTokens::plain(request);

    let mut timed = |i: Option<usize>| -> Result<(f64, f64)> {
        let what = i.map_or("warm-up".to_string(), |i| format!("repetition {}", i + 1));
        engine.prompt_cache_mut().clear();
        let cold = first_token(&mut engine, &request).with_context(|| what.clone())?;
        check(&cold, 0, p)?;
        engine.prompt_cache_mut().clear();
        first_token(&mut engine, &earlier).with_context(|| what.clone())?;
        let warm = first_token(&mut engine, &request).with_context(|| what.clone())?;
        check(&warm, shared, p - shared)?;
        let ttft = |o: &Outcome| o.prompt_time.map_or(0.0, |t| t.as_secs_f64());
        Ok((ttft(&cold), ttft(&warm)))
    };
    timed(None)?;
    let (mut cold, mut warm) = (Vec::new(), Vec::new());
    for i in 0..repetitions {
        let (c, w) = timed(Some(i))?;
        cold.push(c);
        warm.push(w);
    }
    let (cold, warm) = (Stats::new(cold), Stats::new(warm));
    let speedup = cold.median / warm.median.max(1e-12);
    let (peak, peak_source) = crate::cli::memory::peak();

    let mut out = std::io::stdout().lock();
    if as_json {
        let report = json!({
            "model": model_args.model,
            "model_type": model_type,
            "size_bytes": size,
            "backend": backend,
            "prompt_tokens": p,
            "shared_tokens": shared,
            "repetitions": repetitions,
            "prefill_chunk_size": chunk,
            "gdn_state_dtype": state_dtype,
            "cold": {"cached_tokens": 0, "prefilled_tokens": p, "ttft_seconds": cold},
            "cached": {"cached_tokens": shared, "prefilled_tokens": p - shared, "ttft_seconds": warm},
            "speedup": speedup,
            "peak_memory_bytes": peak,
            "peak_memory_source": peak_source,
        });
        emit(&mut out, &format!("{report}\n"))?;
    } else {
        let name = display_name(&model_args.model);
        let row = |test: String, prefilled: usize, s: &Stats| {
            vec![
                name.clone(),
                human_size(size),
                backend.to_uppercase(),
                test,
                prefilled.to_string(),
                format!("{:.2} ± {:.2}", s.median * 1e3, s.stddev * 1e3),
                format!("{:.2} – {:.2}", s.min * 1e3, s.max * 1e3),
            ]
        };
        let body = [
            row(format!("ttft p{p} cold"), p, &cold),
            row(format!("ttft p{p} cached {shared}"), p - shared, &warm),
        ];
        let header = [
            "model",
            "size",
            "backend",
            "test",
            "prefilled",
            "TTFT ms",
            "min – max",
        ];
        let text = format!(
            "{}\nspeed-up of the cached request: {speedup:.2}x (median TTFT, {repetitions} \
             repetition(s) after 1 warm-up); GDN state {state_dtype}; prefill chunk {chunk}\n\
             peak memory: {:.3} GB ({peak_source})\n",
            markdown_table(&header, &body, |i| i == 1 || i >= 4),
            peak as f64 / 1e9
        );
        emit(&mut out, &text)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs `prompt` to its first token (greedy).
fn first_token(engine: &mut Engine, prompt: &PromptTokens) -> Result<Outcome> {
    let params = GenerateParams {
        max_tokens: 1,
        sampler: SamplerConfig::greedy(),
        seed: Some(0),
        stop_strings: Vec::new(),
    };
    let never = AtomicBool::new(false);
    engine.generate(prompt, &params, &never, &mut |_| ControlFlow::Continue(()))
}

/// The scenario measures what it claims: the cache served exactly the shared tokens.
fn check(outcome: &Outcome, cached: usize, prefilled: usize) -> Result<()> {
    if (outcome.cached_tokens, outcome.prefilled_tokens) != (cached, prefilled) {
        bail!(
            "the prompt cache served {} tokens and {} were prefilled; expected {cached} and {prefilled}",
            outcome.cached_tokens,
            outcome.prefilled_tokens
        );
    }
    Ok(())
}
