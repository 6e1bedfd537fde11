//! What a validated request asks of the generation worker, and what the worker sends back.

use super::error::ApiError;
use super::structured_output::OutputFormat;
use crate::text::reasoning::ReasoningMode;
use crate::tool_calls::ToolChoice;
use serde_json::{Map, Value as Json};

/// The prompt: chat messages through the model's template, or raw text (/v1/completions).
#[derive(Debug, Clone)]
pub enum Prompt {
    Chat {
        /// OpenAI messages, already normalised for the template (content parts joined).
        messages: Vec<Json>,
        /// Tool definitions shown to the template; `None` when none (or tool_choice "none").
        tools: Option<Json>,
        /// chat_template_kwargs.
        template_vars: Map<String, Json>,
        /// "required" or a named function: the prompt ends with the opening of a call and the
        /// reply is constrained to the rest of one (serve/tool_call_grammar.rs).
        tool_choice: ToolChoice,
    },
    Text(String),
}

/// Sampling settings, checked against the same ranges as `generate`'s flags.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampling {
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: usize,
    pub min_p: f32,
    pub repetition_penalty: Option<f32>,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    pub seed: Option<u64>,
}

#[derive(Debug, Clone)]
pub struct JobSpec {
    pub prompt: Prompt,
    pub max_tokens: usize,
    pub sampling: Sampling,
    /// Generation stops before the first of these appears; the text never contains them.
    pub stop: Vec<String>,
    /// Log-probabilities to report; `None`: none.
    pub logprobs: Option<LogprobRequest>,
    /// The reply is constrained to this format; `None`: free text.
    pub format: Option<OutputFormat>,
}

/// What a request asks to know of the tokens' log-probabilities.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogprobRequest {
    /// The most likely tokens to list at each position (0: only the chosen token's).
    pub top: usize,
    /// Also the prompt's tokens, teacher-forced (completions' `echo`).
    pub prompt: bool,
}

/// One token of the prompt or the reply: its text and log-probability under the model (raw
/// log_softmax, before penalties and temperature), and the most likely tokens at its place.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenScore {
    pub text: String,
    /// None for the prompt's first token, which nothing predicts.
    pub logprob: Option<f32>,
    pub top: Vec<(String, f32)>,
}

/// The log-probabilities a job reports, sent once the generation is over.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Logprobs {
    /// Every prompt token, when asked for.
    pub prompt: Option<Vec<TokenScore>>,
    /// Every generated token (an end-of-sequence token excepted: the text does not show it).
    pub generated: Vec<TokenScore>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// End of sequence, or a stop string.
    Stop,
    /// max_tokens, or the context is full.
    Length,
    /// The client went away (or the server is shutting down).
    Cancelled,
}

impl Finish {
    /// OpenAI's finish_reason (a cancelled request has no reader left to see it).
    pub fn reason(self) -> &'static str {
        match self {
            Finish::Stop | Finish::Cancelled => "stop",
            Finish::Length => "length",
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    /// Prompt tokens restored from the prompt cache instead of prefilled.
    pub cached_tokens: usize,
    pub completion_tokens: usize,
    /// What speculative decoding did for the reply (`serve --draft-tokens`); `None` when it
    /// was off for it.
    pub drafts: Option<Drafts>,
}

/// A reply's draft tokens under speculative decoding.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Drafts {
    /// Verify steps: forward passes of the model over a drafted window.
    pub steps: usize,
    /// Draft tokens the MTP head proposed.
    pub proposed: usize,
    /// Draft tokens the model accepted (each a token decided without a step of its own).
    pub accepted: usize,
}

/// The prompt as the worker saw it, sent before any text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptInfo {
    /// Tokens in the prompt (the forced opening of a call included).
    pub prompt_tokens: usize,
    /// Where the output starts with respect to thinking (from the rendered prompt).
    pub reasoning: ReasoningMode,
    /// The start of a tool call the server appended to the prompt to force one: part of the
    /// reply, which the output parser reads first.
    pub forced_opening: Option<String>,
}

/// Worker → request handler, in this order: Prompt, Text*, StopString?, Logprobs?, then Done
/// or Failed.
#[derive(Debug)]
pub enum Event {
    Prompt(PromptInfo),
    Text(String),
    /// The generation ended at this stop string (an index into [`JobSpec::stop`]), which
    /// the text does not contain (Anthropic's `stop_sequence` reports it).
    StopString(usize),
    /// When the job asked for them: before Done.
    Logprobs(Logprobs),
    Done {
        finish: Finish,
        usage: Usage,
    },
    Failed(ApiError),
}

/// What the worker measured of one job, for /metrics and the request log.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobReport {
    /// "stop", "length", "cancelled" or "error".
    pub finish: &'static str,
    pub usage: Option<Usage>,
    /// The error that failed the job.
    pub error: Option<String>,
    /// From the request's arrival in the queue to the worker taking it up.
    pub queued: std::time::Duration,
    /// From the arrival to the first text (prefill and queueing included).
    pub time_to_first_token: Option<std::time::Duration>,
    /// Tokens after the first, over the time from the first text to the end.
    pub tokens_per_second: Option<f64>,
}
