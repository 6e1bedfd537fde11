//! The generation loop shared by `generate`, `chat` and `serve`: look the prompt up in the
//! prompt cache, prefill only what the cache does not hold (snapshotting at message boundaries,
//! at the prompt's end and every N tokens), then sample token by token, streaming the text,
//! until an end-of-sequence token, a stop string, the token limit, a full context or a cancel.
//! Every reply runs through [`Replies`] (continuous batching: `serve`'s many, `generate`'s
//! one): a prompt's prefill a chunk at a time (`prompt_run.rs`), each reply's sampling and
//! text (`sequence.rs`), the decode steps of all replies together (`replies.rs`).

pub mod constraint;
mod conversation;
mod eos;
mod isolated;
pub mod logprobs;
mod non_finite;
mod prompt_run;
mod replies;
pub mod sampler;
mod sequence;
mod speculative_sampling;
mod stop_strings;

#[allow(unused_imports)] // for chat and serve
pub use conversation::render_conversation;
pub use eos::eos_ids;
pub use isolated::{isolated, panic_message};
pub use non_finite::non_finite_logits;
pub use replies::{Ended, NewReply, Replies};
pub use sequence::ReplySink;
pub use stop_strings::{Scan, StopStrings};

use crate::engine::constraint::LogitsConstraint;
use crate::engine::prompt_run::Prefilled;
use crate::engine::sampler::SamplerConfig;
use crate::load::Checkpoint;
use anyhow::{bail, Result};
use candle_core::{DType, IndexOp, Tensor};
use qwen_gdn_model::prompt_cache::{load_snapshot, ModelIdentity};
use qwen_gdn_model::speculative::{DraftLength, DrafterSource, SpecStats, Speculation};
use qwen_gdn_model::{Cache, Model, PromptCache};
use std::ops::ControlFlow;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

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

impl Outcome {
    /// A generation of a prompt of `prompt_tokens` that has not run yet (cancelled, should it
    /// end before a token).
    pub fn started(prompt_tokens: usize) -> Self {
        Self {
            prompt_tokens,
            cached_tokens: 0,
            prefilled_tokens: 0,
            generated: 0,
            finish: FinishReason::Cancelled,
            prompt_time: None,
            generation_time: None,
            tokens: Vec::new(),
            speculation: None,
        }
    }
}

/// A loaded model with its tokenizer, stop tokens and prompt cache.
pub struct Engine {
    checkpoint: Checkpoint,
    model: Model,
    eos: Vec<u32>,
    prompt_cache: PromptCache,
    prefill_chunk: usize,
    snapshot_every: Option<usize>,
    /// Draft tokens per step of speculative decoding, or `None`; each reply starts from this
    /// (an adaptive length from its prior).
    draft_length: Option<DraftLength>,
    /// What drafts: the model's MTP head, or a draft model.
    drafter: DrafterSource,
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
            drafter: DrafterSource::Head,
        })
    }

    /// Speculative decoding with `length` draft tokens per step (fixed or adaptive) from the
    /// drafter ([`Engine::set_drafter`]; the model's MTP head unless set, which must be
    /// loaded): greedy, or speculative sampling at temp > 0; `None` turns it off.
    pub fn set_draft_length(&mut self, length: Option<DraftLength>) -> Result<()> {
        if let Some(length) = &length {
            self.new_speculation(length)?;
        }
        self.draft_length = length;
        Ok(())
    }

    /// What drafts from now on: the model's MTP head, or a draft model.
    pub fn set_drafter(&mut self, drafter: DrafterSource) {
        self.drafter = drafter;
    }

    /// A reply's drafting side, `length` draft tokens per step.
    pub(super) fn new_speculation(&self, length: &DraftLength) -> Result<Speculation> {
        Speculation::from_source(&self.model, &self.drafter, length.clone())
    }

    pub fn checkpoint(&self) -> &Checkpoint {
        &self.checkpoint
    }

    /// Tokens in the model's vocabulary (rows of its logits).
    pub fn vocab_size(&self) -> usize {
        self.model.config().vocab_size
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
    /// speculative decoding is off for it. The reply runs as a batch of one ([`Replies`]),
    /// the path every reply of `serve` takes.
    pub fn generate_constrained(
        &mut self,
        prompt: &PromptTokens,
        params: &GenerateParams,
        constraint: Option<&mut dyn LogitsConstraint>,
        cancel: &AtomicBool,
        on_text: &mut dyn FnMut(&str) -> ControlFlow<()>,
    ) -> Result<Outcome> {
        let constraint = constraint.map(|c| Box::new(c) as Box<dyn LogitsConstraint + '_>);
        let sink = Callback { on_text, cancel };
        let mut replies = Replies::new();
        replies.add(self, (), prompt, params, constraint, sink)?;
        loop {
            if let Some(((), outcome)) = replies.step(self).pop() {
                return outcome;
            }
        }
    }

    /// Runs `prompt` through the model as [`Engine::generate`] does (resuming from the
    /// prompt cache, snapshotting at its boundaries and end) and returns the cache at its
    /// end, e.g. to save it to a file; `None` when cancelled.
    pub fn prompt_state(
        &mut self,
        prompt: &PromptTokens,
        cancel: &AtomicBool,
    ) -> Result<Option<Cache>> {
        Ok(self.prefill_prompt(prompt, cancel)?.map(|p| p.cache))
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
    ) -> Result<Option<Prefilled>> {
        let mut run = self.begin_prompt(prompt, false)?;
        loop {
            if cancel.load(Ordering::Relaxed) {
                return Ok(None);
            }
            if self.prefill_piece(&mut run)? {
                return self.finish_prompt(run, None).map(Some);
            }
        }
    }
}

/// A caller's text callback and cancel flag as a reply's sink.
pub struct Callback<'a> {
    pub on_text: &'a mut dyn FnMut(&str) -> ControlFlow<()>,
    pub cancel: &'a AtomicBool,
}

impl ReplySink for Callback<'_> {
    fn text(&mut self, text: &str) -> ControlFlow<()> {
        (self.on_text)(text)
    }

    fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed)
    }
}

fn last_row(logits: &Tensor) -> Result<Vec<f32>> {
    let rows = logits.dim(0)?;
    Ok(logits.i(rows - 1)?.to_dtype(DType::F32)?.to_vec1()?)
}

#[cfg(test)]
mod step_mode_tests;
#[cfg(test)]
mod tests;
