//! What a `qwen4_exp` layer keeps in the cache beside the mixer's state (docs/qwen4_exp.md
//! §6), and its fields of a prompt-cache file:
//!
//! - a GDN layer with a per-layer embedding: the n-gram context and the PLE conv window
//!   ([`PleState`]). The file stores the window as `ple_window` (f32 `[(K−1)·N, S·H]`); the
//!   context is not stored: it is the last `N − 1` of the file's tokens (eos before the
//!   first), so it is rebuilt from them.
//! - a QSA layer: the indexer's pooled block keys and the raw keys of the incomplete block
//!   ([`QsaState`]). The file stores them as `index_keys` (f32 `[n div c + n mod c, Di]`:
//!   the block keys, then the tail keys).
//!
//! The cache and the prompt cache see these only as [`FamilyState`]s; this family reaches its
//! own through [`ple`], [`indexer`] and their `_mut` forms.

use super::ple::PleState;
use super::qsa_indexer::IndexerCache;
use crate::cache::{downcast_mut, downcast_ref, FamilyState, FieldReader, GdnCache, KvCache};
use anyhow::{ensure, Result};
use candle_core::{DType, Device, Tensor};

/// The file field of the PLE conv window.
const PLE_WINDOW: &str = "ple_window";
/// The file field of the indexer's keys.
const INDEX_KEYS: &str = "index_keys";

impl FamilyState for PleState {
    fn clone_box(&self) -> Box<dyn FamilyState> {
        Box::new(self.clone())
    }

    fn deep_clone(&self) -> Result<Box<dyn FamilyState>> {
        Ok(Box::new(PleState::deep_clone(self)?))
    }

    fn bytes(&self) -> u64 {
        PleState::bytes(self)
    }

    fn snapshot_fields(&self) -> Result<Vec<(&'static str, Tensor)>> {
        Ok(vec![(PLE_WINDOW, self.window.clone())])
    }

    fn load_snapshot_fields(
        &self,
        tokens: &[u32],
        read: &mut FieldReader,
    ) -> Result<Box<dyn FamilyState>> {
        Ok(Box::new(PleState {
            context: context_after(&self.context, tokens),
            window: read(PLE_WINDOW, self.window.dtype(), self.window.dims())?,
        }))
    }

    fn max_field_bytes(&self, _tokens: usize) -> u64 {
        (self.window.elem_count() * self.window.dtype().size_in_bytes()) as u64
    }
}

/// The n-gram context after `tokens` from a fresh `initial` one: its last `initial.len()`
/// ids (the PLE keeps the last `N − 1` tokens, eos before the first).
fn context_after(initial: &[u32], tokens: &[u32]) -> Vec<u32> {
    let all: Vec<u32> = initial.iter().chain(tokens).copied().collect();
    all[all.len() - initial.len()..].to_vec()
}

/// A QSA layer's indexer state, with the sizes its file field needs.
#[derive(Debug, Clone)]
pub struct QsaState {
    pub keys: IndexerCache,
    /// `Di`: the width of one index key.
    pub key_dim: usize,
    /// `c`: tokens per pooled block.
    pub compress_ratio: usize,
}

impl QsaState {
    /// The state of a new sequence.
    pub fn new(key_dim: usize, compress_ratio: usize) -> Self {
        Self {
            keys: IndexerCache::default(),
            key_dim,
            compress_ratio,
        }
    }

    /// The keys as one `[blocks + tail, Di]` f32 tensor: the pooled block keys, then the raw
    /// keys of the incomplete block (read back first where a decode step left them on the
    /// device).
    fn keys_tensor(&self) -> Result<Tensor> {
        let mut ix = self.keys.clone();
        ix.to_host()?;
        let rows = ix.blocks.len() + ix.tail.len();
        ensure!(
            ix.blocks
                .iter()
                .chain(&ix.tail)
                .all(|k| k.len() == self.key_dim),
            "QSA indexer keys of another width than {}",
            self.key_dim
        );
        let flat: Vec<f32> = ix
            .blocks
            .iter()
            .chain(&ix.tail)
            .flatten()
            .copied()
            .collect();
        Ok(Tensor::from_vec(flat, (rows, self.key_dim), &Device::Cpu)?)
    }
}

impl FamilyState for QsaState {
    fn clone_box(&self) -> Box<dyn FamilyState> {
        Box::new(self.clone())
    }

    /// The host vectors' clone is already a copy; the device buffer is written in place, so
    /// it is copied.
    fn deep_clone(&self) -> Result<Box<dyn FamilyState>> {
        let mut copy = self.clone();
        if let Some(keys) = &self.keys.device {
            copy.keys.device = Some(keys.deep_clone()?);
        }
        Ok(Box::new(copy))
    }

    fn bytes(&self) -> u64 {
        self.keys.bytes()
    }

    fn snapshot_fields(&self) -> Result<Vec<(&'static str, Tensor)>> {
        Ok(vec![(INDEX_KEYS, self.keys_tensor()?)])
    }

    fn load_snapshot_fields(
        &self,
        tokens: &[u32],
        read: &mut FieldReader,
    ) -> Result<Box<dyn FamilyState>> {
        let (n, c) = (tokens.len(), self.compress_ratio);
        ensure!(c > 0, "QSA indexer with a compress ratio of 0");
        let (blocks, tail) = (n / c, n % c);
        let keys = read(INDEX_KEYS, DType::F32, &[blocks + tail, self.key_dim])?
            .to_device(&Device::Cpu)?
            .to_vec2::<f32>()?;
        let (blocks, tail) = keys.split_at(blocks);
        Ok(Box::new(QsaState {
            keys: IndexerCache {
                blocks: blocks.to_vec(),
                tail: tail.to_vec(),
                len: n,
                device: None,
            },
            ..self.clone()
        }))
    }

    fn max_field_bytes(&self, tokens: usize) -> u64 {
        let c = self.compress_ratio.max(1);
        (4 * self.key_dim * (tokens / c + c)) as u64
    }
}

/// The PLE state of a GDN layer's cache (`None` on a layer without a per-layer embedding, or
/// in another family's cache).
pub fn ple(cache: &GdnCache) -> Option<&PleState> {
    downcast_ref(cache.family.as_deref()?)
}

pub fn ple_mut(cache: &mut GdnCache) -> Option<&mut PleState> {
    downcast_mut(cache.family.as_deref_mut()?)
}

/// The QSA indexer's keys in an attention layer's cache (`None` in another family's cache).
pub fn indexer(cache: &KvCache) -> Option<&IndexerCache> {
    downcast_ref::<QsaState>(cache.family.as_deref()?).map(|s| &s.keys)
}

pub fn indexer_mut(cache: &mut KvCache) -> Option<&mut IndexerCache> {
    downcast_mut::<QsaState>(cache.family.as_deref_mut()?).map(|s| &mut s.keys)
}
