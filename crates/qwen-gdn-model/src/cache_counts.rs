//! The host-side counts of a cache that a decode step advances (its offset and every KV
//! length): saved before a step and put back, so that a CUDA graph's capture records the
//! step from the counts the eager run of it started from (`crate::cuda_graph`). Not CUDA
//! code: a family's CPU tests check the save and restore too.

use crate::cache::{Cache, LayerCache};

/// The host-side counts of a cache that a step advances: its offset and every KV length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bookkeeping {
    offset: usize,
    kv_lens: Vec<usize>,
}

impl Bookkeeping {
    pub fn of(cache: &Cache) -> Self {
        let kv_lens = cache
            .layers
            .iter()
            .map(|l| match l {
                LayerCache::Attention(c) => c.len(),
                LayerCache::Gdn(_) => 0,
            })
            .collect();
        Self {
            offset: cache.offset,
            kv_lens,
        }
    }

    /// Puts these counts back into `cache` (its tensors stay).
    pub fn restore(&self, cache: &mut Cache) {
        cache.offset = self.offset;
        for (l, &len) in cache.layers.iter_mut().zip(&self.kv_lens) {
            if let LayerCache::Attention(c) = l {
                c.set_len(len);
            }
        }
    }
}
