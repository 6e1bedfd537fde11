//! `qwen-gdn serve`: an HTTP server on tokio and axum that speaks three APIs: OpenAI's (as
//! vLLM and mlx_lm.server), Anthropic's Messages API and Ollama's, one module each, all
//! translated into one validated request (openai/request.rs) and run through one generation
//! path (generation.rs). Requests are validated on the async side; one worker thread owns the
//! model and runs up to `--max-batch` generations together (scheduler.rs, batch_size.rs). /metrics and the request log
//! observe all of them. The chat page at `/` (page/) talks to the OpenAI API from a browser.

mod anthropic;
mod auth;
mod backend;
mod batch_size;
mod body;
mod choices;
pub mod cli;
mod connection_cap;
mod connections;
mod dialect;
mod error;
mod generation;
mod job;
mod keep_alive;
mod metrics;
mod model_facts;
mod ollama;
mod openai;
mod page;
mod posted;
mod prompt_encoder;
mod ranked_backend;
mod request_log;
mod routes;
mod scheduler;
mod state;
mod structured_output;
mod test_hooks;
mod tool_call_grammar;

use crate::engine::Engine;
use crate::load::read_json_opt;
use crate::ui::output::eprint_line;
use anyhow::{Context, Result};
use qwen_gdn_model::speculative::DrafterSource;
use std::process::ExitCode;
use std::sync::Arc;

pub use cli::Args;

pub fn run(args: Args) -> Result<ExitCode> {
    if let Some(ranks) = args.ranks.ranks {
        ranked_backend::check_args(&args)?;
        return crate::cli::ranks::spawn_ranks(ranks, args.model.device);
    }
    // Settings first: a mistake in them is reported before the model is loaded.
    let api_key = auth::configured_key(args.api_key.as_deref())?;
    let descriptors = connection_cap::descriptor_limit();
    let cap = connection_cap::ConnectionCap::choose(args.max_connections, descriptors)?;
    let world = crate::cli::ranks::launched_world(args.ranks.rank_timeout)?;
    let checkpoint = args.model.open()?;
    let context = checkpoint.input_limit.max_tokens;
    let generation_config = read_json_opt(&checkpoint.dir.join("generation_config.json"))?;
    let (defaults, warnings) =
        openai::request::SamplingDefaults::from_generation_config(generation_config.as_ref());
    for warning in warnings {
        eprint_line(&format!("warning: {warning}"));
    }
    let mut limits = openai::request::Limits {
        defaults,
        model_names: if args.served_model_name.is_empty() {
            vec![args.model.model.clone()]
        } else {
            args.served_model_name.clone()
        },
        default_max_tokens: args.max_tokens,
        max_prompt_bytes: checkpoint.input_limit.max_bytes,
        context,
        max_choices: 1, // --max-batch, once the model is loaded
    };
    let metrics = Arc::new(metrics::Metrics::new());
    let text_log = args.log_format == request_log::LogFormat::Text;
    let (queue_size, reporting) = (args.queue_size, metrics.clone());
    let (scheduler, model) = match world {
        Some(world) => {
            let Some(backend) = ranked_backend::load(&args, checkpoint, context, world)? else {
                return Ok(ExitCode::SUCCESS); // a rank but 0: rank 0 ended the job
            };
            let model = backend.model_facts();
            let start = scheduler::Scheduler::start_reporting;
            (start(backend, 1, queue_size, reporting, text_log), model)
        }
        None => {
            let (backend, max_batch) = load_engine(&args, checkpoint, context)?;
            limits.max_choices = max_batch;
            let model = backend.model_facts();
            let start = scheduler::Scheduler::start_reporting;
            (
                start(backend, max_batch, queue_size, reporting, text_log),
                model,
            )
        }
    };
    let state = Arc::new(state::AppState {
        scheduler,
        limits,
        max_request_bytes: args.max_request_bytes,
        body_timeout: args.body_timeout,
        metrics: metrics.clone(),
        model,
    });
    let observer = request_log::Observer {
        metrics,
        format: args.log_format,
    };
    let app = routes::router(state, api_key, observer);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port))
            .await
            .with_context(|| format!("cannot listen on {}:{}", args.host, args.port))?;
        let addr = listener.local_addr()?;
        eprint_line(&format!(
            "qwen-gdn serve: at most {} connections ({}), {} more for /health; timeouts: \
             headers {} s, body {} s, keep-alive {} s",
            cap.max,
            descriptors.map_or("no open-file limit".to_string(), |n| format!(
                "open-file limit {n}"
            )),
            cap.health_reserve,
            args.header_timeout.as_secs_f64(),
            args.body_timeout.as_secs_f64(),
            args.keep_alive_timeout.as_secs_f64(),
        ));
        eprint_line(&format!(
            "qwen-gdn serve: {} on http://{addr}/v1 (OpenAI, Anthropic /v1/messages), \
             http://{addr}/api (Ollama), http://{addr}/metrics, chat page http://{addr}/ \
             (Ctrl-C stops)",
            args.model.model
        ));
        let timeouts = connections::Timeouts {
            header: args.header_timeout,
            keep_alive: args.keep_alive_timeout,
        };
        connections::serve(
            listener,
            app,
            routes::health_only(cap.max),
            cap,
            timeouts,
            shutdown_signal(),
        )
        .await;
        anyhow::Ok(())
    })?;
    eprint_line("qwen-gdn serve: stopped");
    Ok(ExitCode::SUCCESS)
}

/// The model and its engine in this process, as the server's backend, and --max-batch (or the
/// default for the memory left).
fn load_engine(
    args: &Args,
    checkpoint: crate::load::Checkpoint,
    context: usize,
) -> Result<(backend::EngineBackend, usize)> {
    let mut model = args.model.load_model(&checkpoint, context)?;
    let (draft_length, drafter) =
        args.speculation
            .prepare(&mut model, &args.model, &checkpoint, context)?;
    let compile_time = model.warm_up()?;
    if !compile_time.is_zero() {
        eprint_line(&format!(
            "Warm-up (GPU kernel compilation): {:.3} s",
            compile_time.as_secs_f64()
        ));
    }
    let device = model.device().clone();
    let max_batch = max_batch(args.max_batch, &model, &device, context);
    let mut engine = Engine::new(
        checkpoint,
        model,
        args.model.prefill_chunk_size,
        args.prompt_cache.prompt_cache(&device),
        args.prompt_cache.prompt_cache_every,
    )?;
    if let Some(length) = &draft_length {
        // `--draft-model` of an MTP drafter folder lends a head, not a model.
        let with = match (&drafter, &args.speculation.draft_model) {
            (DrafterSource::Model { .. }, Some(source)) => format!("the draft model {source}"),
            _ => "the MTP head".to_string(),
        };
        eprint_line(&format!(
            "qwen-gdn serve: speculative decoding with {with}, {length} (a request alone in \
             the batch)"
        ));
    }
    engine.set_drafter(drafter);
    engine.set_draft_length(draft_length)?;
    Ok((backend::EngineBackend::new(engine)?, max_batch))
}

/// `--max-batch`, or the default for the memory free after loading `model` (printed).
fn max_batch(
    requested: Option<usize>,
    model: &qwen_gdn_model::Model,
    device: &candle_core::Device,
    context: usize,
) -> usize {
    let cfg = model.config();
    let context = context.min(cfg.max_position_embeddings);
    let per_sequence =
        crate::load::preflight::Need::of(cfg, context, model.gdn_state_dtype(), model.dtype())
            .caches;
    let free = crate::cli::prompt_cache_args::free_memory(device);
    let choice = batch_size::choose(requested, free, per_sequence, context);
    let line = match choice.shrunk {
        true => format!("warning: {}", choice.line),
        false => format!("qwen-gdn serve: {}", choice.line),
    };
    eprint_line(&line);
    choice.max_batch
}

/// The first Ctrl-C (or SIGTERM) stops accepting connections and lets running requests end;
/// a second one exits at once.
async fn shutdown_signal() {
    wait_for_signal().await;
    eprint_line("qwen-gdn serve: shutting down (Ctrl-C again to exit now)");
    tokio::spawn(async {
        wait_for_signal().await;
        std::process::exit(130);
    });
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = match signal(SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => return std::future::pending().await,
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
