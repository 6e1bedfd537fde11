//! `qwen-gdn serve` flags (mlx_lm.server's and vLLM's names where they have one).

use super::request_log::LogFormat;
use crate::cli::prompt_cache_args::PromptCacheArgs;
use crate::cli::ranks::RankArgs;
use crate::cli::speculation_args::SpeculationArgs;
use crate::load::{positive_usize, ModelArgs};
use std::time::Duration;

#[derive(clap::Args)]
#[command(
    after_help = "Endpoints: OpenAI's POST /v1/chat/completions, POST /v1/completions, GET \
                  /v1/models; Anthropic's POST /v1/messages; Ollama's POST /api/chat, POST \
                  /api/generate, GET /api/tags, POST /api/show, GET /api/version; GET /metrics \
                  (Prometheus); GET /health. Up to --max-batch generations run together (continuous \
                  batching: a request joins at the next step, leaves when it ends); further \
                  requests wait in a FIFO queue of --queue-size and are answered 503 when it is \
                  full. With --draft-tokens a request decodes speculatively (the MTP head \
                  drafts, the model verifies) while it is the only one decoding, and in the \
                  batch's plain steps while others are.\nSlow and idle \
                  clients are closed after --header-timeout, --body-timeout and \
                  --keep-alive-timeout; the cap on connections is printed at start.\nWith \
                  --ranks N (or under mpirun) rank 0 serves and runs each request with the \
                  other ranks, one at a time (no batching over ranks); logprobs, \
                  response_format and forced tool calls are answered 400 there.\nCtrl-C stops \
                  accepting connections and lets running requests finish; a second Ctrl-C exits \
                  at once."
)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub prompt_cache: PromptCacheArgs,
    #[command(flatten)]
    pub speculation: SpeculationArgs,
    /// Address to listen on; 127.0.0.1 keeps the server off the network
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on; 0 picks a free one (the address is printed on stderr)
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Require `Authorization: Bearer <KEY>` on /v1/ requests; an empty key is an error
    /// [default: $QWEN_GDN_API_KEY, which keeps the key out of the process list]
    #[arg(long, value_name = "KEY")]
    pub api_key: Option<String>,
    /// Model name clients pass in `model` (repeatable) [default: the --model argument]
    #[arg(long, value_name = "NAME")]
    pub served_model_name: Vec<String>,
    /// Tokens generated when a request sets no max_tokens
    #[arg(long, default_value_t = 512, value_name = "N", value_parser = positive_usize)]
    pub max_tokens: usize,
    /// Requests decoded together, each getting the text it gets alone; a size whose
    /// sequences would not fit the free memory is shrunk to what fits, with a warning
    /// [default: half the memory free after loading over one sequence's caches at the full
    /// context, at most 64 (8 when the free memory is unknown); printed at start]
    #[arg(long, value_name = "N", value_parser = positive_usize)]
    pub max_batch: Option<usize>,
    /// Requests that may wait behind the running ones; more are answered 503
    #[arg(long, default_value_t = 16, value_name = "N", value_parser = positive_usize)]
    pub queue_size: usize,
    /// Largest request body accepted; larger ones are answered 413
    #[arg(long, default_value_t = 32 << 20, value_name = "BYTES", value_parser = positive_usize)]
    pub max_request_bytes: usize,
    /// Connections served at once; past them only /health is answered (others get 503)
    /// [default: what the open-file limit allows with room to spare, at most 1024]
    #[arg(long, value_name = "N", value_parser = positive_usize)]
    pub max_connections: Option<usize>,
    /// Seconds a client has to send a request's head (line and headers), counted from the
    /// connection's opening or its previous response; then the connection is closed
    #[arg(long, default_value = "10", value_name = "SECS", value_parser = positive_seconds)]
    pub header_timeout: Duration,
    /// Seconds a client has to send a request's whole body; then it is answered 408
    #[arg(long, default_value = "60", value_name = "SECS", value_parser = positive_seconds)]
    pub body_timeout: Duration,
    /// Seconds a kept-alive connection waits for its next request after its last response;
    /// then it is closed
    #[arg(long, default_value = "5", value_name = "SECS", value_parser = positive_seconds)]
    pub keep_alive_timeout: Duration,
    /// How requests are logged on stderr: `text`, a line per generation; `json`, one JSON
    /// object per HTTP request (method, path, status, tokens, timings)
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    // Over ranks, rank 0 serves and runs each request with the others, one at a time.
    #[command(flatten)]
    pub ranks: RankArgs,
}

/// A duration in seconds (fractions allowed), above zero and at most a day.
fn positive_seconds(s: &str) -> Result<Duration, String> {
    match s.parse::<f64>() {
        Ok(secs) if secs > 0.0 && secs <= 86_400.0 => Ok(Duration::from_secs_f64(secs)),
        _ => Err("expected a number of seconds above 0 (at most 86400)".into()),
    }
}
