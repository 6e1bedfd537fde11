//! The prompt cache over ranks (issue 31): every rank of a plan keeps its own [`PromptCache`]
//! of its own shard of the state (a pipeline stage its layers' caches, an expert or tensor
//! rank its heads' GDN states and KV), filled by the same inserts in the same order. A lookup
//! must then give the same answer everywhere, or the ranks would resume from different
//! positions and wait for each other forever: [`lookup_on_every_rank`] gathers each rank's
//! answer and resumes only when all hit at the same length; otherwise every rank misses (and
//! prefills cold, which gives the same logits, only slower). Ranks can disagree although the
//! inserts were the same because each rank's snapshots have their own size (a stage with
//! more layers, a rank with more heads), so the byte budget evicts at different times.

use super::PromptCache;
use crate::Cache;
use anyhow::{ensure, Result};
use qwen_gdn_collective::{fnv1a, Collective};

/// [`PromptCache::lookup`] made by every rank of `world` with the same `tokens`: a cache
/// restored from this rank's shard at the prefix length every rank hit at, or `None` on every
/// rank when any rank missed or hit at another length. Refused on every rank, naming one, when
/// the ranks looked up different tokens (their generations have diverged).
pub fn lookup_on_every_rank(
    cache: &mut PromptCache,
    world: &dyn Collective,
    tokens: &[u32],
) -> Result<Option<(usize, Cache)>> {
    let key = tokens_hash(tokens);
    let keys = world.all_gather_u64(key)?;
    let other = keys.iter().position(|&k| k != key);
    ensure!(
        other.is_none(),
        "prompt cache: rank {} looked up other tokens than rank {} ({} tokens here)",
        other.unwrap_or(0),
        world.rank(),
        tokens.len()
    );
    let found = cache.lookup(tokens)?;
    let length = found.as_ref().map_or(0, |(n, _)| *n as u64);
    let lengths = world.all_gather_u64(length)?;
    Ok(found.filter(|_| length > 0 && lengths.iter().all(|&n| n == length)))
}

/// FNV-1a over the token ids (the ranks compare keys, not the tokens themselves).
fn tokens_hash(tokens: &[u32]) -> u64 {
    fnv1a(tokens.iter().flat_map(|t| t.to_le_bytes())) ^ tokens.len() as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    /// Rank 0 of 2 whose peer answers each gather with the next of `peer` (this rank's own
    /// value otherwise), so that one process plays a rank that agrees or not.
    struct Peer {
        peer: RefCell<Vec<Option<u64>>>,
    }

    impl Collective for Peer {
        fn rank(&self) -> usize {
            0
        }
        fn size(&self) -> usize {
            2
        }
        fn send(&self, _: usize, _: &[f32]) -> Result<()> {
            unreachable!()
        }
        fn receive(&self, _: usize, _: &mut [f32]) -> Result<()> {
            unreachable!()
        }
        fn all_reduce_sum(&self, _: &mut [f32]) -> Result<()> {
            unreachable!()
        }
        fn all_gather_u64(&self, value: u64) -> Result<Vec<u64>> {
            let peer = self.peer.borrow_mut().remove(0).unwrap_or(value);
            Ok(vec![value, peer])
        }
    }

    /// A cache holding `[1, 2, 3]`'s (empty) state.
    fn cache_with_prefix() -> PromptCache {
        let mut pc = PromptCache::new(1 << 20);
        let mut cache = Cache::new(vec![]);
        cache.offset = 3;
        pc.insert(&[1, 2, 3], &cache).unwrap();
        pc
    }

    fn lookup(peer: Vec<Option<u64>>) -> Result<Option<usize>> {
        let world = Peer {
            peer: RefCell::new(peer),
        };
        let found = lookup_on_every_rank(&mut cache_with_prefix(), &world, &[1, 2, 3, 4])?;
        Ok(found.map(|(n, _)| n))
    }

    #[test]
    fn resumes_only_where_every_rank_hit_at_the_same_length() {
        // The peer has the same tokens and hit at 3: both resume there.
        assert_eq!(lookup(vec![None, Some(3)]).unwrap(), Some(3));
        // The peer missed, or hit at another length: both miss.
        assert_eq!(lookup(vec![None, Some(0)]).unwrap(), None);
        assert_eq!(lookup(vec![None, Some(2)]).unwrap(), None);
        // The peer looked up other tokens: refused in one line naming it.
        let err = lookup(vec![Some(7)]).unwrap_err().to_string();
        assert!(err.contains("rank 1 looked up other tokens"), "{err}");
        assert!(!err.contains('\n'));
    }
}
