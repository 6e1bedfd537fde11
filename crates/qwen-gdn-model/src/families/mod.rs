//! Model families. A family's folder holds what only it uses: its layers' wiring, its own
//! layers and state, its fused decode step; the building blocks the families share are in
//! [`crate::layers`]. [`Decoder`] is the registry: one arm per family, between the
//! embedding and the output head that every family shares ([`crate::Model`]).

pub mod hybrid;
pub mod mtp_head;
pub mod qwen4_exp;

pub use mtp_head::FamilyMtpHead;

use crate::layers::linear::{Embedding, Linear};
use crate::layers::moe::MoePrefill;
use crate::tap::Tap;
use crate::{Cache, StateDtype};
use anyhow::Result;
use candle_core::{DType, Device, Tensor};
use gdn_ops::ops::moe_route::RouteKernel;

/// The decoder layers and what replaces the final norm, per family.
#[derive(Debug)]
pub enum Decoder {
    /// Qwen3-Next, Qwen3.5, Qwen3.6.
    Hybrid(hybrid::HybridDecoder),
    /// `qwen4_exp` (docs/qwen4_exp.md).
    Qwen4Exp(Box<qwen4_exp::Qwen4ExpDecoder>),
}

/// What a family's fused decode step takes from the model around its decoder.
pub struct Ends<'a> {
    pub embed: &'a Embedding,
    pub head: &'a Linear,
    pub device: &'a Device,
    pub dtype: DType,
}

impl Decoder {
    pub fn num_layers(&self) -> usize {
        match self {
            Self::Hybrid(d) => d.layers.len(),
            Self::Qwen4Exp(d) => d.layers.len(),
        }
    }

    /// Hands every layer the run's kernel variants (`RunOptions::layer_variants`).
    pub fn set_variants(&mut self, v: &crate::LayerVariants) {
        match self {
            Self::Hybrid(d) => d.set_variants(v),
            Self::Qwen4Exp(d) => d.set_variants(v),
        }
        self.set_moe_prefill(v.moe_prefill);
        self.set_moe_route(v.moe_route);
    }

    /// The MoE router kernel's body of every MoE block.
    pub fn set_moe_route(&mut self, kernel: RouteKernel) {
        self.moe_blocks_mut()
            .into_iter()
            .for_each(|m| m.set_route(kernel));
    }

    pub fn set_moe_prefill(&mut self, mode: MoePrefill) {
        self.moe_blocks_mut()
            .into_iter()
            .for_each(|m| m.set_prefill(mode));
    }

    /// Every MoE block this process holds, in layer order.
    pub fn moe_blocks_mut(&mut self) -> Vec<&mut crate::layers::moe::SparseMoe> {
        match self {
            Self::Hybrid(d) => d
                .layers
                .iter_mut()
                .filter_map(|l| match &mut l.feed_forward {
                    hybrid::FeedForward::Moe(m) => Some(m.as_mut()),
                    hybrid::FeedForward::Dense(_) => None,
                })
                .collect(),
            Self::Qwen4Exp(d) => d.layers.iter_mut().map(|l| &mut l.moe).collect(),
        }
    }

    /// A fresh cache whose GDN states are stored in `state_dtype`.
    pub fn new_cache(&self, state_dtype: StateDtype) -> Cache {
        Cache::new(match self {
            Self::Hybrid(d) => d.new_cache(state_dtype),
            Self::Qwen4Exp(d) => d.new_cache(state_dtype),
        })
    }

    /// The layers on the embedded tokens `h` `[1, S, H]` (for `tokens` at the cache's
    /// offset, which the caller advances): the lm_head's input before the final norm,
    /// `[1, S, H]` (`[1, S, streams·H]` for `qwen4_exp`).
    pub fn forward(
        &self,
        h: Tensor,
        tokens: &[u32],
        cache: &mut Cache,
        tap: &mut dyn Tap,
    ) -> Result<Tensor> {
        match self {
            Self::Hybrid(d) => d.forward(h, cache, tap),
            Self::Qwen4Exp(d) => d.forward(h, tokens, cache, tap),
        }
    }

    /// One decode step of several sequences: row `i` of `h` `[1, B, H]` is the embedded
    /// `tokens[i]`, the next token of the sequence `caches[i]` holds (the caller advances the
    /// offsets). The hybrid family shares each product's weight read over the rows; a family
    /// without a batched step runs the sequences one after another.
    pub fn forward_batch(
        &self,
        h: Tensor,
        tokens: &[u32],
        caches: &mut [&mut Cache],
        tap: &mut dyn Tap,
    ) -> Result<Tensor> {
        match self {
            Self::Hybrid(d) => d.forward_batch(h, caches, tap),
            Self::Qwen4Exp(d) => {
                let rows = caches
                    .iter_mut()
                    .enumerate()
                    .map(|(i, cache)| d.forward(h.narrow(1, i, 1)?, &tokens[i..=i], cache, tap))
                    .collect::<Result<Vec<_>>>()?;
                crate::candle_ops::cat(&rows, 1)
            }
        }
    }

    /// The final norm, or what takes its place: [`Decoder::forward`]'s output → the
    /// lm_head's input `[1, S, H]`.
    pub fn final_norm(&self, h: &Tensor) -> Result<Tensor> {
        match self {
            Self::Hybrid(d) => d.final_norm()?.forward(h),
            Self::Qwen4Exp(d) => Ok(d.final_mix(&h.squeeze(0)?)?.unsqueeze(0)?),
        }
    }

    /// What a family's MTP head reads of [`Decoder::forward`]'s output: the lm_head's input
    /// (after the final norm) for the hybrid families, the streams before the final mixer
    /// for `qwen4_exp` (mlx-vlm's drafter, docs/mtp.md §8).
    pub fn drafter_hidden(&self, h: &Tensor) -> Result<Tensor> {
        match self {
            Self::Hybrid(_) => self.final_norm(h),
            Self::Qwen4Exp(_) => Ok(h.clone()),
        }
    }

    /// The lm_head's input from [`Decoder::drafter_hidden`]'s output.
    pub fn head_input(&self, drafter_hidden: &Tensor) -> Result<Tensor> {
        match self {
            Self::Hybrid(_) => Ok(drafter_hidden.clone()),
            Self::Qwen4Exp(_) => self.final_norm(drafter_hidden),
        }
    }
}
