//! A prompt's several replies (a request's `n` choices) share its prefill: once the prompt
//! is in its cache, each reply gets a cache of its own to decode into. The copies are made
//! as the prompt cache makes them (a snapshot of the prompt's end, restored once per copy),
//! so a choice starts exactly where a prompt-cache hit of the same prompt would.

use anyhow::Result;
use qwen_gdn_model::prompt_cache::Snapshot;
use qwen_gdn_model::Cache;

/// `n` caches holding what `cache` holds: the first is `cache` itself (so that a single
/// reply, and a request's first choice, decode in the prompt's own cache), the others copies
/// sharing no storage with it or each other.
pub fn caches_for(cache: Cache, n: usize) -> Result<Vec<Cache>> {
    let snapshot = match n {
        0 | 1 => None,
        _ => Some(Snapshot::capture(&cache)?),
    };
    let mut caches = Vec::with_capacity(n);
    caches.push(cache);
    if let Some(snapshot) = snapshot {
        for _ in 1..n {
            caches.push(snapshot.restore()?);
        }
    }
    Ok(caches)
}
