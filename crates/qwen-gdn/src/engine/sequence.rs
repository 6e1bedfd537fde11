//! One reply being decoded: what the generation does with each step's logits, whether the
//! step ran for this reply alone or for a whole batch. It samples the next token with the
//! reply's own sampler (seed, penalties, constraint), streams its text through the stop
//! strings to the reply's sink, and decides when the reply ends (end-of-sequence token, stop
//! string, token limit, full context, cancel). With speculative decoding it also holds the
//! tokens a speculative step decided.

use super::constraint::{apply_mask, device_mask, LogitsConstraint};
use super::sampler::Sampler;
use super::speculative_sampling::SamplerJudge;
use super::stop_strings::{Scan, StopStrings};
use super::{last_row, non_finite_logits, Engine, FinishReason, GenerateParams, Outcome};
use crate::text::stream::TokenStream;
use anyhow::Result;
use candle_core::Tensor;
use qwen_gdn_model::speculative::Speculation;
use qwen_gdn_model::Cache;
use std::collections::VecDeque;
use std::ops::ControlFlow;
use std::time::Instant;

/// Where a reply's text goes, and whether its reader still wants it.
pub trait ReplySink {
    /// A piece of the reply's text; `Break` stops the reply, as a cancel does.
    fn text(&mut self, text: &str) -> ControlFlow<()>;
    /// Checked before each prefill chunk and after each token.
    fn cancelled(&self) -> bool;
}

/// What the reply does after a token.
pub enum Advance {
    /// Run this token through the model: the next step's logits are the reply's.
    Feed(u32),
    /// The reply is over ([`Sequence::finish`] gives its outcome).
    Done,
}

pub struct Sequence<'c, S> {
    max_tokens: usize,
    sampler: Sampler,
    stream: TokenStream,
    stops: StopStrings,
    /// The prompt but its last token: with `history`, what the model has seen (for the
    /// error about non-finite logits).
    head: Vec<u32>,
    /// mlx-lm's logits processors see only tokens that went through the decode step: the
    /// last prompt token and the generated ones, not the prefilled chunks.
    history: Vec<u32>,
    constraint: Option<Box<dyn LogitsConstraint + 'c>>,
    sink: S,
    pub(super) outcome: Outcome,
    /// False once a stop string ended the text or the consumer stopped listening.
    flush_at_end: bool,
    start: Instant,
    pub(super) speculation: Option<Speculation>,
    /// Tokens a speculative step decided, not yet emitted.
    decided: VecDeque<u32>,
}

impl<'c, S: ReplySink> Sequence<'c, S> {
    pub(super) fn new(
        prompt: &[u32],
        params: &GenerateParams,
        constraint: Option<Box<dyn LogitsConstraint + 'c>>,
        sink: S,
        speculation: Option<Speculation>,
    ) -> Self {
        let (head, last) = prompt.split_at(prompt.len().saturating_sub(1));
        Self {
            max_tokens: params.max_tokens,
            sampler: Sampler::new(params.sampler.clone(), params.seed),
            stream: TokenStream::new(),
            stops: StopStrings::new(&params.stop_strings),
            head: head.to_vec(),
            history: last.to_vec(),
            constraint,
            sink,
            outcome: Outcome::started(prompt.len()),
            flush_at_end: true,
            start: Instant::now(),
            speculation,
            decided: VecDeque::new(),
        }
    }

    pub fn cancelled(&self) -> bool {
        self.sink.cancelled()
    }

    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// The next token, from `logits` (the model's step for this reply; its last row) or from what a speculative step decided (then
    /// `logits` is `None`); streams its text and says whether the reply goes on. `offset`:
    /// the tokens the reply's cache holds.
    pub fn advance(
        &mut self,
        engine: &Engine,
        logits: Option<&Tensor>,
        offset: usize,
    ) -> Result<Advance> {
        let token = match (self.decided.pop_front(), logits) {
            (Some(token), _) => token,
            (None, Some(logits)) => self.sample(engine, logits)?,
            (None, None) => anyhow::bail!("a reply's step has no logits"),
        };
        self.outcome
            .prompt_time
            .get_or_insert_with(|| self.start.elapsed());
        self.outcome.generated += 1; // counted even when it is EOS, as mlx-lm does
        self.outcome.tokens.push(token);
        self.history.push(token);
        if engine.is_eos(token) {
            return Ok(self.end(FinishReason::Stop));
        }
        if let Some(text) = self.stream.push(&engine.checkpoint().tokenizer, token)? {
            match self.stops.push(&text) {
                Scan::Emit(text) => {
                    if !text.is_empty() && self.sink.text(&text).is_break() {
                        self.flush_at_end = false;
                        return Ok(self.end(FinishReason::Cancelled));
                    }
                }
                Scan::Stop(text) => {
                    if !text.is_empty() {
                        let _ = self.sink.text(&text);
                    }
                    self.flush_at_end = false;
                    return Ok(self.end(FinishReason::Stop));
                }
            }
        }
        if self.sink.cancelled() {
            return Ok(self.end(FinishReason::Cancelled));
        }
        if self.outcome.generated >= self.max_tokens {
            return Ok(self.end(FinishReason::Length));
        }
        if offset >= engine.model.config().max_position_embeddings {
            return Ok(self.end(FinishReason::ContextFull));
        }
        Ok(Advance::Feed(token))
    }

    /// Whether the next token is already decided (no model step needed for it).
    pub fn has_decided(&self) -> bool {
        !self.decided.is_empty()
    }

    /// A speculative step from `token` on the reply's own cache: drafts and verifies, and
    /// queues the tokens it decides.
    pub fn speculate(&mut self, engine: &Engine, cache: &mut Cache, token: u32) -> Result<()> {
        let Some(spec) = self.speculation.as_mut() else {
            anyhow::bail!("speculate on a reply without speculation");
        };
        let max_positions = engine.model.config().max_position_embeddings;
        // Drafts beyond the token limit or the context would be wasted.
        let room =
            (self.max_tokens - self.outcome.generated - 1).min(max_positions - cache.offset - 1);
        let mut judge = SamplerJudge::new(&mut self.sampler, &self.history);
        let decided = spec.step(&engine.model, cache, token, room, &mut judge)?;
        self.decided.extend(decided);
        Ok(())
    }

    fn sample(&mut self, engine: &Engine, logits: &Tensor) -> Result<u32> {
        let mut row = match self.constraint.as_deref_mut() {
            Some(c) => {
                let vocab = logits.dim(candle_core::D::Minus1)?;
                let mask = device_mask(&c.allowed()?, vocab, logits.device())?;
                last_row(&apply_mask(logits, &mask)?)?
            }
            None => last_row(logits)?,
        };
        // −∞ is what the constraint writes; NaN and +∞ only a broken model.
        let broken = |x: &f32| x.is_nan() || *x == f32::INFINITY;
        let broken = match self.constraint {
            Some(_) => row.iter().any(broken),
            None => row.iter().any(|x| !x.is_finite()),
        };
        if broken {
            let seen: Vec<u32> = self.head.iter().chain(&self.history).copied().collect();
            return Err(non_finite_logits(
                &engine.model,
                &seen,
                engine.prefill_chunk,
            ));
        }
        let token = self.sampler.sample(&mut row, &self.history);
        if let Some(c) = self.constraint.as_deref_mut() {
            if !engine.is_eos(token) {
                c.accept(token)?;
            }
        }
        Ok(token)
    }

    fn end(&mut self, finish: FinishReason) -> Advance {
        self.outcome.finish = finish;
        Advance::Done
    }

    /// The reply's outcome, after flushing what the stream and the stop strings still hold
    /// (an incomplete character, a possible start of a stop string that never completed).
    pub fn finish(mut self, engine: &Engine) -> Result<Outcome> {
        if self.flush_at_end && self.outcome.generated > 0 {
            let tail = self.stream.finish(&engine.checkpoint().tokenizer)?;
            let rest = match self.stops.push(&tail) {
                Scan::Emit(text) => text + &self.stops.finish(),
                Scan::Stop(text) => text,
            };
            if !rest.is_empty() {
                let _ = self.sink.text(&rest);
            }
        }
        let mut outcome = self.outcome;
        outcome.speculation = self.speculation.map(|s| s.stats);
        outcome.generation_time = outcome.prompt_time.map(|p| self.start.elapsed() - p);
        Ok(outcome)
    }
}
