//! Prefill that stops at requested positions to snapshot the cache there. A chunk never
//! crosses a snapshot position, and the chunks after one start from it: the splits of a
//! prefill that resumes from a snapshot are then those of a prefill from the start, which
//! keeps a cached run's numbers identical to an uncached one.

use super::PromptCache;
use crate::{Cache, Model};
use anyhow::{ensure, Result};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};

/// Runs `tokens[cache.offset..]` (the cache holds the first `cache.offset` tokens already) in
/// chunks of at most `chunk` tokens, and inserts a snapshot into `pc` at each position of
/// `snapshot_at` and at every multiple of `every` (positions already processed or past the
/// end are ignored; the end itself is a snapshot only when asked).
pub fn prefill_with_snapshots(
    model: &Model,
    tokens: &[u32],
    cache: &mut Cache,
    chunk: usize,
    snapshot_at: &[usize],
    every: Option<usize>,
    pc: &mut PromptCache,
) -> Result<()> {
    let never = AtomicBool::new(false);
    prefill_with_snapshots_cancellable(model, tokens, cache, chunk, snapshot_at, every, pc, &never)
        .map(|_| ())
}

/// [`prefill_with_snapshots`], checking `cancel` before each chunk: returns `false` when it
/// stopped early (the cache then holds a prefix of `tokens`, and every snapshot taken is
/// complete).
#[allow(clippy::too_many_arguments)]
pub fn prefill_with_snapshots_cancellable(
    model: &Model,
    tokens: &[u32],
    cache: &mut Cache,
    chunk: usize,
    snapshot_at: &[usize],
    every: Option<usize>,
    pc: &mut PromptCache,
    cancel: &AtomicBool,
) -> Result<bool> {
    ensure!(chunk > 0, "prefill chunk size must be positive");
    let start = cache.offset;
    ensure!(
        start <= tokens.len(),
        "prefill: the cache has processed {start} tokens, more than the {} given",
        tokens.len()
    );
    let stops = snapshot_positions(start, tokens.len(), snapshot_at, every);
    let mut pos = start;
    for stop in stops.iter().copied().chain([tokens.len()]) {
        while pos < stop {
            if cancel.load(Ordering::Relaxed) {
                return Ok(false);
            }
            let end = (pos + chunk).min(stop);
            model.prefill(&tokens[pos..end], cache, end - pos)?;
            pos = end;
        }
        if stops.contains(&stop) {
            pc.insert(&tokens[..stop], cache)?;
        }
    }
    Ok(true)
}

/// The positions in `(start, end]` to snapshot at, in order.
pub(crate) fn snapshot_positions(
    start: usize,
    end: usize,
    snapshot_at: &[usize],
    every: Option<usize>,
) -> BTreeSet<usize> {
    let mut stops: BTreeSet<usize> = snapshot_at
        .iter()
        .copied()
        .filter(|&p| p > start && p <= end)
        .collect();
    if let Some(n) = every.filter(|&n| n > 0) {
        stops.extend((start / n + 1..=end / n).map(|k| k * n));
    }
    stops
}
