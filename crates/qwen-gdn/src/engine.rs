//! TEMPORARY stand-in with the API the `pcache` branch promised (no prompt cache: every prompt
//! is prefilled whole); pcache's engine.rs replaces this file when the branches merge.

use crate::sampler::{Sampler, SamplerConfig};
use crate::stream::TokenStream;
use anyhow::Result;
use candle_core::{DType, IndexOp};
use qwen_gdn_model::Model;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tokenizers::Tokenizer;

pub struct GenerateParams {
    pub max_tokens: usize,
    pub sampler: SamplerConfig,
    pub seed: Option<u64>,
    pub stop_strings: Vec<String>,
}

pub struct PromptTokens {
    pub ids: Vec<u32>,
    pub boundaries: Vec<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    Stop,
    Length,
    ContextFull,
    Cancelled,
}

pub struct Outcome {
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    pub prefilled_tokens: usize,
    pub generated: usize,
    pub finish: FinishReason,
    pub prompt_time: Option<Duration>,
    pub generation_time: Option<Duration>,
    pub tokens: Vec<u32>,
}

pub struct Engine {
    pub model: Model,
    pub tokenizer: Tokenizer,
    pub eos: Vec<u32>,
    pub prefill_chunk_size: usize,
}

impl Engine {
    pub fn generate(
        &mut self,
        prompt: &PromptTokens,
        params: &GenerateParams,
        cancel: &AtomicBool,
        on_text: &mut dyn FnMut(&str) -> ControlFlow<()>,
    ) -> Result<Outcome> {
        let model = &self.model;
        let mut sampler = Sampler::new(params.sampler.clone(), params.seed);
        let mut stream = TokenStream::new(&self.tokenizer);
        let mut cache = model.new_cache();
        let (head, last) = prompt.ids.split_at(prompt.ids.len() - 1);
        let start = Instant::now();
        let mut prompt_time = None;
        let mut history = last.to_vec();
        let mut tokens = Vec::new();
        let max_positions = model.config().max_position_embeddings;
        let mut finish = FinishReason::Length;
        'run: {
            for chunk in head.chunks(self.prefill_chunk_size) {
                if cancel.load(Ordering::Relaxed) {
                    finish = FinishReason::Cancelled;
                    break 'run;
                }
                model.prefill(chunk, &mut cache, chunk.len())?;
            }
            let mut logits = model.forward_last(last, &mut cache)?;
            loop {
                let rows = logits.dim(0)?;
                let mut row: Vec<f32> = logits.i(rows - 1)?.to_dtype(DType::F32)?.to_vec1()?;
                let token = sampler.sample(&mut row, &history);
                prompt_time.get_or_insert_with(|| start.elapsed());
                history.push(token);
                tokens.push(token);
                if self.eos.contains(&token) {
                    finish = FinishReason::Stop;
                    break;
                }
                if let Some(text) = stream.push(token)? {
                    if on_text(&text).is_break() {
                        finish = FinishReason::Cancelled;
                        break 'run;
                    }
                }
                if cancel.load(Ordering::Relaxed) {
                    finish = FinishReason::Cancelled;
                    break;
                }
                if tokens.len() == params.max_tokens {
                    break;
                }
                if cache.offset >= max_positions {
                    finish = FinishReason::ContextFull;
                    break;
                }
                logits = model.forward_last(&[token], &mut cache)?;
            }
        }
        let rest = stream.finish()?;
        if !rest.is_empty() {
            let _ = on_text(&rest);
        }
        Ok(Outcome {
            prompt_tokens: prompt.ids.len(),
            cached_tokens: 0,
            prefilled_tokens: prompt.ids.len(),
            generated: tokens.len(),
            finish,
            prompt_time,
            generation_time: prompt_time.map(|p| start.elapsed() - p),
            tokens,
        })
    }
}
