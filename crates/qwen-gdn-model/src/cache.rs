//! Per-sequence state carried between forward calls: for each GDN layer the last `K-1`
//! pre-conv rows and the recurrent state, for each attention layer its keys and values.

use crate::StateDtype;
use anyhow::Result;
use candle_core::Tensor;
use gdn_ops::launches::record;

#[derive(Debug, Clone, Default)]
pub struct GdnCache {
    /// How the recurrent state is stored; a state held in the other dtype is converted on
    /// the next forward call, never rejected.
    pub state_dtype: StateDtype,
    /// `[B, K-1, conv_dim]`, pre-activation inputs of the depthwise conv.
    pub conv: Option<Tensor>,
    /// `[B, Hv, Dv, Dk]`, updated in place by the recurrence.
    pub state: Option<Tensor>,
}

/// Keys and values of one attention layer, in buffers that grow by [`KV_STEP`] positions at a
/// time (a copy per step instead of per token); positions past `len` are unused.
#[derive(Debug, Clone, Default)]
pub struct KvCache {
    /// `[B, Nkv, capacity, Dh]`, post-RoPE.
    keys: Option<Tensor>,
    values: Option<Tensor>,
    len: usize,
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
        let needed = self.len + s;
        if needed > self.capacity() {
            let capacity = needed.div_ceil(KV_STEP) * KV_STEP;
            let grow = |old: &Option<Tensor>, like: &Tensor| -> Result<Tensor> {
                let (b, h, _, d) = like.dims4()?;
                let buf = Tensor::zeros((b, h, capacity, d), like.dtype(), like.device())?;
                record(1);
                if let Some(old) = old {
                    // The whole old buffer, unused tail included: a narrow to `len` positions
                    // is not contiguous (heads are a capacity apart) and `slice_set` takes
                    // contiguous sources only; copying it first would cost a second copy.
                    buf.slice_set(old, 2, 0)?;
                    record(1);
                }
                Ok(buf)
            };
            self.keys = Some(grow(&self.keys, k)?);
            self.values = Some(grow(&self.values, v)?);
        }
        let (keys, values) = (
            self.keys.as_ref().expect("grown"),
            self.values.as_ref().expect("grown"),
        );
        keys.slice_set(&k.contiguous()?, 2, self.len)?;
        values.slice_set(&v.contiguous()?, 2, self.len)?;
        record(2);
        self.len = needed;
        Ok((self.keys().expect("set"), self.values().expect("set")))
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
    /// A copy that shares no storage with `self`: recurrent states and KV buffers are
    /// updated in place, so a plain `clone` would advance both caches together.
    pub fn deep_clone(&self) -> anyhow::Result<Self> {
        let copy = |t: &Option<Tensor>| t.as_ref().map(Tensor::copy).transpose();
        let layers = self
            .layers
            .iter()
            .map(|l| -> anyhow::Result<LayerCache> {
                Ok(match l {
                    LayerCache::Gdn(c) => LayerCache::Gdn(GdnCache {
                        state_dtype: c.state_dtype,
                        conv: copy(&c.conv)?,
                        state: copy(&c.state)?,
                    }),
                    LayerCache::Attention(c) => LayerCache::Attention(KvCache {
                        keys: copy(&c.keys)?,
                        values: copy(&c.values)?,
                        len: c.len,
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
