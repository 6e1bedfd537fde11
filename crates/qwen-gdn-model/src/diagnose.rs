//! Where NaN or Inf logits come from. Broken weights (a NaN in a norm, an overflowing scale)
//! or a config that does not match the checkpoint make a layer produce non-finite values,
//! which then flow through every later layer and the cache: the logits only say that
//! something broke. [`first_non_finite`] runs the tokens again from an empty cache, one
//! mixer and one feed-forward at a time, and names the first part whose output is not
//! finite. For `qwen4_exp` the parts are its own: the per-layer embedding, the mixer with
//! its hyper-connection, the MoE with its hyper-connection, and the final stream mixer.

use crate::cache::Cache;
use crate::families::qwen4_exp::{Qwen4ExpDecoder, Qwen4Mixer};
use crate::model::Mixer;
use crate::{Model, Plan};
use anyhow::Result;
use candle_core::{DType, Tensor};
use std::fmt;

/// The part of the model that first produced a non-finite value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Embedding,
    /// `qwen4_exp`: the per-layer (n-gram) embedding of decoder layer `i`.
    PerLayerEmbedding {
        layer: usize,
    },
    /// The attention or GDN block of decoder layer `i` (for `qwen4_exp` with the
    /// hyper-connection around it).
    Mixer {
        layer: usize,
        attention: bool,
    },
    /// The MLP or MoE block of decoder layer `i` (for `qwen4_exp` with the hyper-connection
    /// around it).
    FeedForward {
        layer: usize,
    },
    FinalNorm,
    /// `qwen4_exp`'s final stream mixer, which takes the final norm's place.
    FinalMixer,
    /// Every hidden state was finite: the output head made the logits non-finite.
    Head,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Embedding => write!(f, "the token embedding (model.embed_tokens)"),
            Self::PerLayerEmbedding { layer } => write!(
                f,
                "layer {layer}'s per-layer n-gram embedding (model.layers.{layer}.ple)"
            ),
            Self::Mixer { layer, attention } => {
                let (what, module) = if attention {
                    ("attention", "self_attn")
                } else {
                    ("linear attention", "linear_attn")
                };
                write!(f, "layer {layer}'s {what} (model.layers.{layer}.{module})")
            }
            Self::FeedForward { layer } => {
                write!(f, "layer {layer}'s feed-forward (model.layers.{layer}.mlp)")
            }
            Self::FinalNorm => write!(f, "the final norm (model.norm)"),
            Self::FinalMixer => write!(f, "the final stream mixer (model.hyper_connection_mixer)"),
            Self::Head => write!(f, "the output head (lm_head)"),
        }
    }
}

/// Whether every element of `t` is finite: `x - x` is 0 for a finite `x` and NaN for NaN or
/// ±Inf, so the sum is 0 exactly when all are finite. One reduction on the tensor's device;
/// only a scalar comes back.
pub fn all_finite(t: &Tensor) -> Result<bool> {
    let t = t.to_dtype(DType::F32)?;
    let zero = t.sub(&t)?.sum_all()?.to_scalar::<f32>()?;
    Ok(zero == 0.0)
}

/// Runs `tokens` from an empty cache in chunks of `chunk`, checking the output of each part
/// in order (chunk by chunk, layer by layer), and returns the first that is not finite;
/// [`Origin::Head`] when every hidden state is finite.
pub fn first_non_finite(model: &Model, tokens: &[u32], chunk: usize) -> Result<Origin> {
    let work = || -> Result<Origin> {
        let _q8 = gdn_ops::affine_q8::Scope::enter(model.q8_activations());
        let mut cache: Cache = model.new_cache();
        for part in tokens.chunks(chunk.max(1)) {
            if let Some(origin) = walk(model, part, &mut cache)? {
                return Ok(origin);
            }
        }
        Ok(Origin::Head)
    };
    // As the model's own forward pass: the reference plan's products run on the CPU pool.
    match model.plan() {
        Plan::Reference => gdn_ops::threads::on_cpu_pool(work),
        Plan::Device => work(),
    }
}

/// One chunk through every part, advancing `cache`.
fn walk(model: &Model, tokens: &[u32], cache: &mut Cache) -> Result<Option<Origin>> {
    if let Some(decoder) = model.qwen4_exp() {
        return walk_qwen4_exp(model, decoder, tokens, cache);
    }
    let mut h = model.embed(tokens)?;
    if !all_finite(&h)? {
        return Ok(Some(Origin::Embedding));
    }
    for (i, (layer, c)) in model
        .layers()
        .iter()
        .zip(cache.layers.iter_mut())
        .enumerate()
    {
        let mixed = layer.mixer_forward(&h, c, cache.offset)?;
        // The residual sum can overflow even when both terms are finite.
        h = (&h + &mixed)?;
        if !all_finite(&mixed)? || !all_finite(&h)? {
            let attention = matches!(layer.mixer, Mixer::Attention(_));
            return Ok(Some(Origin::Mixer {
                layer: i,
                attention,
            }));
        }
        let fed = layer.feed_forward(&h)?;
        h = (&h + &fed)?;
        if !all_finite(&fed)? || !all_finite(&h)? {
            return Ok(Some(Origin::FeedForward { layer: i }));
        }
    }
    cache.offset += tokens.len();
    if !all_finite(&model.final_norm(&h)?)? {
        return Ok(Some(Origin::FinalNorm));
    }
    Ok(None)
}

/// [`walk`] through a `qwen4_exp` decoder: the streams after each part of each layer.
fn walk_qwen4_exp(
    model: &Model,
    decoder: &Qwen4ExpDecoder,
    tokens: &[u32],
    cache: &mut Cache,
) -> Result<Option<Origin>> {
    let h = model.embed(tokens)?;
    if !all_finite(&h)? {
        return Ok(Some(Origin::Embedding));
    }
    let mut hs = decoder.streams_of(&h.squeeze(0)?)?;
    for (i, (layer, c)) in decoder
        .layers
        .iter()
        .zip(cache.layers.iter_mut())
        .enumerate()
    {
        hs = layer.add_per_layer_embedding(&hs, tokens, c)?;
        if !all_finite(&hs)? {
            return Ok(Some(Origin::PerLayerEmbedding { layer: i }));
        }
        hs = layer.mixer_residual(&hs, c, cache.offset)?;
        if !all_finite(&hs)? {
            let attention = matches!(layer.mixer, Qwen4Mixer::Qsa(_));
            return Ok(Some(Origin::Mixer {
                layer: i,
                attention,
            }));
        }
        hs = layer.feed_forward_residual(&hs)?;
        if !all_finite(&hs)? {
            return Ok(Some(Origin::FeedForward { layer: i }));
        }
    }
    cache.offset += tokens.len();
    if !all_finite(&decoder.final_mix(&hs)?)? {
        return Ok(Some(Origin::FinalMixer));
    }
    Ok(None)
}
