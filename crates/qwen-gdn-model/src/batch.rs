//! The sequences decoding together: each owns its [`Cache`] (GDN states of fixed size, keys
//! and values grown per sequence as it lengthens, never reserved up to the context), joins
//! with whatever its cache already holds (a prefilled prompt, a prompt-cache snapshot at its
//! cached position) and leaves at any step, handing its cache back.

use crate::{Cache, Model};
use anyhow::{bail, Result};
use candle_core::Tensor;

/// How a batched step's products treat its rows (one per sequence).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchProducts {
    /// Every row computed as its sequence's decode step computes it alone: the reference
    /// plan's host products keep their one-row kernel for any number of rows (each weight row
    /// still read once for all); the device plan's run in groups of the matvec's rows (one
    /// row for float weights) and its MoE one token at a time. Bit for bit what each
    /// sequence gives alone. The reference plan's default.
    EachRowAlone,
    /// One product over all the rows, whichever kernel the row count picks (a GEMM sums in
    /// another order): the fewest weight reads. The device plan's default.
    Shared,
}

impl BatchProducts {
    pub fn default_for(plan: crate::Plan) -> Self {
        match plan {
            crate::Plan::Reference => Self::EachRowAlone,
            crate::Plan::Device => Self::Shared,
        }
    }
}

/// How a batched step of the fused kernels runs its MoE blocks' expert products over the B
/// rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BatchMoe {
    /// The decode step's kernels over the rows: one gathered product per (row, slot) pair, no
    /// read-back; an expert chosen by several rows is read once per pair. The default.
    #[default]
    Gathered,
    /// The prefill's expert-grouped products (`MoePrefill`, `QWEN_GDN_MOE_PREFILL`): each
    /// expert chosen by several rows read once for all of them, after reading the routing
    /// back. What may pay at large B, where rows share experts (`bench --batch --batch-moe
    /// grouped` measures it).
    Grouped,
}

impl BatchMoe {
    /// Whether a step gathers its pairs. Under [`BatchProducts::EachRowAlone`] it always does:
    /// a row's MoE is then its own decode step's, whatever the grouped forms would sum.
    pub fn gathers(self) -> bool {
        self == Self::Gathered || crate::weights::row_exact::enabled()
    }
}

/// A sequence's place in a [`Batch`], valid until it leaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SlotId(u64);

/// The sequences of a batched decode, in the order they joined.
#[derive(Debug, Default)]
pub struct Batch {
    slots: Vec<(SlotId, Cache)>,
    next_id: u64,
}

impl Batch {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a sequence whose state is `cache`; its next token is at `cache.offset`.
    pub fn join(&mut self, cache: Cache) -> SlotId {
        let id = SlotId(self.next_id);
        self.next_id += 1;
        self.slots.push((id, cache));
        id
    }

    /// Removes a sequence, returning its cache (to snapshot, or drop).
    pub fn leave(&mut self, id: SlotId) -> Option<Cache> {
        let at = self.slots.iter().position(|(s, _)| *s == id)?;
        Some(self.slots.remove(at).1)
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The sequences, in the order they joined.
    pub fn ids(&self) -> Vec<SlotId> {
        self.slots.iter().map(|(id, _)| *id).collect()
    }

    pub fn cache(&self, id: SlotId) -> Option<&Cache> {
        self.slots.iter().find(|(s, _)| *s == id).map(|(_, c)| c)
    }

    pub fn cache_mut(&mut self, id: SlotId) -> Option<&mut Cache> {
        self.slots
            .iter_mut()
            .find(|(s, _)| *s == id)
            .map(|(_, c)| c)
    }

    /// One decode step of the listed sequences (the others sit this step out), each taking
    /// its next token: f32 logits `[next.len(), vocab]`, row `i` for `next[i]`.
    pub fn step(&mut self, model: &Model, next: &[(SlotId, u32)]) -> Result<Tensor> {
        Ok(self.step_normed(model, next)?.0)
    }

    /// [`Batch::step`], also returning the normed hidden states `[1, next.len(), H]`
    /// ([`Model::decode_batch_normed`]).
    pub fn step_normed(
        &mut self,
        model: &Model,
        next: &[(SlotId, u32)],
    ) -> Result<(Tensor, Tensor)> {
        let mut picked: Vec<(usize, &mut Cache)> = vec![];
        for (id, cache) in self.slots.iter_mut() {
            let mut listed = next.iter().enumerate().filter(|(_, (n, _))| n == id);
            if let Some((row, _)) = listed.next() {
                if listed.next().is_some() {
                    bail!("sequence {id:?} is listed twice in one batched step");
                }
                picked.push((row, cache));
            }
        }
        if picked.len() != next.len() {
            bail!("a batched step names a sequence that is not in the batch");
        }
        picked.sort_by_key(|(row, _)| *row);
        let tokens: Vec<u32> = next.iter().map(|(_, t)| *t).collect();
        let mut caches: Vec<&mut Cache> = picked.into_iter().map(|(_, c)| c).collect();
        model.decode_batch_normed(&tokens, &mut caches)
    }
}
