//! A prompt on its way through the model, a piece at a time: resumed from the longest prefix
//! the prompt cache holds, prefilled in chunks with snapshots at its message boundaries (and
//! every N tokens), then its last token(s) run for the logits that start the reply and its
//! end snapshotted. A server runs other replies' decode steps between the pieces.

use super::Engine;
use crate::engine::PromptTokens;
use anyhow::{bail, Result};
use candle_core::Tensor;
use qwen_gdn_model::prompt_cache::ChunkedPrefill;
use qwen_gdn_model::speculative::{Speculation, HEAD_HISTORY};
use qwen_gdn_model::Cache;

pub struct PromptRun {
    prompt: PromptTokens,
    cache: Cache,
    /// Prompt tokens restored from the prompt cache.
    pub cached_tokens: usize,
    /// The tokens prefilled in chunks; the rest run at the end for the logits.
    head_len: usize,
    prefill: ChunkedPrefill,
}

/// A prompt run through the model.
pub struct Prefilled {
    pub cache: Cache,
    /// Logits of the prompt's last token.
    pub logits: Tensor,
    pub cached_tokens: usize,
}

impl Engine {
    /// Looks `prompt` up in the prompt cache. `speculating`: the prompt's last tokens are kept
    /// to run apart, so that the MTP head sees their hidden states.
    pub(super) fn begin_prompt(
        &mut self,
        prompt: &PromptTokens,
        speculating: bool,
    ) -> Result<PromptRun> {
        let ids = &prompt.ids;
        if ids.is_empty() {
            bail!("the prompt has no tokens");
        }
        let (cached_tokens, cache) = match self.prompt_cache.lookup(ids)? {
            Some((n, cache)) => (n, cache),
            None => (0, self.model.new_cache()),
        };
        // The prompt cache may already hold some of the tokens kept apart, and they start
        // after the last snapshot position (a boundary, a multiple of --prompt-cache-every),
        // so that every snapshot is taken as without speculation and a later turn resumes as
        // far.
        let tail = match speculating {
            true => {
                let last_stop = (prompt.boundaries.iter().copied())
                    .chain(self.snapshot_every.map(|n| (ids.len() - 1) / n * n))
                    .filter(|&p| p < ids.len())
                    .fold(cached_tokens, usize::max);
                HEAD_HISTORY.min(ids.len() - last_stop).max(1)
            }
            false => 1,
        };
        let head_len = ids.len() - tail;
        let prefill = ChunkedPrefill::new(
            cache.offset,
            head_len,
            self.prefill_chunk,
            &prompt.boundaries,
            self.snapshot_every,
        )?;
        Ok(PromptRun {
            prompt: prompt.clone(),
            cache,
            cached_tokens,
            head_len,
            prefill,
        })
    }

    /// Runs the next chunk of `run`'s prefill (a snapshot included when one falls there);
    /// `true` once it is all in the cache.
    pub(super) fn prefill_piece(&mut self, run: &mut PromptRun) -> Result<bool> {
        let head = &run.prompt.ids[..run.head_len];
        run.prefill
            .step(&self.model, head, &mut run.cache, &mut self.prompt_cache)
    }

    /// Runs the prompt's last token(s) (through `speculation`'s head when given) and
    /// snapshots the prompt's end, before the first decode step changes the cache in place:
    /// the next turn of a conversation starts with this prompt.
    pub(super) fn finish_prompt(
        &mut self,
        mut run: PromptRun,
        speculation: Option<&mut Speculation>,
    ) -> Result<Prefilled> {
        let ids = &run.prompt.ids;
        let last = &ids[run.head_len..];
        let logits = match speculation {
            Some(spec) => spec.start_from_prompt(&self.model, &mut run.cache, ids, run.head_len)?,
            None => self.model.forward_last(last, &mut run.cache)?,
        };
        self.prompt_cache.insert(ids, &run.cache)?;
        Ok(Prefilled {
            cache: run.cache,
            logits,
            cached_tokens: run.cached_tokens,
        })
    }
}
