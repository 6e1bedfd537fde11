//! Prefill attention in blocks, so that a chunk's scores against the whole context never
//! exist at once: the transient buffers of one chunk's attention stay under a fixed budget
//! whatever the context length, and prefill memory is the chunk's activations and the caches.
//!
//! A chunk of `S` queries over `T` keys would hold `[B, Nq, S, T]` scores several times over
//! (the product in the activation dtype, scaled, masked, in f32, its softmax, the
//! probabilities in the activation dtype): ~2 GiB in f32 alone for a 2 048-token chunk at
//! 16 384 positions with 16 heads. [`BlockPlan`] sizes the work from the context instead:
//!
//! - **query blocks**: as many queries at once as keep `B·Nq·rows·T` f32 scores under the
//!   budget, each block over the keys up to its last query only (the causal mask closes the
//!   rest to all of it);
//! - **key tiles**: when even [`MIN_QUERY_BLOCK`] queries over every key would exceed the
//!   budget, a block walks its keys in tiles with an online softmax (running max, sum and
//!   weighted values in f32, rescaled when the max grows), as flash attention does.
//!
//! A block that sees all its keys at once runs the very ops of the unblocked computation on
//! fewer rows (keys past the causal limit weigh exactly 0 there), so short prompts compute
//! what they computed before; key tiles round differently only in the probabilities' order
//! of summation and their unnormalized rounding to the activation dtype.

use super::{attend_dense, scores, KeyMask};
use crate::candle_ops::matmul;
use crate::tensor::{cast, contiguous};
use anyhow::{ensure, Context, Result};
use candle_core::{DType, Tensor, D};
use gdn_ops::launches::{candle_op, candle_ops};

/// Bytes of f32 scores one block may hold: 128 MiB, a block of 512 queries at 4 096
/// positions or of 128 at 16 384 for Qwen3-Next's 16 query heads. Each of the few copies a
/// block makes of it is at most this size. `QWEN_GDN_ATTN_SCORE_BYTES` (`RunOptions::
/// attn_score_bytes`) overrides it: tests run the model with a tiny budget so that every
/// fixture goes through query blocks and key tiles.
pub const SCORE_BUDGET_BYTES: usize = 128 << 20;

/// The fewest queries a block takes before its keys are tiled instead: fewer rows would
/// leave the products too thin to fill a GPU.
pub const MIN_QUERY_BLOCK: usize = 64;

/// The running max starts here, and masked scores are raised to it: finite, because Metal's
/// fast math assumes no infinities. A key at this score weighs `exp(MIN − max) = 0` as soon as
/// any open key was seen; the causal mask leaves key 0 open to every query in the first tile.
const FLOOR: f64 = f32::MIN as f64;

/// How one chunk's attention is split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockPlan {
    /// Queries per block (the last block may have fewer).
    pub query_block: usize,
    /// Keys per tile: a block whose visible keys fit in one tile takes them at once.
    pub key_tile: usize,
}

impl BlockPlan {
    /// The plan for `queries` queries of `batch` sequences and `q_heads` heads over `keys`
    /// keys, with at most `budget_bytes` of f32 scores per block (never less than one score
    /// per head and sequence).
    pub fn new(
        batch: usize,
        q_heads: usize,
        queries: usize,
        keys: usize,
        budget_bytes: usize,
    ) -> Self {
        let budget = (budget_bytes / 4).max(1);
        let per_pair = (batch * q_heads).max(1);
        let (queries, keys) = (queries.max(1), keys.max(1));
        let rows = budget / (per_pair * keys);
        if rows >= queries.min(MIN_QUERY_BLOCK) {
            // Even blocks: 2 048 queries in rows of 900 are three blocks of 683, not 900, 900, 248.
            let blocks = queries.div_ceil(rows.min(queries));
            return Self {
                query_block: queries.div_ceil(blocks),
                key_tile: keys,
            };
        }
        let query_block = queries.min(MIN_QUERY_BLOCK).min((budget / per_pair).max(1));
        Self {
            query_block,
            key_tile: (budget / (per_pair * query_block)).clamp(1, keys),
        }
    }

    /// Bytes of the largest f32 score buffer a block of this plan holds.
    pub fn score_bytes(&self, batch: usize, q_heads: usize) -> usize {
        batch * q_heads * self.query_block * self.key_tile * 4
    }
}

/// Softmax attention of `q` `[B, Nq, S, Dh]` over `k`, `v` `[B, Nkv, T, Dh]`, query `i` at
/// position `offset + i` seeing keys `j ≤ offset + i`, or those `mask` (additive `[S, T]`)
/// leaves open; the result `[B, Nq, S, Dh]`, in blocks of at most `budget_bytes` of scores.
pub(super) fn attend(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    offset: usize,
    mask: Option<&Tensor>,
    budget_bytes: usize,
) -> Result<Tensor> {
    let (b, nq, s, dh) = q.dims4()?;
    let (_, nkv, t, _) = k.dims4()?;
    ensure!(
        nkv > 0 && nq.is_multiple_of(nkv) && t > 0,
        "attention: {nq} query heads over {nkv} KV heads and {t} keys"
    );
    if let Some(m) = mask {
        ensure!(
            m.dims() == [s, t],
            "attention: mask {:?} for {s} queries over {t} keys",
            m.dims()
        );
    }
    let rep = nq / nkv;
    let plan = BlockPlan::new(b, nq, s, t, budget_bytes);
    let q = contiguous(q)?;
    let mut blocks = Vec::with_capacity(s.div_ceil(plan.query_block));
    // The last block first: under the causal narrowing each block sees more keys than the one
    // before, so in the natural order every block's buffers are larger than the ones just
    // freed and a stream-ordered pool (CUDA's) reserves anew for each until the next sync;
    // largest first, each block fits in what the previous one freed.
    for start in (0..s).step_by(plan.query_block).rev() {
        let n = plan.query_block.min(s - start);
        let rows = if n == s {
            q.clone()
        } else {
            contiguous(&q.narrow(2, start, n)?)?
        };
        // Query head h reads KV head h / rep: fold the repeat into the query's row axis.
        let rows = rows.reshape((b, nkv, rep * n, dh))?;
        let block_mask = mask.map(|m| m.narrow(0, start, n)).transpose()?;
        // Keys past the block's last query are closed to all of it (a given mask may open any).
        let visible = match mask {
            Some(_) => t,
            None => (offset + start + n).min(t),
        };
        let first_query = offset + start;
        let o = if visible <= plan.key_tile {
            let key_mask = match &block_mask {
                Some(m) => KeyMask::Given(m),
                // A single query sees every key up to its own.
                None if n == 1 => KeyMask::Open,
                None => KeyMask::Causal {
                    offset: first_query,
                    key_start: 0,
                },
            };
            let (k, v) = (k.narrow(2, 0, visible)?, v.narrow(2, 0, visible)?);
            attend_dense(&rows, &k, &v, rep, key_mask)?
        } else {
            let tiles = Tiles {
                rep,
                visible,
                key_tile: plan.key_tile,
                first_query,
                mask: block_mask.as_ref(),
            };
            attend_tiled(&rows, k, v, &tiles)?
        };
        blocks.push(o.reshape((b, nq, n, dh))?);
    }
    if blocks.len() == 1 {
        return Ok(blocks.pop().expect("one block"));
    }
    blocks.reverse();
    candle_ops(1, Tensor::cat(&blocks, 2))
}

/// One block's keys, walked in tiles.
struct Tiles<'a> {
    rep: usize,
    /// Keys `0..visible` are attended.
    visible: usize,
    key_tile: usize,
    /// The position of the block's first query (causal mask).
    first_query: usize,
    /// The block's rows of a given mask, `[n, T]`.
    mask: Option<&'a Tensor>,
}

/// Online softmax over key tiles for the folded queries `q` `[B, Nkv, rep·n, Dh]`: per row the
/// running max `m`, sum `l` and weighted values `acc` in f32; a tile with max `m'` rescales
/// them by `exp(m − m')`. The result `acc / l` `[B, Nkv, rep·n, Dh]` in `v`'s dtype.
fn attend_tiled(q: &Tensor, k: &Tensor, v: &Tensor, tiles: &Tiles) -> Result<Tensor> {
    let mut state: Option<(Tensor, Tensor, Tensor)> = None;
    for start in (0..tiles.visible).step_by(tiles.key_tile) {
        let n = tiles.key_tile.min(tiles.visible - start);
        let tile_mask = tiles.mask.map(|m| m.narrow(1, start, n)).transpose()?;
        let key_mask = match &tile_mask {
            Some(m) => KeyMask::Given(m),
            // Every key of the tile at or before the block's first query: open to all rows.
            None if start + n <= tiles.first_query + 1 => KeyMask::Open,
            None => KeyMask::Causal {
                offset: tiles.first_query,
                key_start: start,
            },
        };
        let s = cast(
            &scores(q, &k.narrow(2, start, n)?, tiles.rep, key_mask)?,
            DType::F32,
        )?;
        let s = candle_op(s.maximum(FLOOR))?;
        let tile_max = candle_op(s.max_keepdim(D::Minus1))?;
        let (m, rescale) = match &state {
            None => (tile_max, None),
            Some((m, _, _)) => {
                let m_new = candle_op(m.maximum(&tile_max))?;
                let rescale = candle_op(candle_op(m - &m_new)?.exp())?;
                (m_new, Some(rescale))
            }
        };
        let p = candle_op(candle_op(s.broadcast_sub(&m))?.exp())?;
        let l_tile = candle_op(p.sum_keepdim(D::Minus1))?;
        let pv = matmul(&cast(&p, v.dtype())?, &v.narrow(2, start, n)?)?;
        let pv = cast(&pv, DType::F32)?;
        state = Some(match (state, rescale) {
            (Some((_, l, acc)), Some(r)) => (
                m,
                candle_op(candle_op(l * &r)? + l_tile)?,
                candle_op(candle_op(acc.broadcast_mul(&r))? + pv)?,
            ),
            _ => (m, l_tile, pv),
        });
    }
    let (_, l, acc) = state.context("attention: a block with no keys")?;
    cast(&candle_op(acc.broadcast_div(&l))?, v.dtype())
}

#[cfg(test)]
thread_local! {
    /// The most scores one block of this thread's attention calls held (elements).
    static LARGEST_SCORES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    /// The sizes of this thread's score buffers, in the order they were made.
    static SCORE_SIZES: std::cell::RefCell<Vec<usize>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Records the size of a block's scores (tests measure the largest and the order).
pub(super) fn note_scores(scores: &Tensor) {
    #[cfg(test)]
    {
        LARGEST_SCORES.with(|c| c.set(c.get().max(scores.elem_count())));
        SCORE_SIZES.with(|v| v.borrow_mut().push(scores.elem_count()));
    }
    let _ = scores;
}

#[cfg(test)]
mod tests;
