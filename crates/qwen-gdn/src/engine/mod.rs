//! The generation loop shared by `generate`, `chat` and `serve`: look the prompt up in the
//! prompt cache, prefill only what the cache does not hold (snapshotting at message boundaries,
//! at the prompt's end and every N tokens), then sample token by token, streaming the text,
//! until an end-of-sequence token, a stop string, the token limit, a full context or a cancel.

pub mod constraint;
mod conversation;
mod eos;
pub mod logprobs;
mod non_finite;
pub mod sampler;
mod speculative_sampling;
mod stop_strings;

#[allow(unused_imports)] // for chat and serve
pub use conversation::render_conversation;
pub use eos::eos_ids;
pub use non_finite::non_finite_logits;
pub use stop_strings::{Scan, StopStrings};

use crate::engine::constraint::{apply_mask, device_mask, LogitsConstraint};
use crate::engine::sampler::{Sampler, SamplerConfig};
use crate::engine::speculative_sampling::SamplerJudge;
use crate::load::Checkpoint;
use crate::text::stream::TokenStream;
use anyhow::{bail, Result};
use candle_core::{DType, IndexOp, Tensor};
use qwen_gdn_model::prompt_cache::{
    load_snapshot, prefill_with_snapshots_cancellable, ModelIdentity,
};
use qwen_gdn_model::speculative::{DraftLength, SpecStats, Speculation, HEAD_HISTORY};
use qwen_gdn_model::{Cache, Model, PromptCache};
use std::collections::VecDeque;
use std::ops::ControlFlow;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// How to generate one reply.
#[derive(Debug, Clone)]
pub struct GenerateParams {
    pub max_tokens: usize,
    pub sampler: SamplerConfig,
    pub seed: Option<u64>,
    /// Generation stops at the first of these in the text; the text before it is emitted,
    /// the stop string is not.
    pub stop_strings: Vec<String>,
}

/// A tokenized prompt.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PromptTokens {
    pub ids: Vec<u32>,
    /// Token positions where a message of the conversation ends (ascending, each < ids.len()):
    /// the prompt cache snapshots there.
    pub boundaries: Vec<usize>,
}

impl PromptTokens {
    /// Raw tokens with no message structure.
    pub fn plain(ids: Vec<u32>) -> Self {
        Self {
            ids,
            boundaries: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-sequence token or a stop string.
    Stop,
    /// `max_tokens` tokens were generated.
    Length,
    /// The model's context (max_position_embeddings) is full.
    ContextFull,
    /// `cancel` was set, or the text consumer asked to stop.
    Cancelled,
}

/// What a generation did.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub prompt_tokens: usize,
    /// Prompt tokens restored from the prompt cache.
    pub cached_tokens: usize,
    /// Prompt tokens run through the model (`prompt_tokens - cached_tokens` unless cancelled).
    pub prefilled_tokens: usize,
    /// Sampled tokens, an end-of-sequence token included (as mlx-lm counts).
    pub generated: usize,
    pub finish: FinishReason,
    /// From the start to the first sampled token (prefill included); `None` if none was.
    pub prompt_time: Option<Duration>,
    /// From the first sampled token to the end.
    pub generation_time: Option<Duration>,
    /// The sampled tokens, an end-of-sequence token included.
    pub tokens: Vec<u32>,
    /// What speculative decoding did, when it ran.
    pub speculation: Option<SpecStats>,
}

/// A loaded model with its tokenizer, stop tokens and prompt cache.
pub struct Engine {
    checkpoint: Checkpoint,
    model: Model,
    eos: Vec<u32>,
    prompt_cache: PromptCache,
    prefill_chunk: usize,
    snapshot_every: Option<usize>,
    /// Draft tokens per step of speculative decoding with the model's MTP head, or `None`;
    /// each reply starts from this (an adaptive length from its prior).
    draft_length: Option<DraftLength>,
}

impl Engine {
    pub fn new(
        checkpoint: Checkpoint,
        model: Model,
        prefill_chunk: usize,
        prompt_cache: PromptCache,
        snapshot_every: Option<usize>,
    ) -> Result<Self> {
        let eos = eos_ids(&checkpoint, &model.config().eos_token_id)?;
        Ok(Self {
            checkpoint,
            model,
            eos,
            prompt_cache,
            prefill_chunk: prefill_chunk.max(1),
            snapshot_every: snapshot_every.filter(|&n| n > 0),
            draft_length: None,
        })
    }

    /// Speculative decoding with `length` draft tokens per step (fixed or adaptive) from the
    /// model's MTP head (which must be loaded): greedy, or speculative sampling at temp > 0;
    /// `None` turns it off.
    pub fn set_draft_length(&mut self, length: Option<DraftLength>) -> Result<()> {
        if let Some(length) = &length {
            Speculation::new(&self.model, length.clone())?;
        }
        self.draft_length = length;
        Ok(())
    }

    pub fn checkpoint(&self) -> &Checkpoint {
        &self.checkpoint
    }

    /// The tokens that end a reply.
    pub fn eos(&self) -> &[u32] {
        &self.eos
    }

    /// Whether `token` ends a reply.
    pub fn is_eos(&self, token: u32) -> bool {
        self.eos.contains(&token)
    }

    pub fn prompt_cache_mut(&mut self) -> &mut PromptCache {
        &mut self.prompt_cache
    }

    /// Generates a reply to `prompt`, passing its text to `on_text` as it comes
    /// (`ControlFlow::Break` stops, as a cancel does). `cancel` is checked before each prefill
    /// chunk and after each token. The prompt cache gains a snapshot at the prompt's end (the
    /// next turn of a conversation starts with this prompt) and at `prompt.boundaries`.
    pub fn generate(
        &mut self,
        prompt: &PromptTokens,
        params: &GenerateParams,
        cancel: &AtomicBool,
        on_text: &mut dyn FnMut(&str) -> ControlFlow<()>,
    ) -> Result<Outcome> {
        self.generate_constrained(prompt, params, None, cancel, on_text)
    }

    /// [`Engine::generate`], with the tokens each step may sample limited by `constraint`
    /// (masked on the logits' device). A constrained reply is decoded a token at a time:
    /// speculative decoding is off for it.
    pub fn generate_constrained(
        &mut self,
        prompt: &PromptTokens,
        params: &GenerateParams,
        mut constraint: Option<&mut dyn LogitsConstraint>,
        cancel: &AtomicBool,
        on_text: &mut dyn FnMut(&str) -> ControlFlow<()>,
    ) -> Result<Outcome> {
        let start = Instant::now();
        let mut speculation = match &self.draft_length {
            Some(length) if constraint.is_none() => {
                Some(Speculation::new(&self.model, length.clone())?)
            }
            _ => None,
        };
        let Some(Prefilled {
            mut cache,
            mut logits,
            cached_tokens,
        }) = self.prefill_prompt(prompt, cancel, speculation.as_mut())?
        else {
            return Ok(Outcome {
                prompt_tokens: prompt.ids.len(),
                cached_tokens: 0,
                prefilled_tokens: 0,
                generated: 0,
                finish: FinishReason::Cancelled,
                prompt_time: None,
                generation_time: None,
                tokens: Vec::new(),
                speculation: None,
            });
        };
        let ids = &prompt.ids;
        let model = &self.model;
        let max_positions = model.config().max_position_embeddings;
        let mut outcome = Outcome {
            prompt_tokens: ids.len(),
            cached_tokens,
            prefilled_tokens: ids.len() - cached_tokens,
            generated: 0,
            finish: FinishReason::Cancelled,
            prompt_time: None,
            generation_time: None,
            tokens: Vec::new(),
            speculation: None,
        };
        let (head, last) = ids.split_at(ids.len() - 1);
        if params.max_tokens == 0 {
            // The prompt is cached; nothing to generate.
            outcome.finish = FinishReason::Length;
            return Ok(outcome);
        }

        let mut sampler = Sampler::new(params.sampler.clone(), params.seed);
        let mut stream = TokenStream::new(&self.checkpoint.tokenizer);
        let mut stops = StopStrings::new(&params.stop_strings);
        // mlx-lm's logits processors see only tokens that went through the decode step: the
        // last prompt token and the generated ones, not the prefilled chunks.
        let mut history = last.to_vec();
        // False once a stop string ended the text or the consumer stopped listening.
        let mut flush_at_end = true;
        // Tokens a speculative step decided, not yet emitted.
        let mut decided: VecDeque<u32> = VecDeque::new();
        let finish = loop {
            let token = match decided.pop_front() {
                Some(token) => token,
                None => {
                    let mut row = match constraint.as_deref_mut() {
                        Some(c) => {
                            let vocab = logits.dim(candle_core::D::Minus1)?;
                            let mask = device_mask(&c.allowed()?, vocab, logits.device())?;
                            last_row(&apply_mask(&logits, &mask)?)?
                        }
                        None => last_row(&logits)?,
                    };
                    // −∞ is what the constraint writes; NaN and +∞ only a broken model.
                    let broken = |x: &f32| x.is_nan() || *x == f32::INFINITY;
                    let broken = match constraint {
                        Some(_) => row.iter().any(broken),
                        None => row.iter().any(|x| !x.is_finite()),
                    };
                    if broken {
                        let seen: Vec<u32> = head.iter().chain(&history).copied().collect();
                        return Err(non_finite_logits(model, &seen, self.prefill_chunk));
                    }
                    let token = sampler.sample(&mut row, &history);
                    if let Some(c) = constraint.as_deref_mut() {
                        if !self.eos.contains(&token) {
                            c.accept(token)?;
                        }
                    }
                    token
                }
            };
            outcome.prompt_time.get_or_insert_with(|| start.elapsed());
            outcome.generated += 1; // counted even when it is EOS, as mlx-lm does
            outcome.tokens.push(token);
            history.push(token);
            if self.eos.contains(&token) {
                break FinishReason::Stop;
            }
            if let Some(text) = stream.push(token)? {
                match stops.push(&text) {
                    Scan::Emit(text) => {
                        if !text.is_empty() && on_text(&text).is_break() {
                            flush_at_end = false;
                            break FinishReason::Cancelled;
                        }
                    }
                    Scan::Stop(text) => {
                        if !text.is_empty() {
                            let _ = on_text(&text);
                        }
                        flush_at_end = false;
                        break FinishReason::Stop;
                    }
                }
            }
            if cancel.load(Ordering::Relaxed) {
                break FinishReason::Cancelled;
            }
            if outcome.generated >= params.max_tokens {
                break FinishReason::Length;
            }
            if cache.offset >= max_positions {
                break FinishReason::ContextFull;
            }
            if !decided.is_empty() {
                continue;
            }
            match &mut speculation {
                Some(spec) => {
                    // Drafts beyond the token limit or the context would be wasted.
                    let room = (params.max_tokens - outcome.generated - 1)
                        .min(max_positions - cache.offset - 1);
                    let mut judge = SamplerJudge::new(&mut sampler, &history);
                    decided.extend(spec.step(model, &mut cache, token, room, &mut judge)?);
                }
                None => logits = model.forward_last(&[token], &mut cache)?,
            }
        };
        outcome.finish = finish;
        outcome.speculation = speculation.map(|s| s.stats);
        if flush_at_end {
            // What the stream and the stop strings still hold (an incomplete character, a
            // possible start of a stop string that never completed).
            let rest = match stops.push(&stream.finish()?) {
                Scan::Emit(text) => text + &stops.finish(),
                Scan::Stop(text) => text,
            };
            if !rest.is_empty() {
                let _ = on_text(&rest);
            }
        }
        outcome.generation_time = outcome.prompt_time.map(|p| start.elapsed() - p);
        Ok(outcome)
    }

    /// Runs `prompt` through the model as [`Engine::generate`] does (resuming from the
    /// prompt cache, snapshotting at its boundaries and end) and returns the cache at its
    /// end, e.g. to save it to a file; `None` when cancelled.
    pub fn prompt_state(
        &mut self,
        prompt: &PromptTokens,
        cancel: &AtomicBool,
    ) -> Result<Option<Cache>> {
        Ok(self.prefill_prompt(prompt, cancel, None)?.map(|p| p.cache))
    }

    /// The identity a prompt-cache file of this model records.
    pub fn identity(&self) -> Result<ModelIdentity> {
        ModelIdentity::of(&self.checkpoint.dir, &self.model)
    }

    /// Loads a prompt-cache file into the prompt cache (a later prompt that starts with its
    /// tokens resumes from it); returns the tokens it holds.
    pub fn load_prompt_cache_file(&mut self, path: &Path) -> Result<Vec<u32>> {
        let identity = self.identity()?;
        let (tokens, snapshot) = load_snapshot(path, &self.model, &identity)?;
        let bytes = snapshot.bytes();
        if !self.prompt_cache.insert_owned(tokens.clone(), snapshot)? {
            bail!(
                "{}: the prompt cache in it ({bytes} bytes) is larger than the prompt cache's budget ({} bytes)",
                path.display(),
                self.prompt_cache.budget()
            );
        }
        Ok(tokens)
    }

    /// Restores the longest cached prefix of `prompt`, prefills the rest with snapshots at
    /// its boundaries (and every N tokens), runs its last token alone for the logits and
    /// snapshots its end. `None` when cancelled during the prefill.
    fn prefill_prompt(
        &mut self,
        prompt: &PromptTokens,
        cancel: &AtomicBool,
        speculation: Option<&mut Speculation>,
    ) -> Result<Option<Prefilled>> {
        let ids = &prompt.ids;
        if ids.is_empty() {
            bail!("the prompt has no tokens");
        }
        let model = &self.model;
        let (cached_tokens, mut cache) = match self.prompt_cache.lookup(ids)? {
            Some((n, cache)) => (n, cache),
            None => (0, model.new_cache()),
        };
        // With speculation the prompt's last tokens run apart, so that the MTP head sees their
        // hidden states; the prompt cache may already hold some of them, and they start after
        // the last snapshot position (a boundary, a multiple of --prompt-cache-every), so that
        // every snapshot is taken as without speculation and a later turn resumes as far.
        let tail = match speculation {
            Some(_) => {
                let last_stop = (prompt.boundaries.iter().copied())
                    .chain(self.snapshot_every.map(|n| (ids.len() - 1) / n * n))
                    .filter(|&p| p < ids.len())
                    .fold(cached_tokens, usize::max);
                HEAD_HISTORY.min(ids.len() - last_stop).max(1)
            }
            None => 1,
        };
        let (head, last) = ids.split_at(ids.len() - tail);
        let done = prefill_with_snapshots_cancellable(
            model,
            head,
            &mut cache,
            self.prefill_chunk,
            &prompt.boundaries,
            self.snapshot_every,
            &mut self.prompt_cache,
            cancel,
        )?;
        if !done {
            return Ok(None);
        }
        let logits = match speculation {
            Some(spec) => spec.start_from_prompt(model, &mut cache, last)?,
            None => model.forward_last(last, &mut cache)?,
        };
        // Before the first decode step changes the cache in place: the next turn of a
        // conversation starts with this prompt.
        self.prompt_cache.insert(ids, &cache)?;
        Ok(Some(Prefilled {
            cache,
            logits,
            cached_tokens,
        }))
    }
}

/// A prompt run through the model.
struct Prefilled {
    cache: Cache,
    /// Logits of the prompt's last token.
    logits: Tensor,
    cached_tokens: usize,
}

fn last_row(logits: &Tensor) -> Result<Vec<f32>> {
    let rows = logits.dim(0)?;
    Ok(logits.i(rows - 1)?.to_dtype(DType::F32)?.to_vec1()?)
}

#[cfg(test)]
mod tests;
