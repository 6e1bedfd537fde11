//! Speculative decoding (issue 28): a drafter proposes k tokens — the model's own
//! multi-token-prediction head, chained, or a separate small draft model ([`draft_model`]);
//! the main model verifies them in one forward pass of k + 1 tokens;
//! the longest prefix the main model accepts is kept, plus the main model's own token after
//! it; the main model's cache is rewound to the last kept token ([`window`]). A [`Judge`]
//! draws the drafts and decides each row: greedily ([`Greedy`]: the output is the main model's
//! greedy output, token for token), or by speculative sampling (the engine's), which keeps the
//! main model's distribution.
//!
//! The head pairs each position's normed hidden state with the token after it. After a
//! verify step the pairs it has not seen are those of the kept tokens, with the main model's
//! hidden states (the chained drafts ran on the head's own): the next step's first draft runs
//! them all in one call, as vLLM does, after the head's cache dropped the chained entries.

pub mod draft_length;
pub mod draft_model;
pub mod window;

use crate::cache::{Cache, FamilyState, KvCache};
use crate::Model;
use anyhow::{bail, ensure, Result};
use candle_core::Tensor;
pub use draft_length::{DraftLength, ADAPTIVE_MAX};
pub use draft_model::DraftModel;
use gdn_ops::launches::candle_op;
use std::sync::Arc;
pub use window::Window;

/// Prompt tokens whose hidden states the head sees before the first draft (the rest of the
/// prompt is prefilled without them): enough for the head's attention to pick up the recent
/// context, few enough that the last prefill chunk stays small.
pub const HEAD_HISTORY: usize = 64;

/// How drafts are drawn and judged: greedily ([`Greedy`]), or by rejection sampling (the
/// engine's sampler), which keeps the main model's sampling distribution exactly.
pub trait Judge {
    /// The draft at this point from the head's logits; `before` are the tokens this step
    /// drafted before it.
    fn draft(&mut self, logits: &mut [f32], before: &[u32]) -> u32;
    /// The main model's token from a verify row's logits: `before` are the tokens this step
    /// decided before this row, `draft` the draft at this row (`None` past the last draft).
    /// Returning the draft accepts it.
    fn decide(&mut self, logits: &mut [f32], before: &[u32], draft: Option<u32>) -> u32;
}

/// Greedy drafts (the head's argmax), judged by `pick`, the main model's greedy choice (an
/// argmax, after whatever penalties the caller applies).
pub struct Greedy<F: FnMut(&mut [f32], &[u32]) -> u32>(pub F);

impl<F: FnMut(&mut [f32], &[u32]) -> u32> Judge for Greedy<F> {
    fn draft(&mut self, logits: &mut [f32], _before: &[u32]) -> u32 {
        argmax(logits)
    }

    fn decide(&mut self, logits: &mut [f32], before: &[u32], _draft: Option<u32>) -> u32 {
        (self.0)(logits, before)
    }
}

/// Counts of a speculative run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecStats {
    /// Verify steps (forward passes of the main model after the prompt).
    pub steps: usize,
    /// Draft tokens proposed and accepted.
    pub drafted: usize,
    pub accepted: usize,
    /// Tokens the steps decided (accepted drafts plus one per step).
    pub tokens: usize,
    /// Per draft index j (0-based): how often the j-th draft of a step was proposed, and
    /// accepted.
    pub drafted_at: Vec<usize>,
    pub accepted_at: Vec<usize>,
    /// Per draft length k (index k): how many steps drafted k tokens (fewer than asked near
    /// the token limit; chosen per step with [`DraftLength::Adaptive`]).
    pub steps_at: Vec<usize>,
}

impl SpecStats {
    /// Accepted drafts per proposed draft.
    pub fn acceptance(&self) -> f64 {
        self.accepted as f64 / self.drafted.max(1) as f64
    }

    /// Tokens decided per forward pass of the main model.
    pub fn tokens_per_step(&self) -> f64 {
        self.tokens as f64 / self.steps.max(1) as f64
    }

    /// Drafted tokens per step: the k used, on average.
    pub fn mean_draft_tokens(&self) -> f64 {
        self.drafted as f64 / self.steps.max(1) as f64
    }
}

/// The drafting side of one sequence: its drafter's state, the draft length and the counts.
#[derive(Debug)]
pub struct Speculation {
    length: DraftLength,
    drafter: Drafter,
    pub stats: SpecStats,
}

/// Where a sequence's drafts come from: what an engine keeps to start each sequence's
/// [`Speculation`].
#[derive(Clone, Default)]
pub enum DrafterSource {
    /// The main model's own MTP head (which must be loaded).
    #[default]
    Head,
    /// A separate small model sharing the main model's tokenizer, which prefills each
    /// prompt `prefill_chunk` tokens a pass (the run's bound on peak memory, as the main
    /// model's).
    Model {
        model: Arc<Model>,
        prefill_chunk: usize,
    },
}

/// What proposes the drafts.
#[derive(Debug)]
enum Drafter {
    /// The main model's own MTP head.
    Head(Head),
    /// A separate small model sharing the main model's tokenizer.
    Model(DraftModel),
}

/// The MTP head's side: its KV cache and the pairs it has not seen.
#[derive(Debug)]
struct Head {
    mtp: KvCache,
    /// An empty cache of the head (`qwen4_exp`'s carries its indexer state), to start from.
    empty: KvCache,
    /// Normed hidden states `[1, P, H]` of positions whose pairs the head has not run yet.
    pending_hidden: Option<Tensor>,
    /// The tokens after the first `P − 1` of them (the last one's is the next step's token).
    pending_next: Vec<u32>,
    /// While a step's drafts are being verified: the head's cache length before it drafted.
    drafted_from: Option<usize>,
    /// While a step's drafts are being verified: the family state of the head's cache
    /// (`qwen4_exp`'s indexer) after the pending pairs, before the chained drafts. The
    /// indexer pools its keys per block and keeps no per-token history, so dropping the
    /// chained entries puts this copy back rather than cutting a length.
    chain_from: Option<Box<dyn FamilyState>>,
}

impl Speculation {
    /// Drafts of `length` tokens per step (a fixed number, or adaptive) with `model`'s MTP
    /// head.
    pub fn new(model: &Model, length: impl Into<DraftLength>) -> Result<Self> {
        let Some(head) = model.mtp_head() else {
            bail!("the model has no MTP head loaded: speculative decoding needs one");
        };
        let head = Head {
            mtp: head.new_cache(),
            empty: head.new_cache(),
            pending_hidden: None,
            pending_next: Vec::new(),
            drafted_from: None,
            chain_from: None,
        };
        Ok(Self::with_drafter(Drafter::Head(head), length.into()))
    }

    /// Drafts of `length` tokens per step from `source`.
    pub fn from_source(
        model: &Model,
        source: &DrafterSource,
        length: impl Into<DraftLength>,
    ) -> Result<Self> {
        match source {
            DrafterSource::Head => Self::new(model, length),
            DrafterSource::Model {
                model: draft,
                prefill_chunk,
            } => Self::with_draft_model(model, draft.clone(), *prefill_chunk, length),
        }
    }

    /// Drafts of `length` tokens per step from `draft`, a separate model whose vocabulary
    /// must be `model`'s, prefilling prompts `prefill_chunk` tokens a pass.
    pub fn with_draft_model(
        model: &Model,
        draft: Arc<Model>,
        prefill_chunk: usize,
        length: impl Into<DraftLength>,
    ) -> Result<Self> {
        let drafter = Drafter::Model(DraftModel::new(model, draft, prefill_chunk)?);
        Ok(Self::with_drafter(drafter, length.into()))
    }

    fn with_drafter(drafter: Drafter, length: DraftLength) -> Self {
        let max = length.max();
        Self {
            length,
            drafter,
            stats: SpecStats {
                drafted_at: vec![0; max],
                accepted_at: vec![0; max],
                steps_at: vec![0; max + 1],
                ..SpecStats::default()
            },
        }
    }

    /// The draft model's state, when a draft model drafts (for tests of its rewind).
    pub fn draft_model(&self) -> Option<&DraftModel> {
        match &self.drafter {
            Drafter::Model(d) => Some(d),
            Drafter::Head(_) => None,
        }
    }

    /// The most tokens a step drafts.
    pub fn draft_tokens(&self) -> usize {
        self.length.max()
    }

    /// How the draft length is chosen, with the adaptive rule's estimate so far.
    pub fn length(&self) -> &DraftLength {
        &self.length
    }

    /// The end of the prompt: `normed` `[1, W, H]`, the normed hidden states of its last W
    /// tokens ([`Model::forward_normed`]), and `after` the W − 1 prompt tokens that follow the
    /// first of them. The head's history starts there.
    pub fn start(&mut self, normed: Tensor, after: &[u32]) -> Result<()> {
        let Drafter::Head(head) = &mut self.drafter else {
            bail!("a draft model starts from the prompt's tokens (start_from_prompt)");
        };
        ensure!(
            normed.dim(1)? == after.len() + 1,
            "{} hidden states for {} following tokens",
            normed.dim(1)?,
            after.len()
        );
        head.mtp = head.empty.clone();
        head.pending_hidden = Some(normed);
        head.pending_next = after.to_vec();
        Ok(())
    }

    /// Runs the prompt's last tokens, `prompt[tail_from..]` (the cache holds those before
    /// them), keeping their normed hidden states, which start the head's history
    /// ([`Speculation::start`]); a draft model prefills the whole prompt instead. Returns the
    /// logits of the prompt's last token, `[1, vocab]`. A longer tail gives the head more of
    /// the prompt to attend to; [`HEAD_HISTORY`] is what the engine uses.
    pub fn start_from_prompt(
        &mut self,
        model: &Model,
        cache: &mut Cache,
        prompt: &[u32],
        tail_from: usize,
    ) -> Result<Tensor> {
        ensure!(tail_from < prompt.len(), "the prompt has no tokens");
        let tail = &prompt[tail_from..];
        if let Drafter::Model(draft) = &mut self.drafter {
            draft.start(prompt)?;
            return model.forward_last(tail, cache);
        }
        let normed = model.forward_normed(tail, cache)?;
        let logits = model.head_logits(&normed.narrow(1, tail.len() - 1, 1)?)?;
        self.start(normed, &tail[1..])?;
        Ok(logits)
    }

    /// One step from `token`, decided but not yet run (`cache` holds everything before it):
    /// drafts at most `max_draft` tokens, verifies them, and returns the tokens decided, in
    /// order: the accepted drafts, then the main model's own token after them; `judge` draws
    /// the drafts and decides each row.
    pub fn step(
        &mut self,
        model: &Model,
        cache: &mut Cache,
        token: u32,
        max_draft: usize,
        judge: &mut (dyn Judge + Send),
    ) -> Result<Vec<u32>> {
        // One hop onto the CPU pool for the whole step (each model call would make its own).
        model.on_host_workers(|| self.step_on_pool(model, cache, token, max_draft, judge))
    }

    fn step_on_pool(
        &mut self,
        model: &Model,
        cache: &mut Cache,
        token: u32,
        max_draft: usize,
        judge: &mut (dyn Judge + Send),
    ) -> Result<Vec<u32>> {
        let k = self.length.next().min(max_draft);
        let drafts = match &mut self.drafter {
            Drafter::Head(head) => head.draft(model, token, k, judge)?,
            Drafter::Model(draft) => draft.draft(token, k, judge)?,
        };

        let mut window_tokens = Vec::with_capacity(k + 1);
        window_tokens.push(token);
        window_tokens.extend(&drafts);
        let window = Window::open(cache)?;
        // The verify pass: on the fused kernels where the device plan runs them
        // (`Model::verify`), its logits the one read-back.
        let (logits, normed) = match model.verify(&window_tokens, cache) {
            Ok(pass) => pass,
            Err(e) => {
                Window::abandon(cache);
                return Err(e);
            }
        };
        let mut decided = Vec::with_capacity(k + 1);
        for (i, mut row) in logits.to_vec2::<f32>()?.into_iter().enumerate() {
            if row.iter().any(|x| !x.is_finite()) {
                Window::abandon(cache);
                bail!(
                    "the verify step's logits are not finite (row {i} of {})",
                    k + 1
                );
            }
            let t = judge.decide(&mut row, &decided, drafts.get(i).copied());
            decided.push(t);
            if i == k || drafts[i] != t {
                break;
            }
        }
        let accepted = decided.len() - 1;
        // A family's own layer state rewinds by running the kept tokens again (window.rs).
        window.close_replaying(cache, accepted + 1, |cache, kept| {
            model.verify(&window_tokens[..kept], cache).map(drop)
        })?;
        match &mut self.drafter {
            Drafter::Head(head) => head.keep(model, token, &normed, &decided)?,
            Drafter::Model(draft) => draft.keep(&drafts, accepted)?,
        }

        self.length.record(k, accepted);
        let s = &mut self.stats;
        s.steps += 1;
        s.steps_at[k] += 1;
        s.drafted += k;
        s.accepted += accepted;
        s.tokens += decided.len();
        for j in 0..k {
            s.drafted_at[j] += 1;
            s.accepted_at[j] += usize::from(j < accepted);
        }
        Ok(decided)
    }

    /// The main model ran `token` outside a speculative step (a decode step of a batch of
    /// several sequences), `normed` `[1, 1, H]` its normed hidden state: the drafter's history
    /// goes on as after a step that drafted nothing, so the next speculative step drafts
    /// exactly as if every step had been one.
    pub fn record_plain(&mut self, model: &Model, token: u32, normed: &Tensor) -> Result<()> {
        model.on_host_workers(|| match &mut self.drafter {
            Drafter::Head(head) => head.pend(model, token, normed),
            Drafter::Model(draft) => draft.record_plain(token),
        })
    }
}

impl Head {
    /// Runs the pending pairs through the head (the last gives the first draft), then chains:
    /// each draft paired with the head's own output gives the next. What [`Head::keep`]
    /// needs after the verify step stays pending: the pairs, with `token` appended.
    fn draft(
        &mut self,
        model: &Model,
        token: u32,
        k: usize,
        judge: &mut (dyn Judge + Send),
    ) -> Result<Vec<u32>> {
        let Some(hidden) = &self.pending_hidden else {
            bail!("speculative step before the prompt's hidden states were given (start)");
        };
        self.pending_next.push(token);
        if k == 0 {
            return Ok(Vec::new());
        }
        self.drafted_from = Some(self.mtp.len());
        let g = model.mtp_forward(hidden, &self.pending_next, &mut self.mtp)?;
        let mut g = g.narrow(1, g.dim(1)? - 1, 1)?;
        self.chain_from = match &self.mtp.family {
            Some(f) if k > 1 => Some(f.deep_clone()?),
            _ => None,
        };
        let mut drafts = Vec::with_capacity(k);
        loop {
            let mut logits = model.mtp_logits(&g)?.squeeze(0)?.to_vec1::<f32>()?;
            let d = judge.draft(&mut logits, &drafts);
            drafts.push(d);
            if drafts.len() == k {
                return Ok(drafts);
            }
            g = model.mtp_forward(&g, &[d], &mut self.mtp)?;
        }
    }

    /// After the verify step that started from `token` and `decided` these tokens, `normed`
    /// the main model's normed hidden states of the window: the pairs the head has not seen
    /// are the kept positions with the main model's hidden states, each with the token after
    /// it (the last one's is the next step's token); the head's cache drops its chained
    /// entries.
    fn keep(&mut self, model: &Model, token: u32, normed: &Tensor, decided: &[u32]) -> Result<()> {
        let accepted = decided.len() - 1;
        let kept = normed.narrow(1, 0, accepted + 1)?;
        match self.drafted_from.take() {
            // The head ran the pending pairs (one per entry of `pending_next`), then its
            // chain, which it drops.
            Some(head_len) => {
                self.mtp.truncate(head_len + self.pending_next.len());
                if let Some(family) = self.chain_from.take() {
                    self.mtp.family = Some(family);
                }
                self.pending_hidden = Some(kept);
                self.pending_next = decided[..accepted].to_vec();
            }
            // Nothing drafted, nothing accepted: the token's pair is pending, as after a
            // plain step.
            None => {
                self.pending_next.pop();
                self.pend(model, token, &kept)?;
            }
        }
        Ok(())
    }

    /// Appends the pair (`token` after the last pending position, `normed` at `token`) to the
    /// pending ones. Past [`HEAD_HISTORY`] of them, those whose next token is known run
    /// through the head now, so that a long run of plain steps keeps neither a growing tensor
    /// nor a long head call for the next draft (the head's cache gets the same rows either
    /// way: its rows are causal, row by row).
    fn pend(&mut self, model: &Model, token: u32, normed: &Tensor) -> Result<()> {
        let Some(hidden) = self.pending_hidden.take() else {
            bail!("a plain step recorded before the prompt's hidden states were given (start)");
        };
        self.pending_next.push(token);
        let hidden = candle_op(Tensor::cat(&[&hidden, normed], 1))?;
        let known = self.pending_next.len();
        if known < HEAD_HISTORY {
            self.pending_hidden = Some(hidden);
            return Ok(());
        }
        model.mtp_forward(
            &hidden.narrow(1, 0, known)?,
            &self.pending_next,
            &mut self.mtp,
        )?;
        self.pending_hidden = Some(hidden.narrow(1, known, 1)?);
        self.pending_next.clear();
        Ok(())
    }
}

/// Index of the largest value (the first of equal ones).
pub fn argmax(xs: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in xs.iter().enumerate() {
        if x > xs[best] {
            best = i;
        }
    }
    best as u32
}
