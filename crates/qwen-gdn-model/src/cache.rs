//! Per-sequence state carried between forward calls: for each GDN layer the last `K-1`
//! pre-conv rows and the recurrent state, for each attention layer its keys and values.
//! A model family may keep more beside either ([`FamilyState`]: `qwen4_exp`'s per-layer
//! embedding and indexer state, docs/qwen4_exp.md §6); the cache only carries it.

mod family_state;

pub use family_state::{downcast_mut, downcast_ref, FamilyState, FieldReader};

use crate::candle_ops::{write_at, zeros};
use crate::layers::gdn::steps::GdnSteps;
use crate::tensor::{contiguous, own_copy};
use crate::StateDtype;
use anyhow::Result;
use candle_core::Tensor;

#[derive(Debug, Clone, Default)]
pub struct GdnCache {
    /// How the recurrent state is stored; a state held in the other dtype is converted on
    /// the next forward call, never rejected.
    pub state_dtype: StateDtype,
    /// `[B, K-1, conv_dim]`, pre-activation inputs of the depthwise conv.
    pub conv: Option<Tensor>,
    /// `[B, Hv, Dv, Dk]`, updated in place by the recurrence.
    pub state: Option<Tensor>,
    /// What the model family keeps beside the GDN state on this layer, if anything.
    pub family: Option<Box<dyn FamilyState>>,
    /// While a speculative verify window is open: the state after each of its tokens.
    pub steps: Option<GdnSteps>,
}

/// Keys and values of one attention layer, in buffers that grow by [`KV_STEP`] positions at a
/// time (a copy per step instead of per token); positions past `len` are unused.
#[derive(Debug, Clone, Default)]
pub struct KvCache {
    /// `[B, Nkv, capacity, Dh]`, post-RoPE.
    keys: Option<Tensor>,
    values: Option<Tensor>,
    len: usize,
    /// What the model family keeps beside the keys and values on this layer, if anything.
    pub family: Option<Box<dyn FamilyState>>,
}

/// Positions a KV buffer grows by when full.
pub const KV_STEP: usize = 256;

impl KvCache {
    /// Number of cached positions.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Positions the buffers hold before they grow again.
    pub fn capacity(&self) -> usize {
        self.keys.as_ref().map_or(0, |k| k.dim(2).unwrap_or(0))
    }

    /// The cached keys `[B, Nkv, len, Dh]` (a view of the buffer).
    pub fn keys(&self) -> Option<Tensor> {
        self.keys
            .as_ref()
            .map(|k| k.narrow(2, 0, self.len).expect("len ≤ capacity"))
    }

    pub fn values(&self) -> Option<Tensor> {
        self.values
            .as_ref()
            .map(|v| v.narrow(2, 0, self.len).expect("len ≤ capacity"))
    }

    /// Appends `k`, `v` `[B, Nkv, S, Dh]` and returns views of all cached keys and values.
    pub fn append(&mut self, k: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
        let s = k.dim(2)?;
        let (b, h, _, d) = k.dims4()?;
        self.reserve(self.len + s, (b, h, d), k)?;
        let (keys, values) = (
            self.keys.as_ref().expect("reserved"),
            self.values.as_ref().expect("reserved"),
        );
        write_at(keys, &contiguous(k)?, 2, self.len)?;
        write_at(values, &contiguous(v)?, 2, self.len)?;
        self.len += s;
        Ok((self.keys().expect("set"), self.values().expect("set")))
    }

    /// The whole key and value buffers `[B, Nkv, capacity, Dh]`, grown first so that one
    /// more position fits: a fused decode kernel writes position `len` in place, then the
    /// caller calls [`KvCache::advance`]. `like` gives the dtype and device.
    pub fn buffers_for_next(
        &mut self,
        dims: (usize, usize, usize),
        like: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        self.buffers_for(1, dims, like)
    }

    /// [`KvCache::buffers_for_next`] for `n` more positions (a verify pass's rows, written
    /// at `len .. len + n`).
    pub fn buffers_for(
        &mut self,
        n: usize,
        (b, h, d): (usize, usize, usize),
        like: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        self.reserve(self.len + n, (b, h, d), like)?;
        Ok((
            self.keys.clone().expect("reserved"),
            self.values.clone().expect("reserved"),
        ))
    }

    /// The key and value buffers, if allocated.
    pub fn buffers(&self) -> (Option<&Tensor>, Option<&Tensor>) {
        (self.keys.as_ref(), self.values.as_ref())
    }

    /// Sets the number of cached positions (bookkeeping around a replayed CUDA graph, which
    /// writes positions without this struct seeing it).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn set_len(&mut self, len: usize) {
        debug_assert!(len <= self.capacity());
        self.len = len;
    }

    /// Independent copies of the cached keys and values, `[B, Nkv, len, Dh]` each: no
    /// unused capacity and no storage shared with the live buffers (which are written in
    /// place). `None` when nothing is cached.
    pub fn compact_copy(&self) -> Result<Option<(Tensor, Tensor)>> {
        match (self.keys(), self.values()) {
            (Some(k), Some(v)) if self.len > 0 => Ok(Some((own_copy(&k)?, own_copy(&v)?))),
            _ => Ok(None),
        }
    }

    /// A cache holding `keys` and `values` `[B, Nkv, len, Dh]` (copied into fresh buffers
    /// with the capacity growing by [`KV_STEP`] would have given them), or an empty one.
    pub fn from_compact(kv: Option<(&Tensor, &Tensor)>) -> Result<Self> {
        let Some((k, v)) = kv else {
            return Ok(Self::default());
        };
        // (`family` is the caller's to set: a snapshot keeps it beside the keys.)
        anyhow::ensure!(
            k.dims() == v.dims() && k.rank() == 4,
            "keys {:?} and values {:?} are not matching [B, Nkv, len, Dh] tensors",
            k.dims(),
            v.dims()
        );
        let (b, h, len, d) = k.dims4()?;
        let mut cache = Self::default();
        if len == 0 {
            return Ok(cache);
        }
        cache.reserve(len, (b, h, d), k)?;
        let (keys, values) = (
            cache.keys.as_ref().expect("reserved"),
            cache.values.as_ref().expect("reserved"),
        );
        write_at(keys, &contiguous(k)?, 2, 0)?;
        write_at(values, &contiguous(v)?, 2, 0)?;
        cache.len = len;
        Ok(cache)
    }

    /// Forgets the positions from `len` on (a rejected speculative draft): they stay in the
    /// buffers, unused, and the next append writes over them.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Counts `n` positions written in place into the buffers.
    pub fn advance(&mut self, n: usize) {
        debug_assert!(self.len + n <= self.capacity());
        self.len += n;
    }

    /// Grows the buffers (in steps of [`KV_STEP`] positions) until `needed` positions fit.
    fn reserve(
        &mut self,
        needed: usize,
        (b, h, d): (usize, usize, usize),
        like: &Tensor,
    ) -> Result<()> {
        if needed <= self.capacity() {
            return Ok(());
        }
        let capacity = needed.div_ceil(KV_STEP) * KV_STEP;
        let grow = |old: &Option<Tensor>| -> Result<Tensor> {
            let buf = zeros((b, h, capacity, d), like.dtype(), like.device())?;
            if let Some(old) = old {
                // The whole old buffer, unused tail included: a narrow to `len` positions is
                // not contiguous (heads are a capacity apart) and `slice_set` takes
                // contiguous sources only.
                write_at(&buf, old, 2, 0)?;
            }
            Ok(buf)
        };
        self.keys = Some(grow(&self.keys)?);
        self.values = Some(grow(&self.values)?);
        Ok(())
    }
}

#[derive(Debug, Clone)]
pub enum LayerCache {
    Gdn(GdnCache),
    Attention(KvCache),
}

/// Decoding state of one sequence.
#[derive(Debug, Clone)]
pub struct Cache {
    /// Number of tokens already processed (the RoPE position of the next one).
    pub offset: usize,
    pub layers: Vec<LayerCache>,
}

impl Cache {
    /// An empty cache with these layers.
    pub fn new(layers: Vec<LayerCache>) -> Self {
        Self { offset: 0, layers }
    }

    /// Whether a verify window is open over this cache (its GDN layers record every token's
    /// state: `crate::speculative::Window`).
    pub fn in_window(&self) -> bool {
        (self.layers.iter()).any(|l| matches!(l, LayerCache::Gdn(c) if c.steps.is_some()))
    }
}

impl Cache {
    /// A copy that shares no storage with `self`: recurrent states and KV buffers are
    /// updated in place, so a plain `clone` would advance both caches together.
    pub fn deep_clone(&self) -> anyhow::Result<Self> {
        let copy = |t: &Option<Tensor>| t.as_ref().map(Tensor::copy).transpose();
        let family = |f: &Option<Box<dyn FamilyState>>| f.as_ref().map(|f| f.deep_clone());
        let layers = self
            .layers
            .iter()
            .map(|l| -> anyhow::Result<LayerCache> {
                Ok(match l {
                    LayerCache::Gdn(c) => LayerCache::Gdn(GdnCache {
                        state_dtype: c.state_dtype,
                        conv: copy(&c.conv)?,
                        state: copy(&c.state)?,
                        family: family(&c.family).transpose()?,
                        steps: None,
                    }),
                    LayerCache::Attention(c) => LayerCache::Attention(KvCache {
                        keys: copy(&c.keys)?,
                        values: copy(&c.values)?,
                        len: c.len,
                        family: family(&c.family).transpose()?,
                    }),
                })
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(Self {
            offset: self.offset,
            layers,
        })
    }

    /// Switches the storage dtype of every GDN recurrent state from the next forward on.
    pub fn set_gdn_state_dtype(&mut self, dtype: StateDtype) {
        for layer in &mut self.layers {
            if let LayerCache::Gdn(c) = layer {
                c.state_dtype = dtype;
            }
        }
    }
}
