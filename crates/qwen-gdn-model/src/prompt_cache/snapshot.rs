//! A snapshot: the whole per-sequence [`Cache`] at one token position, held in tensors of its
//! own. The GDN recurrent state cannot be rewound the way a KV cache can be truncated, so a
//! hybrid model can only resume from positions where its whole state was copied.

use crate::cache::{Cache, FamilyState, GdnCache, KvCache, LayerCache};
use crate::tensor::own_copy;
use crate::StateDtype;
use anyhow::Result;
use candle_core::Tensor;

/// One layer's part of a [`Snapshot`].
#[derive(Debug)]
pub enum LayerSnapshot {
    Gdn {
        state_dtype: StateDtype,
        /// `[B, K-1, conv_dim]`.
        conv: Option<Tensor>,
        /// `[B, Hv, Dv, Dk]`.
        state: Option<Tensor>,
        /// What the model family keeps beside it (at the same position).
        family: Option<Box<dyn FamilyState>>,
    },
    /// Keys and values `[B, Nkv, len, Dh]`: only the cached positions, no spare capacity.
    Attention {
        kv: Option<(Tensor, Tensor)>,
        /// What the model family keeps beside them (at the same position).
        family: Option<Box<dyn FamilyState>>,
    },
}

/// The state of a cache that has processed `offset` tokens.
#[derive(Debug)]
pub struct Snapshot {
    pub offset: usize,
    pub layers: Vec<LayerSnapshot>,
}

/// A copy of a family's state sharing no storage with it.
fn own_family(f: &Option<Box<dyn FamilyState>>) -> Result<Option<Box<dyn FamilyState>>> {
    f.as_ref().map(|f| f.deep_clone()).transpose()
}

/// Bytes of a family's state, if any.
fn family_bytes(f: &Option<Box<dyn FamilyState>>) -> u64 {
    f.as_ref().map_or(0, |f| f.bytes())
}

fn tensor_bytes(t: &Tensor) -> u64 {
    (t.elem_count() * t.dtype().size_in_bytes()) as u64
}

impl Snapshot {
    /// Copies `cache` (the live cache keeps being updated in place; the copy never is).
    pub fn capture(cache: &Cache) -> Result<Self> {
        let copy = |t: &Option<Tensor>| t.as_ref().map(own_copy).transpose();
        let layers = cache
            .layers
            .iter()
            .map(|layer| -> Result<LayerSnapshot> {
                Ok(match layer {
                    LayerCache::Gdn(c) => LayerSnapshot::Gdn {
                        state_dtype: c.state_dtype,
                        conv: copy(&c.conv)?,
                        state: copy(&c.state)?,
                        family: own_family(&c.family)?,
                    },
                    LayerCache::Attention(c) => LayerSnapshot::Attention {
                        kv: c.compact_copy()?,
                        family: own_family(&c.family)?,
                    },
                })
            })
            .collect::<Result<_>>()?;
        Ok(Self {
            offset: cache.offset,
            layers,
        })
    }

    /// A live cache with this state, in tensors of its own: running it never changes the
    /// snapshot, and two restores never share storage.
    pub fn restore(&self) -> Result<Cache> {
        let copy = |t: &Option<Tensor>| t.as_ref().map(own_copy).transpose();
        let layers = self
            .layers
            .iter()
            .map(|layer| -> Result<LayerCache> {
                Ok(match layer {
                    LayerSnapshot::Gdn {
                        state_dtype,
                        conv,
                        state,
                        family,
                    } => LayerCache::Gdn(GdnCache {
                        state_dtype: *state_dtype,
                        conv: copy(conv)?,
                        state: copy(state)?,
                        family: own_family(family)?,
                        steps: None,
                    }),
                    LayerSnapshot::Attention { kv, family } => {
                        let mut c = KvCache::from_compact(kv.as_ref().map(|(k, v)| (k, v)))?;
                        c.family = own_family(family)?;
                        LayerCache::Attention(c)
                    }
                })
            })
            .collect::<Result<_>>()?;
        let mut cache = Cache::new(layers);
        cache.offset = self.offset;
        Ok(cache)
    }

    /// Bytes the snapshot takes: its tensors and its families' states.
    pub fn bytes(&self) -> u64 {
        self.layers
            .iter()
            .map(|layer| match layer {
                LayerSnapshot::Gdn {
                    conv,
                    state,
                    family,
                    ..
                } => conv.iter().chain(state).map(tensor_bytes).sum::<u64>() + family_bytes(family),
                LayerSnapshot::Attention { kv, family } => {
                    kv.iter()
                        .flat_map(|(k, v)| [k, v])
                        .map(tensor_bytes)
                        .sum::<u64>()
                        + family_bytes(family)
                }
            })
            .sum()
    }

    /// What a capture of `cache` would take, without copying anything (so that a snapshot
    /// over the budget is never made).
    pub fn bytes_of(cache: &Cache) -> u64 {
        cache
            .layers
            .iter()
            .map(|layer| match layer {
                LayerCache::Gdn(c) => {
                    c.conv.iter().chain(&c.state).map(tensor_bytes).sum::<u64>()
                        + family_bytes(&c.family)
                }
                LayerCache::Attention(c) => {
                    c.keys()
                        .iter()
                        .chain(&c.values())
                        .map(tensor_bytes)
                        .sum::<u64>()
                        + family_bytes(&c.family)
                }
            })
            .sum()
    }
}
