//! Qwen3.8-Flash-Next's (`qwen4_exp`) own multi-token-prediction head, as mlx-vlm 0.7.10 runs
//! it (`speculative/drafters/qwen4_exp_mtp`, `Qwen4ExpMTPDraftModel`; docs/mtp.md §8 says what
//! was read). Unlike the hybrid families' head it reads the main model's `S` residual streams
//! **before** the final mixer, keeps `S` streams through its own decoder layer, and has a
//! mixer of its own:
//!
//! ```text
//! e  = fc_embedding(pre_fc_norm_embedding(embed(token[i+1])))          [H]
//! hs = pre_fc_norm_hidden(streams[i])             one norm over all S·H features
//! x  = fc_hidden(hs reshaped [S, H]) + e          the same [H,H] product per stream, e added
//! y  = decoder layer (QSA attention, MoE, both hyper-connections; no PLE)   [S·H]
//! logits = lm_head(hyper_connection_mixer(y))     the head's own mixer, the main lm_head
//! ```
//!
//! `y` (streams, before the mixer) is what the next chained draft pairs with its token. Every
//! head norm is zero-centred (`1 + w`) in the HF layout and in mlx-vlm's; the `mtp.*` view
//! still judges each from its values (`Checkpoint::norm`, `Checkpoint::centred_norm`).

use super::decoder::{IndexedAttention, LayerInput, Qwen4ExpLayer, Qwen4Mixer};
use super::hyper_connection::HyperConnection;
use super::qsa_indexer::QsaIndexer;
use super::state::QsaState;
use crate::cache::{KvCache, LayerCache};
use crate::families::hybrid::LayerCoverage;
use crate::layers::attention::Attention;
use crate::layers::linear::Linear;
use crate::layers::moe::SparseMoe;
use crate::layers::norm::RmsNorm;
use crate::tap::NoTap;
use crate::weights::Checkpoint;
use crate::Config;
use anyhow::{anyhow, bail, Context, Result};
use candle_core::{DType, Device, Tensor};
use gdn_ops::launches::candle_op;

/// The canonical prefix of the head's decoder layer.
const LAYER: &str = "mtp.layers.0";

#[derive(Debug)]
pub struct Qwen4ExpMtpHead {
    pre_fc_norm_embedding: RmsNorm,
    /// Over all `S·H` features of a position at once (mlx-vlm: "one global RMS normalization
    /// across all hyper-connection streams").
    pre_fc_norm_hidden: RmsNorm,
    fc_embedding: Linear,
    /// Applied to each stream alone.
    fc_hidden: Linear,
    layer: Qwen4ExpLayer,
    /// The head's own final mixer (without injection weights).
    mixer: HyperConnection,
    streams: usize,
    hidden: usize,
}

impl Qwen4ExpMtpHead {
    /// The head from the checkpoint's `mtp.*` view; a missing or mis-shaped tensor is an error
    /// naming it, and so is a tensor of the view that nothing reads.
    pub fn load(ckpt: &Checkpoint, cfg: &Config) -> Result<Self> {
        let q = cfg
            .qwen4_exp
            .as_ref()
            .ok_or_else(|| anyhow!("not a qwen4_exp config"))?;
        let (s, h) = (q.hc_count, cfg.hidden_size);
        let eps = cfg.rms_norm_eps as f32;
        let norm = |name: &str, dim: usize| -> Result<RmsNorm> {
            Ok(RmsNorm {
                weight: ckpt.norm(name, dim, &Device::Cpu)?,
                eps,
            })
        };
        let attn = format!("{LAYER}.self_attn");
        let hc = |name: &str| HyperConnection::load(ckpt, &format!("{LAYER}.{name}"), cfg, true);
        // mlx-vlm builds the layer as a one-layer model's layer 0 of kind
        // "qwen_sparse_attention", without a per-layer embedding.
        let layer = (|| -> Result<Qwen4ExpLayer> {
            Ok(Qwen4ExpLayer {
                ple: None,
                attn_hc: hc("attn_hyper_connection")?,
                mixer: Qwen4Mixer::Qsa(Box::new(IndexedAttention {
                    attention: Attention::load(ckpt, &attn, cfg)?,
                    indexer: QsaIndexer::load(ckpt, &attn, cfg)?,
                })),
                mlp_hc: hc("mlp_hyper_connection")?,
                moe: SparseMoe::load(ckpt, &format!("{LAYER}.mlp"), cfg)?,
            })
        })()
        .with_context(|| format!("loading the MTP head's layer {LAYER}"))?;
        let head = Self {
            pre_fc_norm_embedding: norm("mtp.pre_fc_norm_embedding.weight", h)?,
            pre_fc_norm_hidden: norm("mtp.pre_fc_norm_hidden.weight", s * h)?,
            fc_embedding: Linear::load(ckpt, "mtp.fc_embedding", h, h, cfg)?,
            fc_hidden: Linear::load(ckpt, "mtp.fc_hidden", h, h, cfg)?,
            layer,
            mixer: HyperConnection::load(ckpt, "mtp.hyper_connection_mixer", cfg, false)?,
            streams: s,
            hidden: h,
        };
        ckpt.leftovers()?;
        Ok(head)
    }

    /// The device plan's copy.
    pub fn into_device(self, device: &Device, dtype: DType) -> Result<Self> {
        let l = self.layer;
        let Qwen4Mixer::Qsa(q) = l.mixer else {
            bail!("the MTP head's layer is a QSA layer");
        };
        Ok(Self {
            pre_fc_norm_embedding: self.pre_fc_norm_embedding.into_device(device, dtype)?,
            pre_fc_norm_hidden: self.pre_fc_norm_hidden.into_device(device, dtype)?,
            fc_embedding: self.fc_embedding.into_device(device, dtype)?,
            fc_hidden: self.fc_hidden.into_device(device, dtype)?,
            layer: Qwen4ExpLayer {
                ple: None,
                attn_hc: l.attn_hc.into_device(device, dtype)?,
                mixer: Qwen4Mixer::Qsa(Box::new(IndexedAttention {
                    attention: q.attention.into_device(device, dtype)?,
                    indexer: q.indexer.into_device(device, dtype)?,
                })),
                mlp_hc: l.mlp_hc.into_device(device, dtype)?,
                moe: l.moe.into_device(device, dtype)?,
            },
            mixer: self.mixer.into_device(device, dtype)?,
            streams: self.streams,
            hidden: self.hidden,
        })
    }

    /// An empty cache for the head's attention: keys, values and the indexer's block keys.
    pub fn new_cache(&self) -> KvCache {
        let mut kv = KvCache::default();
        if let Qwen4Mixer::Qsa(q) = &self.layer.mixer {
            let qsa = q.indexer.config();
            kv.family = Some(Box::new(QsaState::new(qsa.head_dim, qsa.compress_ratio)));
        }
        kv
    }

    /// The head on pairs: `embedded` `[1, T, H]` (the embeddings of tokens i+1, which are
    /// `next`) and `streams` `[1, T, S·H]` (the main model's streams at i before its final
    /// mixer, or the head's own for a chained draft), placed after what `cache` holds.
    /// Returns the head's output streams `[1, T, S·H]` ([`Self::logits_input`] mixes them).
    pub fn forward(
        &self,
        embedded: &Tensor,
        streams: &Tensor,
        next: &[u32],
        cache: &mut KvCache,
    ) -> Result<Tensor> {
        let (_, t, h) = embedded.dims3()?;
        let (s, width) = (self.streams, self.streams * self.hidden);
        if streams.dims() != [1, t, width] || h != self.hidden {
            bail!(
                "MTP head: embeddings {:?} and streams {:?} do not pair up (streams of {s}×{})",
                embedded.dims(),
                streams.dims(),
                self.hidden
            );
        }
        let e = self
            .fc_embedding
            .forward(&self.pre_fc_norm_embedding.forward(embedded)?)?; // [1, T, H]
        let streams = crate::tensor::cast(streams, e.dtype())?;
        let n = self.pre_fc_norm_hidden.forward(&streams)?; // [1, T, S·H]
        let n = candle_op(n.reshape((t * s, h)))?;
        let x = candle_op(self.fc_hidden.forward(&n)?.reshape((t, s, h)))?;
        let x = candle_op(x.broadcast_add(&candle_op(e.reshape((t, 1, h)))?))?;
        let x = candle_op(x.reshape((t, width)))?;
        // Positions count the pairs the head has seen, as mlx-vlm's `_next_position` (reset
        // to 0 at the prompt's prefill, moved back by a trim).
        let offset = cache.len();
        let mut layer_cache = LayerCache::Attention(std::mem::take(cache));
        let none = LayerCoverage {
            mixer: false,
            feed_forward: false,
        };
        let out = self.layer.forward(
            0,
            &x,
            LayerInput::Tokens(next),
            &mut layer_cache,
            offset,
            none,
            None,
            &mut NoTap,
        );
        let LayerCache::Attention(kv) = layer_cache else {
            unreachable!("an attention cache stays one")
        };
        *cache = kv;
        Ok(out?.0.unsqueeze(0)?)
    }

    /// The lm_head's input `[1, T, H]` from the head's output streams `[1, T, S·H]`: the
    /// head's own mixer.
    pub fn logits_input(&self, streams: &Tensor) -> Result<Tensor> {
        Ok(self.mixer.forward(&streams.squeeze(0)?)?.0.unsqueeze(0)?)
    }
}
