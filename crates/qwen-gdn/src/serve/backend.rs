//! The adapter between the server and the model: renders and tokenizes a job's prompt,
//! checks it against the context, and runs the generation loop with the job's sampling,
//! stop strings and cancel flag. Everything the server needs from the engine goes through
//! this file.

use super::error::ApiError;
use super::job::{Event, Finish, JobSpec, Prompt, PromptInfo, Usage};
use super::scheduler::Backend;
use super::stop_strings::{Step, StopStrings};
use super::test_hooks;
use crate::chat_template::ChatTemplate;
use crate::generate::{eos_ids, last_row, non_finite_logits, special_tokens};
use crate::load::Checkpoint;
use crate::sampler::{Sampler, SamplerConfig};
use crate::stream::TokenStream;
use anyhow::Result;
use qwen_gdn_model::Model;
use serde_json::{Map, Value as Json};
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};

pub struct ModelBackend {
    checkpoint: Checkpoint,
    template: Option<ChatTemplate>,
    model: Model,
    eos: Vec<u32>,
    prefill_chunk_size: usize,
    /// Template variables every chat gets (special tokens, enable_thinking by default when
    /// the vocabulary has think tags, as `generate` does).
    base_vars: Map<String, Json>,
}

impl ModelBackend {
    pub fn new(checkpoint: Checkpoint, model: Model, prefill_chunk_size: usize) -> Result<Self> {
        let template =
            ChatTemplate::from_dir(&checkpoint.dir, checkpoint.tokenizer_config.as_ref())?;
        let eos = eos_ids(&checkpoint, &model.config().eos_token_id)?;
        let mut base_vars = special_tokens(checkpoint.tokenizer_config.as_ref());
        let tokenizer = &checkpoint.tokenizer;
        if tokenizer.token_to_id("<think>").is_some() && tokenizer.token_to_id("</think>").is_some()
        {
            base_vars.insert("enable_thinking".into(), true.into());
        }
        Ok(Self {
            checkpoint,
            template,
            model,
            eos,
            prefill_chunk_size,
            base_vars,
        })
    }

    /// The prompt's token ids, and whether it ends inside `<think>`.
    fn encode(&self, prompt: &Prompt) -> Result<(Vec<u32>, bool), ApiError> {
        let limit = &self.checkpoint.input_limit;
        let (text, add_special_tokens) = match prompt {
            Prompt::Text(text) => (text.clone(), true),
            Prompt::Chat {
                messages,
                tools,
                template_vars,
            } => {
                let template = self.template.as_ref().ok_or_else(|| {
                    ApiError::invalid("this model has no chat template; use /v1/completions")
                })?;
                let mut vars = self.base_vars.clone();
                vars.extend(template_vars.clone());
                let text = template
                    .render(messages, tools.as_ref(), true, &vars)
                    .map_err(|e| ApiError::invalid(format!("the chat template failed: {e:#}")))?;
                (text, false)
            }
        };
        let too_long = |e: anyhow::Error| ApiError::context_length(format!("{e:#}"));
        limit
            .check_tokens(&self.checkpoint.tokenizer, &text, "the prompt")
            .map_err(too_long)?;
        let ids = self
            .checkpoint
            .tokenizer
            .encode(text.as_str(), add_special_tokens)
            .map_err(|e| ApiError::invalid(format!("tokenizing the prompt: {e}")))?
            .get_ids()
            .to_vec();
        if ids.is_empty() {
            return Err(ApiError::invalid("the prompt has no tokens"));
        }
        // At least one position must be left to generate into.
        limit
            .check_fits(ids.len() + 1, "the prompt")
            .map_err(too_long)?;
        let opens_thinking = text.trim_end().ends_with("<think>");
        Ok((ids, opens_thinking))
    }

    fn generate(
        &mut self,
        ids: &[u32],
        job: &JobSpec,
        cancel: &AtomicBool,
        on_event: &mut dyn FnMut(Event) -> ControlFlow<()>,
    ) -> Result<(Finish, usize)> {
        let s = &job.sampling;
        let mut sampler = Sampler::new(
            SamplerConfig {
                temp: s.temperature,
                top_p: s.top_p,
                min_p: s.min_p,
                top_k: s.top_k,
                repetition_penalty: s.repetition_penalty,
                repetition_context_size: 20,
            },
            s.seed,
        );
        let model = &self.model;
        let max_positions = model.config().max_position_embeddings;
        let mut stream = TokenStream::new(&self.checkpoint.tokenizer);
        let mut stops = StopStrings::new(&job.stop);
        let mut cache = model.new_cache();
        let (head, last) = ids.split_at(ids.len() - 1);
        for chunk in head.chunks(self.prefill_chunk_size) {
            if cancel.load(Ordering::Relaxed) {
                return Ok((Finish::Cancelled, 0));
            }
            model.prefill(chunk, &mut cache, chunk.len())?;
        }
        let mut history = last.to_vec();
        let mut generated = 0usize;
        let mut logits = model.forward_last(last, &mut cache)?;
        let mut send =
            |text: String| -> bool { text.is_empty() || on_event(Event::Text(text)).is_continue() };
        let finish = loop {
            if cancel.load(Ordering::Relaxed) {
                break Finish::Cancelled;
            }
            let mut row = last_row(&logits)?;
            if row.iter().any(|x| !x.is_finite()) {
                let seen: Vec<u32> = head.iter().chain(&history).copied().collect();
                return Err(non_finite_logits(model, &seen, self.prefill_chunk_size));
            }
            let token = sampler.sample(&mut row, &history);
            generated += 1;
            history.push(token);
            if self.eos.contains(&token) {
                break Finish::Stop;
            }
            if let Some(text) = stream.push(token)? {
                match stops.push(&text) {
                    Step::Emit(t) => {
                        if !send(t) {
                            break Finish::Cancelled;
                        }
                    }
                    Step::Stop(t) => {
                        send(t);
                        return Ok((Finish::Stop, generated));
                    }
                }
            }
            if generated == job.max_tokens || cache.offset >= max_positions {
                break Finish::Length;
            }
            logits = model.forward_last(&[token], &mut cache)?;
        };
        if finish != Finish::Cancelled {
            let tail = stream.finish()?;
            match stops.push(&tail) {
                Step::Emit(t) => {
                    send(t + &stops.finish());
                }
                Step::Stop(t) => {
                    send(t);
                    return Ok((Finish::Stop, generated));
                }
            }
        }
        Ok((finish, generated))
    }

    /// [`test_hooks::FORCE_OUTPUT_ENV`]: the forced text, sent a few characters at a time
    /// like a generation would.
    fn force_output(
        &self,
        text: &str,
        on_event: &mut dyn FnMut(Event) -> ControlFlow<()>,
    ) -> Result<(Finish, usize), ApiError> {
        let chars: Vec<char> = text.chars().collect();
        for piece in chars.chunks(3) {
            if on_event(Event::Text(piece.iter().collect())).is_break() {
                return Ok((Finish::Cancelled, 0));
            }
        }
        let tokens = self
            .checkpoint
            .tokenizer
            .encode(text, false)
            .map_or(0, |e| e.get_ids().len());
        Ok((Finish::Stop, tokens))
    }
}

impl Backend for ModelBackend {
    fn run(
        &mut self,
        job: &JobSpec,
        cancel: &AtomicBool,
        on_event: &mut dyn FnMut(Event) -> ControlFlow<()>,
    ) -> Result<(Finish, Usage), ApiError> {
        let (ids, opens_thinking) = self.encode(&job.prompt)?;
        if on_event(Event::Prompt(PromptInfo { opens_thinking })).is_break() {
            return Ok((
                Finish::Cancelled,
                Usage {
                    prompt_tokens: ids.len(),
                    cached_tokens: 0,
                    completion_tokens: 0,
                },
            ));
        }
        let (finish, completion_tokens) = match test_hooks::forced_output() {
            Some(text) => self.force_output(&text, on_event)?,
            None => self
                .generate(&ids, job, cancel, on_event)
                .map_err(|e| ApiError::internal(format!("generation failed: {e:#}")))?,
        };
        Ok((
            finish,
            Usage {
                prompt_tokens: ids.len(),
                cached_tokens: 0,
                completion_tokens,
            },
        ))
    }

    fn recover(&mut self) {}
}
