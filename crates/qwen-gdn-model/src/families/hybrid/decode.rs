//! One decode step (one token, one sequence) on the fused kernels of the device plan.
//!
//! The residual stream and the next normed input travel together: every residual add is
//! fused with the RMSNorm that follows it (`add_rms_norm`, or `moe_combine` after a MoE
//! block, which also takes the weighted sum of the expert slots). A layer whose shapes the
//! kernels do not cover runs its composed mixer or feed-forward inside the same step, so the
//! result never depends on coverage; `Model::forward_last` with fused decode off is the
//! composed reference of the whole step.

use super::{DecoderLayer, FeedForward, HybridDecoder, Mixer};
use crate::cache::{Cache, LayerCache};
use crate::families::Ends;
use crate::layers::norm::RmsNorm;
use crate::tap::{each_layer, Tap};
use crate::tensor::cast;
use anyhow::{bail, Result};
use candle_core::{DType, Tensor};
use gdn_ops::ops::{add_rms_norm::add_rms_norm, moe_combine::moe_combine_with};
use gdn_ops::profile;

/// Which parts of each layer the fused kernels cover, decided once at load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerCoverage {
    pub mixer: bool,
    pub feed_forward: bool,
}

/// What the fused kernels cover, per layer (a layer outside it runs composed ops).
pub(super) fn fused_coverage(layers: &[DecoderLayer], dtype: DType) -> Vec<LayerCoverage> {
    layers
        .iter()
        .map(|l| LayerCoverage {
            mixer: match &l.mixer {
                Mixer::Gdn(m) => m.fused_decode_supported(dtype),
                Mixer::Attention(m) => m.fused_decode_supported(dtype),
            },
            feed_forward: match &l.feed_forward {
                FeedForward::Moe(m) => m.fused_decode_supported(dtype),
                FeedForward::Dense(_) => false,
            },
        })
        .collect()
}

impl HybridDecoder {
    /// `[1, vocab]` f32 logits of `token` (already checked against the vocabulary) after
    /// what `cache` holds, advancing it, each layer shown to `tap`. On CUDA without a tap
    /// the step is replayed from a captured graph (`cuda_graph.rs`); with one it runs
    /// eagerly, so that `bench --profile-decode` times its kernels one by one.
    pub fn decode_step(
        &self,
        ends: &Ends,
        token: u32,
        cache: &mut Cache,
        tap: Option<&mut dyn Tap>,
    ) -> Result<Tensor> {
        let Some(tap) = tap else {
            #[cfg(feature = "cuda")]
            if ends.device.is_cuda() && self.cuda_graph && crate::cuda_graph::enabled() {
                return super::cuda_graph::step(self, ends, token, cache);
            }
            return self.decode_step(ends, token, cache, Some(&mut crate::tap::NoTap));
        };
        // The token's id and position are the step's only uploads.
        let token = Tensor::new(&[token], ends.device)?;
        let pos = Tensor::new(&[cache.offset as u32], ends.device)?;
        self.decode_step_on(ends, &token, &pos, cache, tap)
    }

    /// The fused step for the token id and position held in `[1]` u32 device tensors (what
    /// a captured graph reads on replay).
    pub(crate) fn decode_step_on(
        &self,
        ends: &Ends,
        token: &Tensor,
        pos: &Tensor,
        cache: &mut Cache,
        tap: &mut dyn Tap,
    ) -> Result<Tensor> {
        let embedded = profile::labelled("embed", || ends.embed.forward_ids(token, ends.dtype))?; // [1, H]
        let first_norm = &self.layers[0].input_norm;
        let (h, x) = add_rms_norm(&embedded, None, &first_norm.weight, first_norm.eps)?;
        let offset = cache.offset;
        let final_norm = self.final_norm()?;
        let (_, x) = each_layer(
            &self.layers,
            &mut cache.layers,
            tap,
            (h, x),
            |i, layer, layer_cache, (h, x), _| {
                // The decode profile's rows of this layer (`bench --profile-decode`).
                let _profiled = profile::layer(i, layer.mixer.profile_kind());
                let next_norm = self.layers.get(i + 1).map_or(final_norm, |n| &n.input_norm);
                self.fused_layer(i, layer, layer_cache, (h, x), next_norm, pos, offset)
            },
        )?;
        cache.offset += 1;
        // x is the final norm of the last hidden state.
        let logits = profile::labelled("lm_head", || ends.head.forward(&x))?;
        cast(&logits, DType::F32)
    }

    /// Layer `i` of the fused step: the residual stream `h` and its normed copy `x` in, the
    /// stream and `next_norm` of it out.
    #[allow(clippy::too_many_arguments)]
    fn fused_layer(
        &self,
        i: usize,
        layer: &DecoderLayer,
        layer_cache: &mut LayerCache,
        (h, x): (Tensor, Tensor),
        next_norm: &RmsNorm,
        pos: &Tensor,
        offset: usize,
    ) -> Result<(Tensor, Tensor)> {
        let covered = self.coverage[i];
        let mixed = match (&layer.mixer, layer_cache) {
            (Mixer::Gdn(m), LayerCache::Gdn(c)) if covered.mixer => m.decode_fused(&x, c)?,
            (Mixer::Attention(m), LayerCache::Attention(c)) if covered.mixer => {
                m.decode_fused(&x, c, pos)?
            }
            (Mixer::Gdn(m), LayerCache::Gdn(c)) => m.forward(&x.unsqueeze(1)?, c)?.squeeze(1)?,
            (Mixer::Attention(m), LayerCache::Attention(c)) => {
                m.forward(&x.unsqueeze(1)?, c, offset)?.squeeze(1)?
            }
            _ => bail!("cache does not belong to this model"),
        };
        let post = &layer.post_norm;
        let (h, x) = add_rms_norm(&h, Some(&mixed), &post.weight, post.eps)?;
        self.feed_forward_step(layer, covered.feed_forward, (h, x), next_norm)
    }

    /// The feed-forward of a decode step (one row per sequence) after the mixer: the residual
    /// stream `h` and its post-norm `x` in, the stream and `next_norm` of it out; a MoE block
    /// on the fused kernels (`fused`: they cover it for these rows), else composed.
    pub(super) fn feed_forward_step(
        &self,
        layer: &DecoderLayer,
        fused: bool,
        (h, x): (Tensor, Tensor),
        next_norm: &RmsNorm,
    ) -> Result<(Tensor, Tensor)> {
        Ok(match &layer.feed_forward {
            FeedForward::Moe(m) if fused => {
                let (down, weights) = m.decode_fused(&x)?;
                let (h, x) = moe_combine_with(
                    &down,
                    &weights,
                    &h,
                    Some((&next_norm.weight, next_norm.eps)),
                    self.moe_combine,
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
        })
    }
}
