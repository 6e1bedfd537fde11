//! One decode step (one token, one sequence) on the fused kernels of the device plan.
//!
//! The residual stream and the next normed input travel together: every residual add is
//! fused with the RMSNorm that follows it (`add_rms_norm`, or `moe_combine` after a MoE
//! block, which also takes the weighted sum of the expert slots). A layer whose shapes the
//! kernels do not cover runs its composed mixer or feed-forward inside the same step, so the
//! result never depends on coverage; [`Model::forward_last`] with fused decode off is the
//! composed reference of the whole step.

use super::{FeedForward, Mixer, Model};
use crate::cache::{Cache, LayerCache};
use crate::layers::norm::{cast, RmsNorm};
use anyhow::{bail, Result};
use candle_core::{DType, Tensor};
use gdn_ops::ops::{add_rms_norm::add_rms_norm, moe_combine::moe_combine};
use gdn_ops::profile::{self, LayerKind};

/// Which parts of each layer the fused kernels cover, decided once at load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerCoverage {
    pub mixer: bool,
    pub feed_forward: bool,
}

impl Model {
    /// What the fused kernels cover, per layer (a layer outside it runs composed ops).
    pub(crate) fn fused_coverage(&self) -> Vec<LayerCoverage> {
        self.layers
            .iter()
            .map(|l| LayerCoverage {
                mixer: match &l.mixer {
                    Mixer::Gdn(m) => m.fused_decode_supported(self.dtype),
                    Mixer::Attention(m) => m.fused_decode_supported(self.dtype),
                },
                feed_forward: match &l.feed_forward {
                    FeedForward::Moe(m) => m.fused_decode_supported(self.dtype),
                    FeedForward::Dense(_) => false,
                },
            })
            .collect()
    }

    /// `[1, vocab]` f32 logits of `token` after what `cache` holds, advancing it. On CUDA
    /// the step is replayed from a captured graph ([`super::cuda_graph`]).
    pub(crate) fn decode_step(&self, token: u32, cache: &mut Cache) -> Result<Tensor> {
        #[cfg(feature = "cuda")]
        if self.device.is_cuda() && self.cuda_graph && super::cuda_graph::enabled() {
            return super::cuda_graph::step(self, token, cache);
        }
        self.decode_step_counted(token, cache, None)
    }

    /// As [`Model::forward_last`] for one token on the fused path, also returning the kernel
    /// launches of each layer (the difference of [`gdn_ops::launches::count`] around it:
    /// counted where the kernels are launched). Everything else the step launches
    /// (embedding, first norm, head) is the total minus their sum.
    ///
    /// Always the eager step, never a CUDA graph's replay: `bench --profile-decode` times its
    /// kernels one by one through it.
    pub fn decode_step_with_launches(
        &self,
        token: u32,
        cache: &mut Cache,
    ) -> Result<(Tensor, Vec<usize>)> {
        let mut per_layer = Vec::with_capacity(self.layers.len());
        let logits = self.decode_step_counted(token, cache, Some(&mut per_layer))?;
        Ok((logits, per_layer))
    }

    fn decode_step_counted(
        &self,
        token: u32,
        cache: &mut Cache,
        per_layer: Option<&mut Vec<usize>>,
    ) -> Result<Tensor> {
        if cache.layers.len() != self.num_layers() {
            bail!("cache does not belong to this model");
        }
        if !self.fused_decode {
            return self.composed_step_counted(token, cache, per_layer);
        }
        self.check_token(token)?;
        // The token's id and position are the step's only uploads.
        let token = Tensor::new(&[token], &self.device)?;
        let pos = Tensor::new(&[cache.offset as u32], &self.device)?;
        self.decode_step_on(&token, &pos, cache, per_layer)
    }

    pub(crate) fn check_token(&self, token: u32) -> Result<()> {
        let vocab = self.config.vocab_size;
        if token as usize >= vocab {
            bail!("token id {token} is outside the vocabulary ({vocab})");
        }
        Ok(())
    }

    /// The fused step for the token id and position held in `[1]` u32 device tensors (what
    /// a captured graph reads on replay), launches counted per layer if asked.
    pub(crate) fn decode_step_on(
        &self,
        token: &Tensor,
        pos: &Tensor,
        cache: &mut Cache,
        mut per_layer: Option<&mut Vec<usize>>,
    ) -> Result<Tensor> {
        let embedded = profile::labelled("embed", || self.embed.forward_ids(token, self.dtype))?; // [1, H]
        let first_norm = &self.layers[0].input_norm;
        let (mut h, mut x) = add_rms_norm(&embedded, None, &first_norm.weight, first_norm.eps)?;
        for (i, (layer, layer_cache)) in self.layers.iter().zip(cache.layers.iter_mut()).enumerate()
        {
            let launches_before = gdn_ops::launches::count();
            // The decode profile's rows of this layer (`bench --profile-decode`).
            let _profiled = profile::layer(
                i,
                match layer.mixer {
                    Mixer::Gdn(_) => LayerKind::Gdn,
                    Mixer::Attention(_) => LayerKind::Attention,
                },
            );
            let covered = self.coverage[i];
            let next_norm: &RmsNorm = match self.layers.get(i + 1) {
                Some(next) => &next.input_norm,
                None => self
                    .norm
                    .as_ref()
                    .ok_or_else(|| anyhow::anyhow!("no fused decode for this model family"))?,
            };
            let mixed = match (&layer.mixer, layer_cache) {
                (Mixer::Gdn(m), LayerCache::Gdn(c)) if covered.mixer => m.decode_fused(&x, c)?,
                (Mixer::Attention(m), LayerCache::Attention(c)) if covered.mixer => {
                    m.decode_fused(&x, c, pos)?
                }
                (Mixer::Gdn(m), LayerCache::Gdn(c)) => {
                    m.forward(&x.unsqueeze(1)?, c)?.squeeze(1)?
                }
                (Mixer::Attention(m), LayerCache::Attention(c)) => {
                    m.forward(&x.unsqueeze(1)?, c, cache.offset)?.squeeze(1)?
                }
                _ => bail!("cache does not belong to this model"),
            };
            let post = &layer.post_norm;
            (h, x) = add_rms_norm(&h, Some(&mixed), &post.weight, post.eps)?;
            (h, x) = match &layer.feed_forward {
                FeedForward::Moe(m) if covered.feed_forward => {
                    let (down, weights) = m.decode_fused(&x)?;
                    let (h, x) = moe_combine(
                        &down,
                        &weights,
                        &h,
                        Some((&next_norm.weight, next_norm.eps)),
                    )?;
                    (h, x.expect("a norm weight was given"))
                }
                ff => {
                    let out = match ff {
                        FeedForward::Moe(m) => m.forward(&x)?,
                        FeedForward::Dense(m) => m.forward(&x)?,
                    };
                    add_rms_norm(&h, Some(&out), &next_norm.weight, next_norm.eps)?
                }
            };
            if let Some(counts) = per_layer.as_deref_mut() {
                counts.push(gdn_ops::launches::count() - launches_before);
            }
        }
        cache.offset += 1;
        // x is the final norm of the last hidden state.
        let logits = profile::labelled("lm_head", || self.lm_head.forward(&x))?;
        cast(&logits, DType::F32)
    }
}

impl Model {
    /// The composed decode step ([`Model::forward_last`] with fused decode off), with each
    /// layer's launches counted.
    fn composed_step_counted(
        &self,
        token: u32,
        cache: &mut Cache,
        mut per_layer: Option<&mut Vec<usize>>,
    ) -> Result<Tensor> {
        if self.qwen4_exp.is_some() {
            // Its layers are not `DecoderLayer`s: the composed forward, counted per layer.
            let h = self.run_layers_counted(&[token], cache, per_layer)?;
            return self.logits(&h);
        }
        let mut h = self.embed(&[token])?;
        for (layer, c) in self.layers.iter().zip(cache.layers.iter_mut()) {
            let before = gdn_ops::launches::count();
            h = layer.forward(&h, c, cache.offset)?;
            if let Some(counts) = per_layer.as_deref_mut() {
                counts.push(gdn_ops::launches::count() - before);
            }
        }
        cache.offset += 1;
        self.logits(&h)
    }
}
