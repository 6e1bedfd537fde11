//! The replies generated together (continuous batching): replies join and leave at any step.
//! Each step runs one piece (a chunk) of the first waiting prompt's prefill, so that a long
//! prompt holds the others back by at most one chunk, then one decode step of every reply
//! that is decoding, as one [`Batch`] step. A reply joins the batch once its prompt is in
//! its cache (a prompt-cache hit joins at its cached position) and leaves when it ends or
//! its reader is gone, freeing its slot before the next step.
//!
//! A step of one reply runs the model's single-sequence step (the fused decode where the
//! plan has it), so a reply alone is exactly what `generate` gives; a step of several runs
//! [`Model::decode_batch`](qwen_gdn_model::Model::decode_batch), whose rows are each
//! reply's logits alone (bit for bit with the reference plan; within its f32 gate on the
//! device plan, `qwen-gdn-model/src/batch.rs`).
//!
//! A reply with speculative decoding (the model's MTP head) runs a speculative step when it
//! is the only one decoding: it drafts, verifies in one pass and keeps what is accepted, on
//! its own cache ([`StepMode`]). With others it takes the batch's plain step, and its head's
//! history goes on as after a step that drafted nothing (the batched step's normed hidden
//! state of its row), so that its next speculative step drafts as if it had been alone.
//! Greedy text is the plain greedy text either way; a seeded reply at temperature > 0 draws
//! its random numbers per step, so it is what `generate` gives when it ran alone throughout.
//!
//! A prompt may have several replies (a request's `n` choices): it is prefilled once, and
//! each reply decodes from its own copy of the prompt's cache (`choices.rs`).
//! Each reply's own work (sampling, constraint, stop strings, text) runs isolated: a panic
//! in it fails that reply alone (`isolated.rs`).

use super::constraint::LogitsConstraint;
use super::isolated::{isolated, Panicked};
use super::prompt_run::{Prefilled, PromptRun};
use super::sequence::{Advance, ReplySink, Sequence};
use super::{Engine, FinishReason, GenerateParams, Outcome, PromptTokens};
use anyhow::{anyhow, bail, Error, Result};
use candle_core::Tensor;
use qwen_gdn_model::{Batch, Cache, SlotId};
use std::collections::VecDeque;

mod choices;

pub struct Replies<'c, K, S> {
    batch: Batch,
    /// Prompts waiting for (or in) their prefill, first come first served.
    starting: VecDeque<Starting<'c, K, S>>,
    /// Replies in the batch, in the order they joined.
    decoding: Vec<Decoding<'c, K, S>>,
}

struct Starting<'c, K, S> {
    run: PromptRun,
    /// The prompt's replies, each with its key (one, or a request's `n` choices).
    replies: Vec<(K, Sequence<'c, S>)>,
}

/// One reply to add: its key, how to generate it, and where its text goes.
pub struct NewReply<'c, K, S> {
    pub key: K,
    pub params: GenerateParams,
    pub constraint: Option<Box<dyn LogitsConstraint + 'c>>,
    pub sink: S,
}

struct Decoding<'c, K, S> {
    key: K,
    slot: SlotId,
    sequence: Sequence<'c, S>,
    /// The token the next step runs.
    next: u32,
}

/// A reply that ended in a step: its key and outcome, or why it failed.
pub type Ended<K> = (K, Result<Outcome>);

impl<K, S> Default for Replies<'_, K, S> {
    fn default() -> Self {
        Self {
            batch: Batch::new(),
            starting: VecDeque::new(),
            decoding: Vec::new(),
        }
    }
}

impl<'c, K, S: ReplySink> Replies<'c, K, S> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Replies not yet ended: prefilling or decoding.
    pub fn len(&self) -> usize {
        self.starting.len() + self.decoding.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Replies decoding in the batch.
    pub fn decoding(&self) -> usize {
        self.decoding.len()
    }

    /// Adds a reply to `prompt`, its text going to `sink`: the prompt is looked up in the
    /// prompt cache now and prefilled by the next steps.
    pub fn add(
        &mut self,
        engine: &mut Engine,
        key: K,
        prompt: &PromptTokens,
        params: &GenerateParams,
        constraint: Option<Box<dyn LogitsConstraint + 'c>>,
        sink: S,
    ) -> Result<()> {
        let reply = NewReply {
            key,
            params: params.clone(),
            constraint,
            sink,
        };
        self.add_choices(engine, prompt, vec![reply])
    }

    /// Adds `replies` to one `prompt` (a request's choices): the prompt is prefilled once,
    /// and each reply then decodes from its own copy of its cache.
    pub fn add_choices(
        &mut self,
        engine: &mut Engine,
        prompt: &PromptTokens,
        replies: Vec<NewReply<'c, K, S>>,
    ) -> Result<()> {
        // A constrained reply is decoded a token at a time: no speculation for it; nor for
        // choices, whose speculative states would need copying too.
        let mut speculation = match (&engine.draft_length, replies.as_slice()) {
            (Some(length), [only]) if only.constraint.is_none() => {
                Some(engine.new_speculation(length)?)
            }
            _ => None,
        };
        let run = engine.begin_prompt(prompt, speculation.is_some())?;
        let replies = replies
            .into_iter()
            .map(|r| {
                let sequence = Sequence::new(
                    &prompt.ids,
                    &r.params,
                    r.constraint,
                    r.sink,
                    speculation.take(),
                );
                (r.key, sequence)
            })
            .collect();
        self.starting.push_back(Starting { run, replies });
        Ok(())
    }

    /// One step: a piece of the first waiting prompt's prefill, then one decode step of the
    /// replies in the batch. Returns the replies that ended in it.
    pub fn step(&mut self, engine: &mut Engine) -> Vec<Ended<K>> {
        let mut ended = vec![];
        self.prefill_piece(engine, &mut ended);
        self.decode(engine, &mut ended);
        ended
    }

    fn prefill_piece(&mut self, engine: &mut Engine, ended: &mut Vec<Ended<K>>) {
        let Some(first) = self.starting.front_mut() else {
            return;
        };
        let cancelled = first.replies.iter().all(|(_, s)| s.cancelled());
        if !cancelled {
            match isolated(|| engine.prefill_piece(&mut first.run)) {
                Ok(false) => return, // more pieces to run
                Ok(true) => {}
                Err(e) => {
                    let first = self.starting.pop_front().expect("a first prompt");
                    fail_prompt(engine, first.replies, e, ended);
                    return;
                }
            }
        }
        let Starting { run, replies } = self.starting.pop_front().expect("a first prompt");
        if cancelled {
            // Nothing was generated: the outcome says so (finish: cancelled).
            for (key, sequence) in replies {
                ended.push(end(engine, key, sequence));
            }
            return;
        }
        self.join(engine, run, replies, ended);
    }

    /// The prompt's last token gives each reply its first token; each reply then joins the
    /// batch with its next token, unless it is already over.
    fn join(
        &mut self,
        engine: &mut Engine,
        run: PromptRun,
        mut replies: Vec<(K, Sequence<'c, S>)>,
        ended: &mut Vec<Ended<K>>,
    ) {
        let speculation = match replies.as_mut_slice() {
            [(_, only)] => only.speculation.as_mut(),
            _ => None,
        };
        let prefilled = isolated(|| engine.finish_prompt(run, speculation)).and_then(
            |Prefilled {
                 cache,
                 logits,
                 cached_tokens,
             }| {
                let caches = choices::caches_for(cache, replies.len())?;
                Ok((caches, logits, cached_tokens))
            },
        );
        let (caches, logits, cached_tokens) = match prefilled {
            Ok(prefilled) => prefilled,
            Err(e) => return fail_prompt(engine, replies, e, ended),
        };
        for ((key, mut sequence), cache) in replies.into_iter().zip(caches) {
            let outcome = &mut sequence.outcome;
            outcome.cached_tokens = cached_tokens;
            outcome.prefilled_tokens = outcome.prompt_tokens - cached_tokens;
            let nothing_to_generate = sequence.max_tokens() == 0;
            if nothing_to_generate {
                // The prompt is cached; nothing to generate.
                sequence.outcome.finish = FinishReason::Length;
            }
            let next = if nothing_to_generate || sequence.cancelled() {
                Ok(None)
            } else {
                isolated(|| follow(engine, &mut sequence, Some(&logits), &cache))
            };
            match next {
                Ok(Some(next)) => self.decoding.push(Decoding {
                    key,
                    slot: self.batch.join(cache),
                    sequence,
                    next,
                }),
                Ok(None) => ended.push(end(engine, key, sequence)),
                Err(e) => ended.push((key, Err(e))),
            }
        }
    }

    fn decode(&mut self, engine: &mut Engine, ended: &mut Vec<Ended<K>>) {
        // A reply whose reader left frees its slot before the step.
        let (gone, decoding): (Vec<_>, Vec<_>) = std::mem::take(&mut self.decoding)
            .into_iter()
            .partition(|d| d.sequence.cancelled());
        self.decoding = decoding;
        for d in gone {
            self.batch.leave(d.slot);
            ended.push(end(engine, d.key, d.sequence));
        }
        if self.decoding.is_empty() {
            return;
        }
        let nexts = match StepMode::of(&self.decoding) {
            // The reply's own work: a panic in it fails this reply alone.
            StepMode::Speculative => vec![isolated(|| self.speculative_step(engine))],
            StepMode::Plain => match isolated(|| self.plain_step(engine)) {
                Ok(nexts) => nexts,
                Err(e) => {
                    // The step is shared: it failed for all of them (their caches may be
                    // half-written).
                    let why = format!("the batched decode step failed: {e:#}");
                    for d in std::mem::take(&mut self.decoding) {
                        self.batch.leave(d.slot);
                        ended.push((d.key, Err(anyhow!("{why}"))));
                    }
                    return;
                }
            },
        };
        for (mut d, next) in std::mem::take(&mut self.decoding).into_iter().zip(nexts) {
            match next {
                Ok(Some(next)) => {
                    d.next = next;
                    self.decoding.push(d);
                }
                Ok(None) => {
                    self.batch.leave(d.slot);
                    ended.push(end(engine, d.key, d.sequence));
                }
                Err(e) => {
                    self.batch.leave(d.slot);
                    ended.push((d.key, Err(e)));
                }
            }
        }
    }

    /// The speculative step of the one reply decoding: its next token(s), or `None` when it
    /// is over.
    fn speculative_step(&mut self, engine: &Engine) -> Result<Option<u32>> {
        let [alone] = self.decoding.as_mut_slice() else {
            bail!("a speculative step needs exactly one reply decoding");
        };
        let cache = self.batch.cache_mut(alone.slot).expect("its slot");
        alone.sequence.speculate(engine, cache, alone.next)?;
        follow(engine, &mut alone.sequence, None, cache)
    }

    /// One decode step of every reply decoding (one row each): per reply its next token, or
    /// `None` when it is over. A reply that speculates when alone records its row's normed
    /// hidden state for its head. An error of the step itself fails them all; each reply's
    /// own work runs isolated (a panic in it fails that reply alone).
    fn plain_step(&mut self, engine: &Engine) -> Result<Vec<Result<Option<u32>>>> {
        let (logits, normed) = self.run_step(engine)?;
        let mut nexts = Vec::with_capacity(self.decoding.len());
        for (row, d) in self.decoding.iter_mut().enumerate() {
            let cache = (self.batch.cache_mut(d.slot)).expect("a decoding reply's slot");
            let next = isolated(|| {
                if let (Some(spec), Some(normed)) = (d.sequence.speculation.as_mut(), &normed) {
                    spec.record_plain(&engine.model, d.next, &normed.narrow(1, row, 1)?)?;
                }
                follow(
                    engine,
                    &mut d.sequence,
                    Some(&logits.narrow(0, row, 1)?),
                    cache,
                )
            });
            nexts.push(next);
        }
        Ok(nexts)
    }

    /// The decode step of the batch: logits `[rows, vocab]`, a row per decoding reply, and
    /// (for several) the normed hidden states `[1, rows, H]` they came from.
    fn run_step(&mut self, engine: &Engine) -> Result<(Tensor, Option<Tensor>)> {
        if let [alone] = self.decoding.as_slice() {
            let cache = self.batch.cache_mut(alone.slot).expect("its slot");
            return Ok((engine.model.forward_last(&[alone.next], cache)?, None));
        }
        let next: Vec<(SlotId, u32)> = self.decoding.iter().map(|d| (d.slot, d.next)).collect();
        let (logits, normed) = self.batch.step_normed(&engine.model, &next)?;
        Ok((logits, Some(normed)))
    }
}

/// A reply's end: its outcome once the text still held is flushed (isolated, as the flush
/// runs the reply's stop strings and sink).
fn end<K, S: ReplySink>(engine: &Engine, key: K, sequence: Sequence<'_, S>) -> Ended<K> {
    (key, isolated(|| sequence.finish(engine)))
}

/// The prompt's replies all fail with `e` (each with its own copy of the message). After a
/// panic the prompt cache may be half-updated: it starts afresh.
fn fail_prompt<K, S>(
    engine: &mut Engine,
    replies: Vec<(K, Sequence<'_, S>)>,
    e: Error,
    ended: &mut Vec<Ended<K>>,
) {
    if e.is::<Panicked>() {
        engine.prompt_cache_mut().clear();
    }
    let why = format!("{e:#}");
    ended.extend(
        replies
            .into_iter()
            .map(|(key, _)| (key, Err(anyhow!("{why}")))),
    );
}

/// How a step decodes the replies in the batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StepMode {
    /// One reply decoding, with speculation: drafted by its MTP head, verified in one pass of
    /// the main model, rolled back to the last accepted token.
    Speculative,
    /// A token per reply, in one step of the batch (the single-sequence step for one).
    Plain,
}

impl StepMode {
    fn of<K, S>(decoding: &[Decoding<'_, K, S>]) -> Self {
        match decoding {
            [alone] if alone.sequence.speculation.is_some() => Self::Speculative,
            _ => Self::Plain,
        }
    }
}

/// The reply's next token from `logits` (its row of a plain step; `None` after a speculative
/// step) and from the tokens the speculative step decided after it: `Some(token)` for the next
/// step to run, `None` when the reply is over.
fn follow<S: ReplySink>(
    engine: &Engine,
    sequence: &mut Sequence<'_, S>,
    mut logits: Option<&Tensor>,
    cache: &Cache,
) -> Result<Option<u32>> {
    loop {
        match sequence.advance(engine, logits.take(), cache.offset)? {
            Advance::Done => return Ok(None),
            Advance::Feed(_) if sequence.has_decided() => {}
            Advance::Feed(token) => return Ok(Some(token)),
        }
    }
}
