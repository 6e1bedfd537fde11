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
//!
//! A family's own layer state (`qwen4_exp`: the per-layer embedding's n-gram context and conv
//! window, the QSA indexer's pooled and tail keys) is not recorded token by token: the
//! indexer pools a block's raw keys as it completes and keeps no per-token history. A cache
//! that holds one is rewound by replay instead: the window keeps a copy of every layer's state
//! at its opening (GDN state and conv rows, the family's state; the KV only as its length),
//! and a close that rejects a token puts those back and runs the kept tokens again
//! ([`Window::close_replaying`]). The state is then, by construction, the one a cache that
//! never saw the rejected tokens gets from the same call. Its price: one copy of the
//! recurrent states and the family's state while the window is open (not one per token),
//! and a second pass over the kept tokens after a rejection.

use crate::cache::{Cache, FamilyState, LayerCache};
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
    /// For a cache with a family's own layer state: every layer's state at the opening, put
    /// back before the kept tokens are run again (see the module doc).
    opening: Option<Vec<Opening>>,
}

/// One layer's state at a replay window's opening (copies: the states advance in place).
#[derive(Debug)]
struct Opening {
    conv: Option<Tensor>,
    state: Option<Tensor>,
    family: Option<Box<dyn FamilyState>>,
}

impl Opening {
    fn of(layer: &LayerCache) -> Result<Self> {
        let copy = |t: &Option<Tensor>| t.as_ref().map(Tensor::copy).transpose();
        let family = |f: &Option<Box<dyn FamilyState>>| f.as_ref().map(|f| f.deep_clone());
        Ok(match layer {
            LayerCache::Gdn(c) => Self {
                conv: copy(&c.conv)?,
                state: copy(&c.state)?,
                family: family(&c.family).transpose()?,
            },
            LayerCache::Attention(c) => Self {
                conv: None,
                state: None,
                family: family(&c.family).transpose()?,
            },
        })
    }
}

/// Whether `cache` holds a family's own layer state, which a window rewinds by replay.
fn has_family_state(cache: &Cache) -> bool {
    cache.layers.iter().any(|l| match l {
        LayerCache::Gdn(c) => c.family.is_some(),
        LayerCache::Attention(c) => c.family.is_some(),
    })
}

impl Window {
    /// Starts recording: every GDN layer of `cache` keeps its state after each token of the
    /// next forward pass; or, for a cache with a family's own layer state, every layer's
    /// state is copied now, to be replayed from (see the module doc).
    pub fn open(cache: &mut Cache) -> Result<Self> {
        let replay = has_family_state(cache);
        let mut kv_lens = Vec::with_capacity(cache.layers.len());
        let mut opening = Vec::new();
        for layer in &mut cache.layers {
            if replay {
                opening.push(Opening::of(layer)?);
            }
            match layer {
                LayerCache::Gdn(c) => {
                    ensure!(c.steps.is_none(), "a verify window is already open");
                    if !replay {
                        c.steps = Some(GdnSteps::default());
                    }
                    kv_lens.push(None);
                }
                LayerCache::Attention(c) => kv_lens.push(Some(c.len())),
            }
        }
        Ok(Self {
            offset: cache.offset,
            kv_lens,
            opening: replay.then_some(opening),
        })
    }

    /// Whether closing this window on fewer tokens than it saw runs the kept ones again
    /// ([`Window::close_replaying`]).
    pub fn replays(&self) -> bool {
        self.opening.is_some()
    }

    /// Stops recording and keeps the first `kept` tokens of the window (at least one: the
    /// token the step started from is always kept). A window that [`Window::replays`] must be
    /// closed with [`Window::close_replaying`] unless every token is kept.
    pub fn close(self, cache: &mut Cache, kept: usize) -> Result<()> {
        self.close_replaying(cache, kept, |_, _| {
            bail!("this cache holds a family's own layer state: its window is closed by running the kept tokens again")
        })
    }

    /// [`Window::close`], where `replay(cache, kept)` runs the window's first `kept` tokens
    /// again through the model (as the window's pass ran them) when the window rewinds by
    /// replay and a token is rejected; otherwise `replay` is not called.
    pub fn close_replaying(
        self,
        cache: &mut Cache,
        kept: usize,
        replay: impl FnOnce(&mut Cache, usize) -> Result<()>,
    ) -> Result<()> {
        let seen = cache.offset - self.offset;
        ensure!(
            (1..=seen).contains(&kept),
            "keeping {kept} of the {seen} tokens of a verify window"
        );
        if let Some(opening) = self.opening {
            if kept == seen {
                return Ok(());
            }
            ensure!(
                opening.len() == cache.layers.len(),
                "the cache changed its layers inside a verify window"
            );
            for ((layer, was), kv_len) in cache.layers.iter_mut().zip(opening).zip(self.kv_lens) {
                match (layer, kv_len) {
                    (LayerCache::Gdn(c), None) => {
                        // In place where the shapes allow, as below: a captured decode graph
                        // stays valid.
                        let put = |live: &mut Option<Tensor>, was: Option<Tensor>| -> Result<()> {
                            *live = match was {
                                Some(was) => Some(into_place(live.take(), was)?),
                                None => None,
                            };
                            Ok(())
                        };
                        put(&mut c.conv, was.conv)?;
                        put(&mut c.state, was.state)?;
                        c.family = was.family;
                    }
                    (LayerCache::Attention(c), Some(len)) => {
                        c.truncate(len);
                        c.family = was.family;
                    }
                    _ => bail!("the cache changed its layers inside a verify window"),
                }
            }
            cache.offset = self.offset;
            return replay(cache, kept);
        }
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
