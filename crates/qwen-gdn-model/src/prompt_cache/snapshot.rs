//! A snapshot: the whole per-sequence [`Cache`] at one token position, held in tensors of its
//! own. The GDN recurrent state cannot be rewound the way a KV cache can be truncated, so a
//! hybrid model can only resume from positions where its whole state was copied.

use crate::cache::{Cache, GdnCache, KvCache, LayerCache};
use crate::families::qwen4_exp::ple::PleState;
use crate::families::qwen4_exp::qsa_indexer::IndexerCache;
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
        /// `qwen4_exp` per-layer embedding: n-gram context and conv window.
        ple: Option<PleState>,
    },
    /// Keys and values `[B, Nkv, len, Dh]`: only the cached positions, no spare capacity.
    Attention {
        kv: Option<(Tensor, Tensor)>,
        /// `qwen4_exp` QSA layers: the indexer's block keys at the same position.
        indexer: Option<IndexerCache>,
    },
}

/// The state of a cache that has processed `offset` tokens.
#[derive(Debug)]
pub struct Snapshot {
    pub offset: usize,
    pub layers: Vec<LayerSnapshot>,
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
                        ple: c.ple.as_ref().map(PleState::deep_clone).transpose()?,
                    },
                    LayerCache::Attention(c) => LayerSnapshot::Attention {
                        kv: c.compact_copy()?,
                        indexer: c.indexer.clone(),
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
                        ple,
                    } => LayerCache::Gdn(GdnCache {
                        state_dtype: *state_dtype,
                        conv: copy(conv)?,
                        state: copy(state)?,
                        ple: ple.as_ref().map(PleState::deep_clone).transpose()?,
                    }),
                    LayerSnapshot::Attention { kv, indexer } => {
                        let mut c = KvCache::from_compact(kv.as_ref().map(|(k, v)| (k, v)))?;
                        c.indexer = indexer.clone();
                        LayerCache::Attention(c)
                    }
                })
            })
            .collect::<Result<_>>()?;
        let mut cache = Cache::new(layers);
        cache.offset = self.offset;
        Ok(cache)
    }

    /// Bytes the snapshot takes: its tensors, and the indexer's host vectors and n-gram ids.
    pub fn bytes(&self) -> u64 {
        let size = |t: &Tensor| (t.elem_count() * t.dtype().size_in_bytes()) as u64;
        let host: u64 = self
            .layers
            .iter()
            .map(|layer| match layer {
                LayerSnapshot::Gdn { ple, .. } => {
                    ple.as_ref().map_or(0, |p| 4 * p.context.len() as u64)
                }
                LayerSnapshot::Attention { indexer, .. } => {
                    indexer.as_ref().map_or(0, IndexerCache::bytes)
                }
            })
            .sum();
        self.tensors().map(size).sum::<u64>() + host
    }

    /// Every tensor held, in layer order (the PLE conv window included).
    pub fn tensors(&self) -> impl Iterator<Item = &Tensor> {
        self.layers.iter().flat_map(|layer| -> Vec<&Tensor> {
            match layer {
                LayerSnapshot::Gdn {
                    conv, state, ple, ..
                } => conv
                    .iter()
                    .chain(state)
                    .chain(ple.as_ref().map(|p| &p.window))
                    .collect(),
                LayerSnapshot::Attention { kv, .. } => {
                    kv.iter().flat_map(|(k, v)| [k, v]).collect()
                }
            }
        })
    }

    /// What a capture of `cache` would take, without copying anything (so that a snapshot
    /// over the budget is never made).
    pub fn bytes_of(cache: &Cache) -> u64 {
        let size = |t: &Tensor| (t.elem_count() * t.dtype().size_in_bytes()) as u64;
        cache
            .layers
            .iter()
            .map(|layer| match layer {
                LayerCache::Gdn(c) => {
                    c.conv.iter().chain(&c.state).map(size).sum::<u64>()
                        + c.ple.as_ref().map_or(0, PleState::bytes)
                }
                LayerCache::Attention(c) => {
                    c.keys().iter().chain(&c.values()).map(size).sum::<u64>()
                        + c.indexer.as_ref().map_or(0, IndexerCache::bytes)
                }
            })
            .sum()
    }
}
