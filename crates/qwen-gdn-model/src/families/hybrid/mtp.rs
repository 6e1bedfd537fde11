//! The multi-token-prediction (MTP) head that Qwen3-Next and Qwen3.5/3.6 checkpoints ship
//! (`mtp.*`), as vLLM, SGLang and mlx-vlm run it (docs/mtp.md cites what was read). For the
//! pair (main model's hidden state at position i, token i+1) it predicts token i+2:
//!
//! ```text
//! e = pre_fc_norm_embedding(embed(token[i+1]))     the main model's embedding
//! h = pre_fc_norm_hidden(hidden[i])                hidden AFTER the main model's final norm
//! x = fc(cat[e, h])                                embedding first
//! x = decoder layer (full gated attention, the family's MLP or MoE; its own KV cache)
//! g = norm(x);  logits = lm_head(g)                the main model's lm_head
//! ```
//!
//! `g` is also the hidden state the next chained draft pairs with its token. The head's norms
//! are zero-centred in raw checkpoints and shifted in some conversions: the `mtp.*` view of
//! the checkpoint reads each in the convention its values show (`weights/norm_convention.rs`).

use super::layer::DecoderLayer;
use crate::cache::{KvCache, LayerCache};
use crate::config::LayerKind;
use crate::layers::linear::Linear;
use crate::layers::norm::RmsNorm;
use crate::tap::NoTap;
use crate::weights::Checkpoint;
use crate::Config;
use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Tensor, D};
use gdn_ops::launches::candle_op;

#[derive(Debug, Clone)]
pub struct MtpHead {
    pre_fc_norm_embedding: RmsNorm,
    pre_fc_norm_hidden: RmsNorm,
    fc: Linear,
    layer: DecoderLayer,
    norm: RmsNorm,
}

impl MtpHead {
    /// The head from the checkpoint's `mtp.*` view ([`Checkpoint::open_mtp`]); every tensor
    /// of the view must be used (a second MTP layer, or dedicated embeddings, are errors).
    pub fn load(ckpt: &Checkpoint, cfg: &Config) -> Result<Self> {
        let h = cfg.hidden_size;
        let eps = cfg.rms_norm_eps as f32;
        let norm = |name: &str| -> Result<RmsNorm> {
            Ok(RmsNorm {
                weight: ckpt.norm(name, h, &Device::Cpu)?,
                eps,
            })
        };
        // vLLM and SGLang build the head's layer with the index of layer 0: its MLP is a MoE
        // where layer 0's is.
        let layer = DecoderLayer::load_at(
            ckpt,
            "mtp.layers.0",
            LayerKind::FullAttention,
            cfg.is_moe_layer(0),
            cfg,
        )
        .context("loading the MTP head's layer mtp.layers.0")?;
        let head = Self {
            pre_fc_norm_embedding: norm("mtp.pre_fc_norm_embedding.weight")?,
            pre_fc_norm_hidden: norm("mtp.pre_fc_norm_hidden.weight")?,
            fc: Linear::load(ckpt, "mtp.fc", h, 2 * h, cfg)?,
            layer,
            norm: norm("mtp.norm.weight")?,
        };
        ckpt.leftovers()?;
        Ok(head)
    }

    /// The device plan's copy.
    pub fn into_device(self, device: &Device, dtype: DType) -> Result<Self> {
        Ok(Self {
            pre_fc_norm_embedding: self.pre_fc_norm_embedding.into_device(device, dtype)?,
            pre_fc_norm_hidden: self.pre_fc_norm_hidden.into_device(device, dtype)?,
            fc: self.fc.into_device(device, dtype)?,
            layer: self.layer.into_device(device, dtype)?,
            norm: self.norm.into_device(device, dtype)?,
        })
    }

    /// An empty KV cache for the head's attention.
    pub fn new_cache(&self) -> KvCache {
        KvCache::default()
    }

    /// The head on pairs: `embedded` `[1, S, H]` (the embeddings of tokens i+1) and `hidden`
    /// `[1, S, H]` (the main model's normed hidden states at i), placed after what `cache`
    /// holds. Returns `g` `[1, S, H]`, after the head's final norm: the lm_head's input.
    pub fn forward(
        &self,
        embedded: &Tensor,
        hidden: &Tensor,
        cache: &mut KvCache,
    ) -> Result<Tensor> {
        if embedded.dims() != hidden.dims() {
            bail!(
                "MTP head: embeddings {:?} and hidden states {:?} do not pair up",
                embedded.dims(),
                hidden.dims()
            );
        }
        let e = self.pre_fc_norm_embedding.forward(embedded)?;
        let h = self
            .pre_fc_norm_hidden
            .forward(&crate::tensor::cast(hidden, e.dtype())?)?;
        let x = self
            .fc
            .forward(&candle_op(Tensor::cat(&[&e, &h], D::Minus1))?)?;
        // Positions count the pairs the head has seen (RoPE is relative, so where its history
        // starts does not matter), which keeps the causal mask's key indices = positions.
        let offset = cache.len();
        let mut layer_cache = LayerCache::Attention(std::mem::take(cache));
        let out = self
            .layer
            .forward(0, &x, &mut layer_cache, offset, &mut NoTap);
        let LayerCache::Attention(kv) = layer_cache else {
            unreachable!("an attention cache stays one")
        };
        *cache = kv;
        self.norm.forward(&out?)
    }
}
