//! A prompt cache for hybrid models: [`Snapshot`]s of the whole cache at token positions
//! (message boundaries, prompt ends, every N tokens of a long prefill), found by the longest
//! token prefix that ends at one, evicted least recently used first under a byte budget.
//!
//! A GDN layer's recurrent state mixes every token it has seen, so unlike a KV cache it cannot
//! be cut back to a shorter prefix: a request can resume only from a position where the whole
//! state was copied.

mod across_ranks;
mod file;
mod identity;
mod index;
mod prefill;
mod snapshot;

pub use across_ranks::lookup_on_every_rank;
pub use file::{
    load_cache, load_snapshot, read_snapshot_header, save_snapshot, SnapshotHeader,
    SNAPSHOT_FORMAT, SNAPSHOT_FORMAT_VERSION,
};
pub use identity::ModelIdentity;
pub use prefill::{prefill_with_snapshots, ChunkedPrefill, PrefillPiece};
pub use snapshot::{LayerSnapshot, Snapshot};

use crate::Cache;
use anyhow::{ensure, Result};
use index::PrefixIndex;
use std::collections::HashMap;

/// Snapshots keyed by the tokens that produced them.
pub struct PromptCache {
    budget: u64,
    bytes: u64,
    entries: HashMap<u64, Entry>,
    index: PrefixIndex,
    next_id: u64,
    /// Advances on every insert and hit; an entry's `last_used` orders eviction.
    clock: u64,
}

struct Entry {
    tokens: Vec<u32>,
    snapshot: Snapshot,
    bytes: u64,
    last_used: u64,
}

impl PromptCache {
    /// An empty cache that keeps at most `budget_bytes` of snapshots (tensors and tokens).
    pub fn new(budget_bytes: u64) -> Self {
        Self {
            budget: budget_bytes,
            bytes: 0,
            entries: HashMap::new(),
            index: PrefixIndex::default(),
            next_id: 0,
            clock: 0,
        }
    }

    /// The longest cached prefix of `tokens` that ends at a snapshot and leaves at least one
    /// token to run (its logits give the next token): its length and a cache restored from
    /// it, sharing no storage with the snapshot.
    pub fn lookup(&mut self, tokens: &[u32]) -> Result<Option<(usize, Cache)>> {
        let Some(n) = tokens.len().checked_sub(1) else {
            return Ok(None);
        };
        let entries = &self.entries;
        let found = self
            .index
            .longest_prefix(&tokens[..n], |id| entries[&id].tokens.as_slice());
        let Some(id) = found else {
            return Ok(None);
        };
        self.clock += 1;
        let entry = self.entries.get_mut(&id).expect("indexed entries exist");
        entry.last_used = self.clock;
        Ok(Some((entry.tokens.len(), entry.snapshot.restore()?)))
    }

    /// Keeps a snapshot of `cache`, which has processed exactly `tokens`. Least recently used
    /// snapshots are dropped to make room; one larger than the whole budget is not kept.
    pub fn insert(&mut self, tokens: &[u32], cache: &Cache) -> Result<()> {
        ensure!(
            cache.offset == tokens.len(),
            "prompt cache: the cache has processed {} tokens, not the {} given",
            cache.offset,
            tokens.len()
        );
        if tokens.is_empty() {
            return Ok(());
        }
        self.clock += 1;
        let entries = &self.entries;
        if let Some(id) = self
            .index
            .exact(tokens, |id| entries[&id].tokens.as_slice())
        {
            // The same tokens give the same state: refresh, don't copy again.
            self.entries.get_mut(&id).expect("indexed").last_used = self.clock;
            return Ok(());
        }
        let bytes = Snapshot::bytes_of(cache) + token_bytes(tokens);
        if bytes > self.budget {
            return Ok(());
        }
        // Evict before copying, so the copy never needs more than the budget.
        self.evict_to(self.budget - bytes);
        let snapshot = Snapshot::capture(cache)?;
        self.insert_snapshot(tokens.to_vec(), snapshot, bytes);
        Ok(())
    }

    /// Keeps an already built snapshot (e.g. loaded from a file) for `tokens`; `false` when
    /// it is larger than the whole budget (and so not kept).
    pub fn insert_owned(&mut self, tokens: Vec<u32>, snapshot: Snapshot) -> Result<bool> {
        ensure!(
            snapshot.offset == tokens.len(),
            "prompt cache: the snapshot has processed {} tokens, not the {} given",
            snapshot.offset,
            tokens.len()
        );
        self.clock += 1;
        let entries = &self.entries;
        if let Some(id) = self
            .index
            .exact(&tokens, |id| entries[&id].tokens.as_slice())
        {
            self.remove(id);
        }
        let bytes = snapshot.bytes() + token_bytes(&tokens);
        if tokens.is_empty() || bytes > self.budget {
            return Ok(false);
        }
        self.evict_to(self.budget - bytes);
        self.insert_snapshot(tokens, snapshot, bytes);
        Ok(true)
    }

    fn insert_snapshot(&mut self, tokens: Vec<u32>, snapshot: Snapshot, bytes: u64) {
        let id = self.next_id;
        self.next_id += 1;
        self.index.add(id, &tokens);
        self.bytes += bytes;
        self.entries.insert(
            id,
            Entry {
                tokens,
                snapshot,
                bytes,
                last_used: self.clock,
            },
        );
    }

    /// Drops least recently used snapshots until at most `target` bytes are held.
    fn evict_to(&mut self, target: u64) {
        while self.bytes > target {
            let oldest = self
                .entries
                .iter()
                .min_by_key(|(_, e)| e.last_used)
                .map(|(&id, _)| id);
            match oldest {
                Some(id) => self.remove(id),
                None => break,
            }
        }
    }

    fn remove(&mut self, id: u64) {
        if let Some(entry) = self.entries.remove(&id) {
            self.index.remove(id, &entry.tokens);
            self.bytes -= entry.bytes;
        }
    }

    /// Drops every snapshot.
    pub fn clear(&mut self) {
        self.entries.clear();
        self.index = PrefixIndex::default();
        self.bytes = 0;
    }

    /// Bytes held (snapshot tensors and their tokens).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// Number of snapshots held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The token lengths of the snapshots held, shortest first (for tests and stats).
    pub fn snapshot_lengths(&self) -> Vec<usize> {
        let mut lengths: Vec<usize> = self.entries.values().map(|e| e.tokens.len()).collect();
        lengths.sort_unstable();
        lengths
    }
}

fn token_bytes(tokens: &[u32]) -> u64 {
    std::mem::size_of_val(tokens) as u64
}
