//! A family's multi-token-prediction head: the hybrid families' (`hybrid/mtp.rs`: one fc
//! over [embedding, normed hidden state]) or `qwen4_exp`'s (`qwen4_exp/mtp.rs`: fc's over the
//! hyper-connection streams, a mixer of its own). What speculation sees of either: a fresh
//! cache, the head on pairs (hidden state at i, token i+1) giving the hidden state a chained
//! draft pairs with, and the lm_head's input from that state.

use super::hybrid::MtpHead;
use super::qwen4_exp::mtp::Qwen4ExpMtpHead;
use crate::cache::KvCache;
use anyhow::Result;
use candle_core::{DType, Device, Tensor};

#[derive(Debug)]
pub enum FamilyMtpHead {
    Hybrid(Box<MtpHead>),
    Qwen4Exp(Box<Qwen4ExpMtpHead>),
}

impl FamilyMtpHead {
    /// The device plan's copy.
    pub fn into_device(self, device: &Device, dtype: DType) -> Result<Self> {
        Ok(match self {
            Self::Hybrid(h) => Self::Hybrid(Box::new(h.into_device(device, dtype)?)),
            Self::Qwen4Exp(h) => Self::Qwen4Exp(Box::new(h.into_device(device, dtype)?)),
        })
    }

    /// An empty cache for the head's attention (with `qwen4_exp`'s indexer state).
    pub fn new_cache(&self) -> KvCache {
        match self {
            Self::Hybrid(h) => h.new_cache(),
            Self::Qwen4Exp(h) => h.new_cache(),
        }
    }

    /// The head on the pairs (`hidden[i]`, `next[i]`), `embedded` the embeddings of `next`:
    /// the hidden states a chained draft pairs with (hybrid: normed `[1, T, H]`; `qwen4_exp`:
    /// streams `[1, T, S·H]`).
    pub fn forward(
        &self,
        embedded: &Tensor,
        hidden: &Tensor,
        next: &[u32],
        cache: &mut KvCache,
    ) -> Result<Tensor> {
        match self {
            Self::Hybrid(h) => h.forward(embedded, hidden, cache),
            Self::Qwen4Exp(h) => h.forward(embedded, hidden, next, cache),
        }
    }

    /// The lm_head's input `[1, T, H]` from [`Self::forward`]'s output.
    pub fn logits_input(&self, out: &Tensor) -> Result<Tensor> {
        match self {
            Self::Hybrid(_) => Ok(out.clone()),
            Self::Qwen4Exp(h) => h.logits_input(out),
        }
    }
}
