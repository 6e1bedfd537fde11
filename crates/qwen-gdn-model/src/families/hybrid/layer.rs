//! One layer of the hybrid family (Qwen3-Next, Qwen3.5, Qwen3.6): a GDN or gated attention
//! mixer, then a dense MLP or a MoE, each behind a pre-norm and a residual add.

use crate::cache::{GdnCache, KvCache, LayerCache};
use crate::config::LayerKind;
use crate::layers::attention::Attention;
use crate::layers::gdn::GatedDeltaNet;
use crate::layers::mlp::Mlp;
use crate::layers::moe::SparseMoe;
use crate::layers::norm::{Gate, RmsNorm};
use crate::tap::{Part, Tap};
use crate::weights::Checkpoint;
use crate::{Config, StateDtype};
use anyhow::{bail, Result};
use candle_core::{DType, Device, Tensor};
use gdn_ops::launches::candle_op;

#[derive(Debug, Clone)]
pub enum Mixer {
    Gdn(GatedDeltaNet),
    Attention(Attention),
}

impl Mixer {
    /// The kind a kernel profile files this mixer's layer under (`bench --profile-decode`,
    /// `--profile-verify`, `--profile-batch`).
    pub fn profile_kind(&self) -> gdn_ops::profile::LayerKind {
        match self {
            Mixer::Gdn(_) => gdn_ops::profile::LayerKind::Gdn,
            Mixer::Attention(_) => gdn_ops::profile::LayerKind::Attention,
        }
    }
}

#[derive(Debug, Clone)]
pub enum FeedForward {
    Dense(Mlp),
    Moe(Box<SparseMoe>),
}

#[derive(Debug, Clone)]
pub struct DecoderLayer {
    pub(super) input_norm: RmsNorm,
    pub mixer: Mixer,
    pub(super) post_norm: RmsNorm,
    pub feed_forward: FeedForward,
}

impl DecoderLayer {
    pub(super) fn load(ckpt: &Checkpoint, i: usize, cfg: &Config) -> Result<Self> {
        let p = format!("model.layers.{i}");
        Self::load_at(ckpt, &p, cfg.layer_kind(i), cfg.is_moe_layer(i), cfg)
    }

    /// The layer whose tensors are under `p` (`model.layers.3`, or the MTP head's
    /// `mtp.layers.0`), with this mixer and a MoE (`moe`) or a dense MLP.
    pub(super) fn load_at(
        ckpt: &Checkpoint,
        p: &str,
        kind: LayerKind,
        moe: bool,
        cfg: &Config,
    ) -> Result<Self> {
        let dev = &Device::Cpu;
        let eps = cfg.rms_norm_eps as f32;
        let mixer = match kind {
            LayerKind::LinearAttention => Mixer::Gdn(GatedDeltaNet::load(
                ckpt,
                &format!("{p}.linear_attn"),
                cfg,
                Gate::Silu,
            )?),
            LayerKind::FullAttention => {
                Mixer::Attention(Attention::load(ckpt, &format!("{p}.self_attn"), cfg)?)
            }
        };
        let feed_forward = if moe {
            FeedForward::Moe(Box::new(SparseMoe::load(ckpt, &format!("{p}.mlp"), cfg)?))
        } else {
            FeedForward::Dense(Mlp::load(
                ckpt,
                &format!("{p}.mlp"),
                cfg.hidden_size,
                cfg.intermediate_size,
                cfg,
            )?)
        };
        Ok(Self {
            input_norm: RmsNorm {
                weight: ckpt.norm(&format!("{p}.input_layernorm.weight"), cfg.hidden_size, dev)?,
                eps,
            },
            mixer,
            post_norm: RmsNorm {
                weight: ckpt.norm(
                    &format!("{p}.post_attention_layernorm.weight"),
                    cfg.hidden_size,
                    dev,
                )?,
                eps,
            },
            feed_forward,
        })
    }

    /// The device plan's copy of this layer; the host copy is dropped as it goes.
    pub(super) fn into_device(self, device: &Device, dtype: DType) -> Result<Self> {
        Ok(Self {
            input_norm: self.input_norm.into_device(device, dtype)?,
            mixer: match self.mixer {
                Mixer::Gdn(m) => Mixer::Gdn(m.into_device(device, dtype)?),
                Mixer::Attention(m) => Mixer::Attention(m.into_device(device, dtype)?),
            },
            post_norm: self.post_norm.into_device(device, dtype)?,
            feed_forward: match self.feed_forward {
                FeedForward::Dense(m) => FeedForward::Dense(m.into_device(device, dtype)?),
                FeedForward::Moe(m) => FeedForward::Moe(Box::new(m.into_device(device, dtype)?)),
            },
        })
    }

    pub(super) fn new_cache(&self, state_dtype: StateDtype) -> LayerCache {
        match self.mixer {
            Mixer::Gdn(_) => LayerCache::Gdn(GdnCache {
                state_dtype,
                ..GdnCache::default()
            }),
            Mixer::Attention(_) => LayerCache::Attention(KvCache::default()),
        }
    }

    /// The mixer's contribution to the residual stream: `mixer(input_norm(h))`.
    pub fn mixer_forward(
        &self,
        h: &Tensor,
        cache: &mut LayerCache,
        offset: usize,
    ) -> Result<Tensor> {
        match (&self.mixer, cache) {
            (Mixer::Gdn(m), LayerCache::Gdn(c)) => m.forward(&self.input_norm.forward(h)?, c),
            (Mixer::Attention(m), LayerCache::Attention(c)) => {
                m.forward(&self.input_norm.forward(h)?, c, offset)
            }
            _ => bail!("cache does not belong to this model"),
        }
    }

    /// [`DecoderLayer::mixer_forward`] for one decode step of several sequences: row `i` of
    /// `h` `[1, B, H]` is sequence `i`'s token at position `offsets[i]`, `caches[i]` its state
    /// on this layer.
    pub fn mixer_forward_batch(
        &self,
        h: &Tensor,
        caches: &mut [&mut LayerCache],
        offsets: &[usize],
    ) -> Result<Tensor> {
        let x = self.input_norm.forward(h)?;
        match &self.mixer {
            Mixer::Gdn(m) => m.forward_batch(
                &x,
                &mut each_as(caches, |c| match c {
                    LayerCache::Gdn(c) => Some(c),
                    LayerCache::Attention(_) => None,
                })?,
            ),
            Mixer::Attention(m) => m.forward_batch(
                &x,
                &mut each_as(caches, |c| match c {
                    LayerCache::Attention(c) => Some(c),
                    LayerCache::Gdn(_) => None,
                })?,
                offsets,
            ),
        }
    }

    /// The feed-forward contribution: `mlp(post_attention_norm(h))`.
    pub fn feed_forward(&self, h: &Tensor) -> Result<Tensor> {
        let x = self.post_norm.forward(h)?;
        match &self.feed_forward {
            FeedForward::Dense(m) => m.forward(&x),
            FeedForward::Moe(m) => m.forward(&x),
        }
    }

    /// Layer `i` on the residual stream `h`, each part shown to `tap`.
    pub fn forward(
        &self,
        i: usize,
        h: &Tensor,
        cache: &mut LayerCache,
        offset: usize,
        tap: &mut dyn Tap,
    ) -> Result<Tensor> {
        let mixed = self.mixer_forward(h, cache, offset)?;
        self.after_mixer(i, h, mixed, tap)
    }

    /// Layer `i` on one decode step of several sequences (see
    /// [`DecoderLayer::mixer_forward_batch`]); the feed-forward takes the rows together.
    pub fn forward_batch(
        &self,
        i: usize,
        h: &Tensor,
        caches: &mut [&mut LayerCache],
        offsets: &[usize],
        tap: &mut dyn Tap,
    ) -> Result<Tensor> {
        let mixed = self.mixer_forward_batch(h, caches, offsets)?;
        self.after_mixer(i, h, mixed, tap)
    }

    /// The residual add of the mixer's output `mixed`, then the feed-forward and its add.
    fn after_mixer(
        &self,
        i: usize,
        h: &Tensor,
        mixed: Tensor,
        tap: &mut dyn Tap,
    ) -> Result<Tensor> {
        let h = candle_op(h + &mixed)?;
        let attention = matches!(self.mixer, Mixer::Attention(_));
        tap.part(
            Part::Mixer {
                layer: i,
                attention,
            },
            &mixed,
            &h,
        )?;
        let fed = self.feed_forward(&h)?;
        let h = candle_op(&h + &fed)?;
        let moe = matches!(self.feed_forward, FeedForward::Moe(_));
        tap.part(Part::FeedForward { layer: i, moe }, &fed, &h)?;
        Ok(h)
    }
}

/// Every sequence's state on this layer as the mixer's kind of cache (`as_kind`), or the
/// error of a cache made for another model.
fn each_as<'a, T>(
    caches: &'a mut [&mut LayerCache],
    as_kind: impl Fn(&'a mut LayerCache) -> Option<&'a mut T>,
) -> Result<Vec<&'a mut T>> {
    caches
        .iter_mut()
        .map(|c| match as_kind(c) {
            Some(c) => Ok(c),
            None => bail!("cache does not belong to this model"),
        })
        .collect()
}
