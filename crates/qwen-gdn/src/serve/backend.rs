//! The adapter between the server and the engine: renders and tokenizes a job's prompt
//! (with the message boundaries the prompt cache snapshots at), checks it against the
//! context, and adds the job's reply to the engine's running replies (continuous batching)
//! with its sampling, stop strings, constraint and cancel flag; each step of the worker is a
//! step of those replies. Everything the server needs from the engine goes through this file.

use super::choices::choice_seed;
use super::error::ApiError;
use super::job::{
    Drafts, Event, Finish, JobSpec, LogprobRequest, Logprobs, Prompt, PromptInfo, TokenScore, Usage,
};
use super::metrics::PromptCacheStats;
use super::model_facts::ModelFacts;
use super::scheduler::{prompt_text, Backend, JobId, JobOutput, JobResult};
use super::structured_output::Grammars;
use super::test_hooks;
use super::tool_call_grammar::tool_call_grammar;
use crate::engine::constraint::LogitsConstraint;
use crate::engine::logprobs::TokenLogprob;
use crate::engine::sampler::SamplerConfig;
use crate::engine::{
    isolated, render_conversation, Engine, FinishReason, GenerateParams, NewReply, Outcome,
    PromptTokens, Replies, ReplySink,
};
use crate::text::chat_template::{ChatTemplate, TemplateLimit};
use crate::text::reasoning::ReasoningMode;
use crate::text::special_tokens::special_tokens;
use crate::tool_calls::{ToolCallFormat, ToolChoice};
use anyhow::Result;
use serde_json::{Map, Value as Json};
use std::collections::HashMap;
use std::ops::ControlFlow;

/// Bytes a chat template may add around the messages and tools.
const TEMPLATE_OVERHEAD: usize = 1 << 20;

pub struct EngineBackend {
    engine: Engine,
    template: Option<ChatTemplate>,
    /// The tool-call format the template teaches (None: it shows none, so a call cannot be
    /// forced).
    call_format: Option<ToolCallFormat>,
    /// Template variables every chat gets (special tokens, enable_thinking when the
    /// vocabulary has think tags, as `generate` does); chat_template_kwargs override them.
    base_vars: Map<String, Json>,
    /// Structured output's automata, or why there are none (read from tokenizer.json).
    grammars: std::result::Result<Grammars, String>,
    /// The jobs' replies, generated together.
    replies: Replies<'static, JobId, JobSink>,
    jobs: HashMap<JobId, RunningJob>,
}

impl EngineBackend {
    pub fn new(engine: Engine) -> Result<Self> {
        let checkpoint = engine.checkpoint();
        let max_bytes = usize::try_from(checkpoint.input_limit.max_bytes).unwrap_or(usize::MAX);
        let template =
            ChatTemplate::from_dir(&checkpoint.dir, checkpoint.tokenizer_config.as_ref())?
                .map(|t| t.limit_output(max_bytes.saturating_add(TEMPLATE_OVERHEAD)));
        let mut base_vars = special_tokens(checkpoint.tokenizer_config.as_ref());
        let tokenizer = &checkpoint.tokenizer;
        if tokenizer.token_to_id("<think>").is_some() && tokenizer.token_to_id("</think>").is_some()
        {
            base_vars.insert("enable_thinking".into(), true.into());
        }
        let call_format = template
            .as_ref()
            .and_then(|t| ToolCallFormat::detect(&t.source()));
        let grammars = Grammars::new(&checkpoint.dir, engine.eos()).map_err(|e| format!("{e:#}"));
        Ok(Self {
            engine,
            template,
            call_format,
            base_vars,
            grammars,
            replies: Replies::new(),
            jobs: HashMap::new(),
        })
    }

    /// The prompt's tokens, what the output parser must know about its end, and the grammar of
    /// the call when `tool_choice` forces one (serve/tool_call_grammar.rs).
    /// `structured`: the reply is constrained to a format, so an open thinking block is closed
    /// (the constraint starts with the answer).
    fn encode(
        &self,
        prompt: &Prompt,
        structured: bool,
    ) -> Result<(PromptTokens, PromptInfo, Option<String>), ApiError> {
        let checkpoint = self.engine.checkpoint();
        let (limit, tokenizer) = (&checkpoint.input_limit, &checkpoint.tokenizer);
        let too_long = |e: anyhow::Error| ApiError::context_length(format!("{e:#}"));
        let (mut tokens, text, tool_choice, tools) = match prompt {
            Prompt::Text(text) => {
                // Tokenizes at most about a context's worth before giving up.
                limit
                    .check_tokens(tokenizer, text, "the prompt")
                    .map_err(too_long)?;
                let ids = tokenizer
                    .encode(text.as_str(), true)
                    .map_err(|e| ApiError::invalid(format!("tokenizing the prompt: {e}")))?
                    .get_ids()
                    .to_vec();
                (PromptTokens::plain(ids), text.clone(), None, None)
            }
            Prompt::Chat {
                messages,
                tools,
                template_vars,
                tool_choice,
            } => {
                let template = self.template.as_ref().ok_or_else(|| {
                    ApiError::invalid("this model has no chat template; use /v1/completions")
                })?;
                let mut vars = self.base_vars.clone();
                vars.extend(template_vars.clone());
                // A template that runs out of its limits is the server's fault (500); one that
                // refuses the messages (raise_exception, a missing field) the request's (400).
                let template_error = |e: anyhow::Error| {
                    let message = format!("the chat template failed: {e:#}");
                    if e.downcast_ref::<TemplateLimit>().is_some() {
                        ApiError::internal(message)
                    } else {
                        ApiError::invalid(message)
                    }
                };
                let text = template
                    .render(messages, tools.as_ref(), true, &vars)
                    .map_err(template_error)?;
                limit
                    .check_tokens(tokenizer, &text, "the prompt")
                    .map_err(too_long)?;
                let tokens =
                    render_conversation(template, tokenizer, messages, tools.as_ref(), true, &vars)
                        .map_err(template_error)?;
                (tokens, text, Some(tool_choice), tools.as_ref())
            }
        };
        let mut info = PromptInfo {
            prompt_tokens: 0,
            reasoning: match tool_choice {
                Some(_) => ReasoningMode::from_prompt(&text),
                None => ReasoningMode::Off,
            },
            forced_opening: None,
        };
        let function = match tool_choice {
            Some(ToolChoice::Required) => Some(None),
            Some(ToolChoice::Function(name)) => Some(Some(name.as_str())),
            _ => None,
        };
        let mut call_grammar = None;
        if let (Some(function), Some(format)) = (function, self.call_format) {
            // The Qwen templates have no tool_choice: a call is forced by writing its opening
            // after the generation prompt, and the rest of it is constrained to the grammar of
            // a call to the request's tools (or, with no automaton for this vocabulary, only
            // the opening is written, the function's name included). An open thinking block is
            // closed first (as the template does with thinking off), so the call is the answer.
            let mut appended = String::new();
            if text.trim_end().ends_with("<think>") {
                appended.push_str("\n</think>\n\n");
            }
            info.reasoning = ReasoningMode::from_prompt(&(text.clone() + &appended));
            let opening = if self.grammars.is_ok() {
                let tools = tools
                    .and_then(Json::as_array)
                    .map_or(&[][..], Vec::as_slice);
                call_grammar = Some(tool_call_grammar(format, tools, function));
                format.call_opening(None)
            } else {
                format.call_opening(function)
            };
            appended.push_str(&opening);
            let ids = tokenizer
                .encode(appended.as_str(), false)
                .map_err(|e| ApiError::invalid(format!("tokenizing the prompt: {e}")))?;
            tokens.ids.extend_from_slice(ids.get_ids());
            info.forced_opening = Some(opening);
        } else if structured && tool_choice.is_some() && text.trim_end().ends_with("<think>") {
            let closing = "\n</think>\n\n";
            info.reasoning = ReasoningMode::from_prompt(&(text.clone() + closing));
            let ids = tokenizer
                .encode(closing, false)
                .map_err(|e| ApiError::invalid(format!("tokenizing the prompt: {e}")))?;
            tokens.ids.extend_from_slice(ids.get_ids());
        }
        if tokens.ids.is_empty() {
            return Err(ApiError::invalid("the prompt has no tokens"));
        }
        info.prompt_tokens = tokens.ids.len();
        // At least one position must be left to generate into.
        limit
            .check_fits(tokens.ids.len() + 1, "the prompt")
            .map_err(too_long)?;
        Ok((tokens, info, call_grammar))
    }

    /// Which of `stops` ended a generation that stopped by itself: the engine drops the stop
    /// string from the text, so it is found again in the decoded tokens (the earliest one,
    /// as the engine stops at the first). None: an end-of-sequence token ended it.
    fn stop_string_hit(&self, stops: &[String], tokens: &[u32]) -> Option<usize> {
        if stops.is_empty() {
            return None;
        }
        let text = self
            .engine
            .checkpoint()
            .tokenizer
            .decode(tokens, false)
            .ok()?;
        stops
            .iter()
            .enumerate()
            .filter_map(|(i, stop)| text.find(stop.as_str()).map(|at| (at, i)))
            .min()
            .map(|(_, i)| i)
    }

    fn grammars(&self) -> Result<&Grammars, ApiError> {
        self.grammars.as_ref().map_err(|why| {
            ApiError::invalid_param(
                "response_format",
                format!("structured output is not available for this model: {why}"),
            )
        })
    }

    /// The text of one token as the reply shows it.
    fn token_text(&self, token: u32) -> String {
        let tokenizer = &self.engine.checkpoint().tokenizer;
        tokenizer.decode(&[token], false).unwrap_or_default()
    }

    fn token_score(&self, scored: &TokenLogprob) -> TokenScore {
        TokenScore {
            text: self.token_text(scored.token),
            logprob: Some(scored.logprob),
            top: scored
                .top
                .iter()
                .map(|&(t, lp)| (self.token_text(t), lp))
                .collect(),
        }
    }

    /// The log-probabilities of the reply (and with `asked.prompt` of the prompt), from one
    /// teacher-forced pass over both as `eval` makes. An end-of-sequence token is not part of
    /// the text, nor listed.
    fn logprobs(
        &self,
        prompt: &[u32],
        reply: &[u32],
        asked: LogprobRequest,
    ) -> Result<Logprobs, ApiError> {
        let ids: Vec<u32> = prompt.iter().chain(reply).copied().collect();
        let scored = self
            .engine
            .score_tokens(&ids, asked.top)
            .map_err(|e| ApiError::internal(format!("scoring the tokens failed: {e:#}")))?;
        // scored[i] is the log-probability of ids[i + 1].
        let (of_prompt, of_reply) = scored.split_at(prompt.len() - 1);
        let first = TokenScore {
            text: self.token_text(prompt[0]),
            logprob: None,
            top: vec![],
        };
        Ok(Logprobs {
            prompt: asked.prompt.then(|| {
                std::iter::once(first)
                    .chain(of_prompt.iter().map(|s| self.token_score(s)))
                    .collect()
            }),
            generated: of_reply
                .iter()
                .filter(|s| !self.engine.is_eos(s.token))
                .map(|s| self.token_score(s))
                .collect(),
        })
    }

    /// What the Ollama API's /api/tags and /api/show tell about the model.
    pub fn model_facts(&self) -> ModelFacts {
        let checkpoint = self.engine.checkpoint();
        let config = crate::load::read_json_opt(&checkpoint.dir.join("config.json"))
            .ok()
            .flatten()
            .unwrap_or_default();
        ModelFacts::read(
            &checkpoint.dir,
            &config,
            self.template.as_ref().map(|t| t.source()),
            self.call_format.is_some(),
            self.base_vars.contains_key("enable_thinking"),
        )
    }

    /// [`test_hooks::FORCE_OUTPUT_ENV`]: the forced text, sent a few characters at a time
    /// as a generation would.
    fn force_output(&self, text: &str, output: &JobOutput) -> (Finish, usize) {
        let chars: Vec<char> = text.chars().collect();
        for piece in chars.chunks(3) {
            if output.send(Event::Text(piece.iter().collect())).is_break() {
                return (Finish::Cancelled, 0);
            }
        }
        let tokens = self
            .engine
            .checkpoint()
            .tokenizer
            .encode(text, false)
            .map_or(0, |e| e.get_ids().len());
        (Finish::Stop, tokens)
    }
}

/// A running job's text and cancel check, as the engine's reply sink.
struct JobSink(JobOutput);

impl ReplySink for JobSink {
    fn text(&mut self, text: &str) -> ControlFlow<()> {
        self.0.send(Event::Text(text.to_string()))
    }

    fn cancelled(&self) -> bool {
        self.0.cancelled()
    }
}

/// What the server keeps of a running job to conclude it.
struct RunningJob {
    output: JobOutput,
    prompt: Vec<u32>,
    stop: Vec<String>,
    logprobs: Option<LogprobRequest>,
}

impl EngineBackend {
    /// The job's end from the engine's outcome: the stop string that ended it and the
    /// log-probabilities when asked for (sent as events), its finish and usage.
    fn conclude(&self, job: RunningJob, outcome: Outcome) -> JobResult {
        let usage = Usage {
            prompt_tokens: job.prompt.len(),
            cached_tokens: outcome.cached_tokens,
            completion_tokens: outcome.generated,
            drafts: outcome.speculation.as_ref().map(|s| Drafts {
                steps: s.steps,
                proposed: s.drafted,
                accepted: s.accepted,
            }),
        };
        if outcome.finish == FinishReason::Stop {
            if let Some(index) = self.stop_string_hit(&job.stop, &outcome.tokens) {
                let _ = job.output.send(Event::StopString(index));
            }
        }
        if let (Some(asked), false) = (job.logprobs, outcome.finish == FinishReason::Cancelled) {
            let logprobs = self.logprobs(&job.prompt, &outcome.tokens, asked)?;
            let _ = job.output.send(Event::Logprobs(logprobs));
        }
        let finish = match outcome.finish {
            FinishReason::Stop => Finish::Stop,
            FinishReason::Length | FinishReason::ContextFull => Finish::Length,
            FinishReason::Cancelled => Finish::Cancelled,
        };
        Ok((finish, usage))
    }
}

impl Backend for EngineBackend {
    fn admit(
        &mut self,
        job: &JobSpec,
        choices: Vec<(JobId, JobOutput)>,
    ) -> Result<Option<(Finish, Usage)>, ApiError> {
        let (prompt, info, call_grammar) = self.encode(&job.prompt, job.format.is_some())?;
        // A forced call is the whole reply: `response_format` (which shapes content) has
        // nothing left to constrain. The grammar is compiled once; each choice decodes on its
        // own copy of the automaton (its own place in the grammar).
        let grammar = match (call_grammar, &job.format) {
            (Some(grammar), _) => Some(self.grammars()?.tool_call_constraint(grammar)?),
            (None, Some(format)) => Some(self.grammars()?.constraint(format, "response_format")?),
            (None, None) => None,
        };
        let text = prompt_text(&job.prompt);
        let constraints: Vec<Option<Box<dyn LogitsConstraint>>> = choices
            .iter()
            .map(|_| match &grammar {
                Some(grammar) => {
                    Some(Box::new(grammar.independent_copy()) as Box<dyn LogitsConstraint>)
                }
                None => test_hooks::faulty_constraint(&text, self.engine.vocab_size())
                    .map(|c| Box::new(c) as Box<dyn LogitsConstraint>),
            })
            .collect();
        let mut usage = Usage {
            prompt_tokens: prompt.ids.len(),
            ..Usage::default()
        };
        let mut listening = false;
        for (_, output) in &choices {
            listening |= output.send(Event::Prompt(info.clone())).is_continue();
        }
        if !listening {
            return Ok(Some((Finish::Cancelled, usage)));
        }
        if let Some(text) = test_hooks::forced_output() {
            for (_, output) in &choices {
                let (finish, n) = self.force_output(&text, output);
                usage.completion_tokens = n;
                if finish == Finish::Cancelled {
                    return Ok(Some((finish, usage)));
                }
            }
            return Ok(Some((Finish::Stop, usage)));
        }
        let s = &job.sampling;
        let sampler = SamplerConfig {
            temp: s.temperature,
            top_p: s.top_p,
            min_p: s.min_p,
            top_k: s.top_k,
            repetition_penalty: s.repetition_penalty,
            presence_penalty: s.presence_penalty,
            frequency_penalty: s.frequency_penalty,
            repetition_context_size: 20,
        };
        let replies = choices
            .iter()
            .zip(constraints)
            .enumerate()
            .map(|(index, ((id, output), constraint))| NewReply {
                key: *id,
                params: GenerateParams {
                    max_tokens: job.max_tokens,
                    sampler: sampler.clone(),
                    seed: choice_seed(s.seed, index),
                    stop_strings: job.stop.clone(),
                },
                constraint,
                sink: JobSink(output.clone()),
            })
            .collect();
        self.replies
            .add_choices(&mut self.engine, &prompt, replies)
            .map_err(|e| ApiError::internal(format!("generation failed: {e:#}")))?;
        for (id, output) in choices {
            self.jobs.insert(
                id,
                RunningJob {
                    output,
                    prompt: prompt.ids.clone(),
                    stop: job.stop.clone(),
                    logprobs: job.logprobs,
                },
            );
        }
        Ok(None)
    }

    fn step(&mut self) -> Vec<(JobId, JobResult)> {
        let mut results = vec![];
        for (id, outcome) in self.replies.step(&mut self.engine) {
            let Some(job) = self.jobs.remove(&id) else {
                continue;
            };
            // The job's own work (its stop string, its log-probabilities' pass): a panic in it
            // fails this job alone.
            let result = outcome
                .and_then(|outcome| isolated(|| Ok(self.conclude(job, outcome))))
                .map_err(|e| ApiError::internal(format!("generation failed: {e:#}")))
                .and_then(|concluded| concluded);
            results.push((id, result));
        }
        results
    }

    /// A panic may have struck while the prompt cache was being updated: start it afresh;
    /// a step's panic may have left the running replies' caches half-written: drop them.
    fn recover(&mut self, running: bool) -> Vec<JobId> {
        self.engine.prompt_cache_mut().clear();
        if !running {
            return vec![];
        }
        self.replies = Replies::new();
        self.jobs.drain().map(|(id, _)| id).collect()
    }

    fn prompt_cache_stats(&mut self) -> Option<PromptCacheStats> {
        let cache = self.engine.prompt_cache_mut();
        Some(PromptCacheStats {
            bytes: cache.bytes(),
            budget: cache.budget(),
            entries: cache.len(),
        })
    }
}
