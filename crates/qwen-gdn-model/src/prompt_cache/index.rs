//! Finds which stored token sequences are prefixes of a query in one pass over the query:
//! every stored sequence is keyed by its length and a rolling hash of its tokens, and the
//! query's prefix hashes are computed incrementally, so a lookup costs O(query length) however
//! many snapshots share a prefix (plus one comparison to confirm the hit).

use std::collections::HashMap;

#[derive(Default)]
pub struct PrefixIndex {
    /// (length, hash of the tokens) → ids of the sequences with them.
    by_key: HashMap<(usize, u64), Vec<u64>>,
    /// Length of the longest stored sequence (no query prefix past it can match).
    longest: usize,
}

/// Polynomial rolling hash; the +1 keeps token 0 from hashing like nothing.
fn step(hash: u64, token: u32) -> u64 {
    hash.wrapping_mul(0x100_0000_01b3)
        .wrapping_add(u64::from(token) + 1)
}

fn hash(tokens: &[u32]) -> u64 {
    tokens.iter().fold(0, |h, &t| step(h, t))
}

impl PrefixIndex {
    pub fn add(&mut self, id: u64, tokens: &[u32]) {
        self.by_key
            .entry((tokens.len(), hash(tokens)))
            .or_default()
            .push(id);
        self.longest = self.longest.max(tokens.len());
    }

    pub fn remove(&mut self, id: u64, tokens: &[u32]) {
        let key = (tokens.len(), hash(tokens));
        if let Some(ids) = self.by_key.get_mut(&key) {
            ids.retain(|&i| i != id);
            if ids.is_empty() {
                self.by_key.remove(&key);
            }
        }
        if self.by_key.is_empty() {
            self.longest = 0;
        }
    }

    /// The id of the sequence equal to `tokens`; `tokens_of` gives a stored id's tokens.
    pub fn exact<'a>(&self, tokens: &[u32], tokens_of: impl Fn(u64) -> &'a [u32]) -> Option<u64> {
        self.by_key
            .get(&(tokens.len(), hash(tokens)))?
            .iter()
            .copied()
            .find(|&id| tokens_of(id) == tokens)
    }

    /// The id of the longest stored sequence that is a prefix of `query` (or all of it).
    pub fn longest_prefix<'a>(
        &self,
        query: &[u32],
        tokens_of: impl Fn(u64) -> &'a [u32],
    ) -> Option<u64> {
        let n = query.len().min(self.longest);
        let mut hashes = Vec::with_capacity(n + 1);
        hashes.push(0u64);
        for &t in &query[..n] {
            hashes.push(step(*hashes.last().expect("non-empty"), t));
        }
        (1..=n).rev().find_map(|len| {
            self.by_key
                .get(&(len, hashes[len]))?
                .iter()
                .copied()
                .find(|&id| tokens_of(id) == &query[..len])
        })
    }
}
