//! Drafts from a separate small model (`--draft-model`, as mlx-lm's speculative decoding has):
//! it keeps its own [`Cache`] of the sequence, drafts k tokens one decode step at a time, and
//! after the main model's verify step is put back exactly where it would be had it seen only
//! the kept tokens.
//!
//! How it is rewound: a [`Window`] over its cache, opened before it runs the step's unseen
//! tokens and its drafts, closed on the kept ones (the same per-token record the main model's
//! verify step uses). Why not recompute: a rejected draft then costs the draft model nothing
//! more, and its cache never holds the rejected tokens. The price is one recurrent state per
//! GDN layer of the draft model per token of the window (at most k + 1), held while it is open.
//! A draft model with a family's own layer state (`qwen4_exp`) is rewound by replay instead:
//! its kept tokens run again, one decode step each (window.rs).

use super::{Judge, Window};
use crate::cache::Cache;
use crate::Model;
use anyhow::{bail, ensure, Result};
use std::sync::Arc;

/// A draft model's side of one sequence.
pub struct DraftModel {
    model: Arc<Model>,
    /// Prompt tokens a prefill pass of the draft model takes.
    prefill_chunk: usize,
    cache: Cache,
    /// Tokens of the sequence the draft model has not run yet, before the step's token.
    unseen: Vec<u32>,
    /// The open window of the current step and the tokens it ran before the drafts.
    window: Option<(Window, Vec<u32>)>,
}

impl std::fmt::Debug for DraftModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DraftModel")
            .field("offset", &self.cache.offset)
            .field("unseen", &self.unseen)
            .field("window", &self.window)
            .finish_non_exhaustive()
    }
}

impl DraftModel {
    /// A drafter for `main`'s sequences from `draft`, which must share its vocabulary,
    /// prefilling prompts `prefill_chunk` tokens a pass.
    pub fn new(main: &Model, draft: Arc<Model>, prefill_chunk: usize) -> Result<Self> {
        let (want, got) = (main.config().vocab_size, draft.config().vocab_size);
        ensure!(
            want == got,
            "the draft model's vocabulary has {got} tokens, the main model's {want}: they must share a tokenizer"
        );
        let cache = draft.new_cache();
        Ok(Self {
            model: draft,
            prefill_chunk: prefill_chunk.max(1),
            cache,
            unseen: Vec::new(),
            window: None,
        })
    }

    /// The prompt, whose last token the next step runs: the draft model prefills the rest.
    pub fn start(&mut self, prompt: &[u32]) -> Result<()> {
        let Some((&last, before)) = prompt.split_last() else {
            bail!("the prompt has no tokens");
        };
        self.cache = self.model.new_cache();
        if !before.is_empty() {
            self.model
                .prefill(before, &mut self.cache, self.prefill_chunk)?;
        }
        self.unseen = vec![last];
        Ok(())
    }

    /// The main model ran `token` outside a speculative step. The draft model catches up on
    /// all but it now, so that its next window holds no more than the step needs.
    pub fn record_plain(&mut self, token: u32) -> Result<()> {
        decode_each(&self.model, &mut self.cache, &self.unseen)?;
        self.unseen = vec![token];
        Ok(())
    }

    /// Up to `k` drafts after `token`, one decode step of the draft model each, inside a
    /// window that [`DraftModel::keep`] closes. `k` = 0 drafts nothing and runs nothing.
    pub fn draft(
        &mut self,
        token: u32,
        k: usize,
        judge: &mut (dyn Judge + Send),
    ) -> Result<Vec<u32>> {
        self.unseen.push(token);
        if k == 0 {
            return Ok(Vec::new());
        }
        ensure!(self.window.is_none(), "a draft window is already open");
        let run = std::mem::take(&mut self.unseen);
        let window = Window::open(&mut self.cache)?;
        let drafts = match drafts_in_window(&self.model, &mut self.cache, &run, k, judge) {
            Ok(d) => d,
            Err(e) => {
                Window::abandon(&mut self.cache);
                return Err(e);
            }
        };
        self.window = Some((window, run));
        Ok(drafts)
    }

    /// After the verify step: `drafts` were proposed, the first `accepted` kept. The cache
    /// keeps the tokens before the drafts and the accepted drafts it ran (the last draft never
    /// ran); an accepted last draft becomes the one token it has not seen.
    pub fn keep(&mut self, drafts: &[u32], accepted: usize) -> Result<()> {
        let Some((window, run)) = self.window.take() else {
            return Ok(()); // nothing was drafted: the step's token waits in `unseen`
        };
        let k = drafts.len();
        // A family's own layer state rewinds by running the kept tokens again, one decode
        // step each as they first ran (window.rs).
        let ran: Vec<u32> = run.iter().chain(&drafts[..k - 1]).copied().collect();
        let model = &self.model;
        window.close_replaying(
            &mut self.cache,
            run.len() + accepted.min(k - 1),
            |cache, kept| decode_each(model, cache, &ran[..kept]).map(drop),
        )?;
        self.unseen = match accepted == k {
            true => vec![drafts[k - 1]],
            false => Vec::new(),
        };
        Ok(())
    }

    /// The draft model's cache and the tokens it has not run (for tests of the rewind).
    pub fn state(&self) -> (&Cache, &[u32]) {
        (&self.cache, &self.unseen)
    }
}

/// `k` drafts: `run` (the tokens the draft model has not seen, the step's token last), then
/// each draft, one decode step each; every draft drawn by `judge` from the draft model's logits.
fn drafts_in_window(
    model: &Model,
    cache: &mut Cache,
    run: &[u32],
    k: usize,
    judge: &mut (dyn Judge + Send),
) -> Result<Vec<u32>> {
    let mut drafts = Vec::with_capacity(k);
    let Some(mut logits) = decode_each(model, cache, run)? else {
        bail!("a draft step has no token to run");
    };
    loop {
        let mut row = logits.squeeze(0)?.to_vec1::<f32>()?;
        let d = judge.draft(&mut row, &drafts);
        drafts.push(d);
        if drafts.len() == k {
            return Ok(drafts);
        }
        logits = model.forward_last(&[d], cache)?;
    }
}

/// Runs `tokens` one decode step each and returns the last step's logits. Why not one forward
/// of all of them: the draft model's cache must not depend on how acceptance grouped the
/// tokens. A 4-bit matmul of two rows is not bit for bit two matmuls of one row on the CPU, so
/// a cache that caught up on two tokens in one call differed (from the 54th token on the
/// qwen3.5-tiny-4bit fixture) from one that decoded them one by one.
fn decode_each(
    model: &Model,
    cache: &mut Cache,
    tokens: &[u32],
) -> Result<Option<candle_core::Tensor>> {
    let mut logits = None;
    for &t in tokens {
        logits = Some(model.forward_last(&[t], cache)?);
    }
    Ok(logits)
}
