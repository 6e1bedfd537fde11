//! A verify window over the main model's [`Cache`]: opened before the forward pass of the k+1
//! tokens to verify, closed once it is known how many of them are kept. Closing puts the cache
//! exactly where it would be had it seen only the kept tokens:
//!
//! - GDN layers: the recurrent state and conv window recorded after the last kept token
//!   (`GdnSteps`: the layer kept a copy after every token of the window);
//! - attention layers: the KV length cut back (the rejected positions stay in the buffer,
//!   unused, and are written over by the next append);
//! - the offset.
//!
//! Why per-token copies rather than recomputing the kept tokens: a rejected draft then costs
//! no second forward pass. The price is memory: per GDN layer one recurrent state
//! (`Hv·Dv·Dk` values) per token of the window, held only while it is open.

use crate::cache::{Cache, LayerCache};
use crate::layers::gdn::GdnSteps;
use anyhow::{bail, ensure, Result};
use candle_core::Tensor;
use gdn_ops::launches::candle_op;

/// What the cache was when the window opened.
#[derive(Debug)]
pub struct Window {
    offset: usize,
    /// Per layer: the KV length of an attention layer.
    kv_lens: Vec<Option<usize>>,
}

impl Window {
    /// Starts recording: every GDN layer of `cache` keeps its state after each token of the
    /// next forward pass.
    pub fn open(cache: &mut Cache) -> Result<Self> {
        let mut kv_lens = Vec::with_capacity(cache.layers.len());
        for layer in &mut cache.layers {
            match layer {
                LayerCache::Gdn(c) => {
                    ensure!(c.steps.is_none(), "a verify window is already open");
                    if c.family.is_some() {
                        bail!("speculative decoding cannot rewind a family's own layer state (qwen4_exp) yet");
                    }
                    c.steps = Some(GdnSteps::default());
                    kv_lens.push(None);
                }
                LayerCache::Attention(c) => {
                    if c.family.is_some() {
                        bail!("speculative decoding cannot rewind a family's own layer state (qwen4_exp) yet");
                    }
                    kv_lens.push(Some(c.len()));
                }
            }
        }
        Ok(Self {
            offset: cache.offset,
            kv_lens,
        })
    }

    /// Stops recording and keeps the first `kept` tokens of the window (at least one: the
    /// token the step started from is always kept).
    pub fn close(self, cache: &mut Cache, kept: usize) -> Result<()> {
        let seen = cache.offset - self.offset;
        ensure!(
            (1..=seen).contains(&kept),
            "keeping {kept} of the {seen} tokens of a verify window"
        );
        for (layer, kv_len) in cache.layers.iter_mut().zip(self.kv_lens) {
            match (layer, kv_len) {
                (LayerCache::Gdn(c), None) => {
                    let steps = c.steps.take().unwrap_or_default();
                    ensure!(
                        steps.len() == seen,
                        "a GDN layer recorded {} of the window's {seen} tokens",
                        steps.len()
                    );
                    // Every token kept: the layer's conv window and state are already
                    // those after the last one.
                    if kept < seen {
                        let (conv, state) = steps.rewind(kept)?;
                        // Copied into the live tensors rather than put in their place: a
                        // CUDA graph captured on them (decode or verify) stays valid.
                        c.conv = Some(into_place(c.conv.take(), conv)?);
                        c.state = Some(into_place(c.state.take(), state)?);
                    }
                }
                (LayerCache::Attention(c), Some(len)) => c.truncate(len + kept),
                _ => bail!("the cache changed its layers inside a verify window"),
            }
        }
        cache.offset = self.offset + kept;
        Ok(())
    }

    /// Stops recording without rewinding (the pass failed, or every token is kept).
    pub fn abandon(cache: &mut Cache) {
        for layer in &mut cache.layers {
            if let LayerCache::Gdn(c) = layer {
                c.steps = None;
            }
        }
    }
}

/// `value` copied into `live` in place when `live` has its shape and dtype (so keeps its
/// identity); else `value` itself.
fn into_place(live: Option<Tensor>, value: Tensor) -> Result<Tensor> {
    match live {
        Some(live)
            if live.shape() == value.shape()
                && live.dtype() == value.dtype()
                && live.is_contiguous()
                && value.is_contiguous() =>
        {
            candle_op(live.slice_set(&value, 0, 0))?;
            Ok(live)
        }
        _ => Ok(value),
    }
}
