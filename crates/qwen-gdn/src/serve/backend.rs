//! The adapter between the server and the engine: renders and tokenizes a job's prompt
//! (with the message boundaries the prompt cache snapshots at), checks it against the
//! context, and adds the job's reply to the engine's running replies (continuous batching)
//! with its sampling, stop strings, constraint and cancel flag; each step of the worker is a
//! step of those replies. Everything the server needs from the engine goes through this file.

use super::choices::choice_seed;
use super::error::ApiError;
use super::job::{
    Drafts, Event, Finish, JobSpec, LogprobRequest, Logprobs, Sampling, TokenScore, Usage,
};
use super::metrics::PromptCacheStats;
use super::model_facts::ModelFacts;
use super::prompt_encoder::PromptEncoder;
use super::scheduler::{prompt_text, Backend, JobId, JobOutput, JobResult};
use super::test_hooks;
use crate::engine::constraint::LogitsConstraint;
use crate::engine::logprobs::TokenLogprob;
use crate::engine::sampler::SamplerConfig;
use crate::engine::{
    isolated, Engine, FinishReason, GenerateParams, NewReply, Outcome, Replies, ReplySink,
};
use crate::load::Checkpoint;
use anyhow::Result;
use std::collections::HashMap;
use std::ops::ControlFlow;

pub struct EngineBackend {
    engine: Engine,
    /// The prompts' rendering, tokenization and constraints.
    prompts: PromptEncoder,
    /// The jobs' replies, generated together.
    replies: Replies<'static, JobId, JobSink>,
    jobs: HashMap<JobId, RunningJob>,
}

impl EngineBackend {
    pub fn new(engine: Engine) -> Result<Self> {
        let prompts = PromptEncoder::new(engine.checkpoint(), engine.eos())?;
        Ok(Self {
            engine,
            prompts,
            replies: Replies::new(),
            jobs: HashMap::new(),
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
        self.prompts.model_facts(self.engine.checkpoint())
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
        let cancelled = outcome.finish == FinishReason::Cancelled;
        let tokens = outcome.tokens.clone();
        let ended = ended(
            self.engine.checkpoint(),
            &job.output,
            &job.stop,
            job.prompt.len(),
            outcome,
        );
        if let (Some(asked), false) = (job.logprobs, cancelled) {
            let logprobs = self.logprobs(&job.prompt, &tokens, asked)?;
            let _ = job.output.send(Event::Logprobs(logprobs));
        }
        Ok(ended)
    }
}

/// A generation's end from the engine's outcome: the stop string that ended it (sent as an
/// event through `output`), its finish and usage. `stops`: the job's stop strings.
pub(super) fn ended(
    checkpoint: &Checkpoint,
    output: &JobOutput,
    stops: &[String],
    prompt_tokens: usize,
    outcome: Outcome,
) -> (Finish, Usage) {
    let usage = Usage {
        prompt_tokens,
        cached_tokens: outcome.cached_tokens,
        completion_tokens: outcome.generated,
        drafts: outcome.speculation.as_ref().map(|s| Drafts {
            steps: s.steps,
            proposed: s.drafted,
            accepted: s.accepted,
        }),
    };
    if outcome.finish == FinishReason::Stop {
        if let Some(index) = stop_string_hit(checkpoint, stops, &outcome.tokens) {
            let _ = output.send(Event::StopString(index));
        }
    }
    let finish = match outcome.finish {
        FinishReason::Stop => Finish::Stop,
        FinishReason::Length | FinishReason::ContextFull => Finish::Length,
        FinishReason::Cancelled => Finish::Cancelled,
    };
    (finish, usage)
}

/// The sampler of a request's settings.
pub(super) fn sampler_config(s: &Sampling) -> SamplerConfig {
    SamplerConfig {
        temp: s.temperature,
        top_p: s.top_p,
        min_p: s.min_p,
        top_k: s.top_k,
        repetition_penalty: s.repetition_penalty,
        presence_penalty: s.presence_penalty,
        frequency_penalty: s.frequency_penalty,
        repetition_context_size: 20,
    }
}

/// Which of `stops` ended a generation that stopped by itself: the engine drops the stop
/// string from the text, so it is found again in the decoded tokens (the earliest one, as the
/// engine stops at the first). None: an end-of-sequence token ended it.
fn stop_string_hit(checkpoint: &Checkpoint, stops: &[String], tokens: &[u32]) -> Option<usize> {
    if stops.is_empty() {
        return None;
    }
    let text = checkpoint.tokenizer.decode(tokens, false).ok()?;
    stops
        .iter()
        .enumerate()
        .filter_map(|(i, stop)| text.find(stop.as_str()).map(|at| (at, i)))
        .min()
        .map(|(_, i)| i)
}

impl Backend for EngineBackend {
    fn admit(
        &mut self,
        job: &JobSpec,
        choices: Vec<(JobId, JobOutput)>,
    ) -> Result<Option<(Finish, Usage)>, ApiError> {
        let (prompt, info, call_grammar) =
            (self.prompts).encode(self.engine.checkpoint(), &job.prompt, job.format.is_some())?;
        // A forced call is the whole reply: `response_format` (which shapes content) has
        // nothing left to constrain. The grammar is compiled once; each choice decodes on its
        // own copy of the automaton (its own place in the grammar).
        let grammar = match (call_grammar, &job.format) {
            (Some(grammar), _) => Some(self.prompts.grammars()?.tool_call_constraint(grammar)?),
            (None, Some(format)) => Some(
                self.prompts
                    .grammars()?
                    .constraint(format, "response_format")?,
            ),
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
        let sampler = sampler_config(s);
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
        Some(PromptCacheStats::of(self.engine.prompt_cache_mut()))
    }
}
