//! Prefill that stops at requested positions to snapshot the cache there.
//!
//! Splitting a prompt differently changes the results in the last bits (the GDN chunked
//! recurrence and the products round differently per split), and greedy decoding can turn
//! that into other tokens. So the splits are a function of the snapshot positions only: a
//! chunk never crosses one, the chunks after it start from it, and the token just before it
//! runs alone through the decode path, as the last token of every prompt does (its logits
//! start generation, and the prompt's end is snapshotted after it). A request resumed from a
//! snapshot then runs exactly the steps of the same request run from scratch with the same
//! snapshot positions.

use super::PromptCache;
use crate::{Cache, Model};
use anyhow::{ensure, Result};
use std::collections::BTreeSet;

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
    let prefill = ChunkedPrefill::new(cache.offset, tokens.len(), chunk, snapshot_at, every)?;
    while !prefill.step(model, tokens, cache, pc)? {}
    Ok(())
}

/// A prefill with snapshots taken a piece at a time (a chunk, or the token before a snapshot
/// with the snapshot), so that a server can run other sequences' decode steps between the
/// pieces: the pieces are those [`prefill_with_snapshots`] runs, in the same order.
#[derive(Debug, Clone)]
pub struct ChunkedPrefill {
    stops: BTreeSet<usize>,
    end: usize,
    chunk: usize,
}

impl ChunkedPrefill {
    /// The prefill of tokens `start..end` (the cache holds the first `start`), in chunks of
    /// at most `chunk`, with snapshots as [`prefill_with_snapshots`] takes them.
    pub fn new(
        start: usize,
        end: usize,
        chunk: usize,
        snapshot_at: &[usize],
        every: Option<usize>,
    ) -> Result<Self> {
        ensure!(chunk > 0, "prefill chunk size must be positive");
        ensure!(
            start <= end,
            "prefill: the cache has processed {start} tokens, more than the {end} given"
        );
        Ok(Self {
            stops: snapshot_positions(start, end, snapshot_at, every),
            end,
            chunk,
        })
    }

    /// Runs the next piece of `tokens` (the same tokens every call) after what `cache`
    /// holds; `true` once the cache holds all of them.
    pub fn step(
        &self,
        model: &Model,
        tokens: &[u32],
        cache: &mut Cache,
        pc: &mut PromptCache,
    ) -> Result<bool> {
        ensure!(
            tokens.len() == self.end,
            "prefill: {} tokens given, {} planned",
            tokens.len(),
            self.end
        );
        match self.next_piece(cache.offset)? {
            None => return Ok(true),
            Some(PrefillPiece::Chunk(range)) => {
                model.prefill(&tokens[range.clone()], cache, range.len())?;
            }
            Some(PrefillPiece::AloneThenSnapshot(stop)) => {
                model.forward_last(&tokens[stop - 1..stop], cache)?;
                pc.insert(&tokens[..stop], cache)?;
            }
        }
        // A snapshot at the end is taken by the piece that reaches it.
        Ok(cache.offset == self.end)
    }

    /// The piece to run when the cache holds `pos` tokens, `None` once it holds them all: what
    /// [`ChunkedPrefill::step`] runs, for a caller whose forward calls go elsewhere (a
    /// pipeline's stages, `qwen-gdn chat --ranks`).
    pub fn next_piece(&self, pos: usize) -> Result<Option<PrefillPiece>> {
        ensure!(
            pos <= self.end,
            "prefill: the cache is past the prompt's end"
        );
        let Some(stop) = self.stops.range(pos + 1..).next().copied().or_else(|| {
            // Past the last snapshot: plain chunks up to the end.
            (pos < self.end).then_some(self.end)
        }) else {
            return Ok(None);
        };
        let snapshot = self.stops.contains(&stop);
        // The token before a snapshot runs alone, as the last token of a prompt does (see
        // the module's doc): a snapshot is then the same state whether it was taken at a
        // boundary or at a prompt's end.
        let chunks_end = if snapshot { stop - 1 } else { stop };
        Ok(Some(if pos < chunks_end {
            PrefillPiece::Chunk(pos..(pos + self.chunk).min(chunks_end))
        } else {
            PrefillPiece::AloneThenSnapshot(stop)
        }))
    }
}

/// One piece of a [`ChunkedPrefill`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PrefillPiece {
    /// These positions' tokens, run as one prefill chunk.
    Chunk(std::ops::Range<usize>),
    /// The token before this position run alone (through the decode path), then the cache
    /// snapshotted at this position.
    AloneThenSnapshot(usize),
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
