//! Where NaN or Inf logits come from. Broken weights (a NaN in a norm, an overflowing scale)
//! or a config that does not match the checkpoint make a layer produce non-finite values,
//! which then flow through every later layer and the cache: the logits only say that
//! something broke. [`first_non_finite`] runs the tokens again from an empty cache, one
//! mixer and one feed-forward at a time, and names the first part whose output is not
//! finite. For `qwen4_exp` the parts are its own: the per-layer embedding, the mixer with
//! its hyper-connection, the MoE with its hyper-connection, and the final stream mixer.

use crate::cache::Cache;
use crate::families::Decoder;
use crate::tap::{Part, Stopped, Tap};
use crate::Model;
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

impl From<Part> for Origin {
    fn from(part: Part) -> Self {
        match part {
            Part::Embedding => Self::Embedding,
            Part::PerLayerEmbedding { layer } => Self::PerLayerEmbedding { layer },
            Part::Mixer { layer, attention } => Self::Mixer { layer, attention },
            Part::FeedForward { layer, .. } => Self::FeedForward { layer },
            Part::OutputHead => Self::Head,
        }
    }
}

/// The tap that looks for the first part whose contribution or resulting stream is not
/// finite (a residual sum can overflow even when both terms are finite), and stops there.
#[derive(Default)]
struct NonFinite {
    origin: Option<Origin>,
}

impl Tap for NonFinite {
    fn part(&mut self, part: Part, added: &Tensor, stream: &Tensor) -> Result<()> {
        if !all_finite(added)? || !all_finite(stream)? {
            self.origin = Some(part.into());
            return Err(Stopped.into());
        }
        Ok(())
    }
}

/// Runs `tokens` from an empty cache in chunks of `chunk`, checking the output of each part
/// in order (chunk by chunk, layer by layer), and returns the first that is not finite;
/// [`Origin::Head`] when every hidden state is finite.
pub fn first_non_finite(model: &Model, tokens: &[u32], chunk: usize) -> Result<Origin> {
    let mut cache: Cache = model.new_cache();
    for part in tokens.chunks(chunk.max(1)) {
        let mut tap = NonFinite::default();
        let h = match model.run_layers(part, &mut cache, &mut tap) {
            Err(e) if e.is::<Stopped>() => {
                return Ok(tap.origin.expect("the tap stopped at a part"))
            }
            other => other?,
        };
        // As the model's own forward pass: the reference plan's products run on the CPU pool.
        let final_finite = model.on_host_workers(|| all_finite(&model.final_norm(&h)?))?;
        if !final_finite {
            return Ok(match model.decoder() {
                Decoder::Hybrid(_) => Origin::FinalNorm,
                Decoder::Qwen4Exp(_) => Origin::FinalMixer,
            });
        }
    }
    Ok(Origin::Head)
}
