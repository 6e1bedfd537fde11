//! The QSA indexer's selection on the device, for the fused decode step (one token a call):
//! the pooled block keys stay in a device buffer that grows like the KV cache, the raw keys of
//! the incomplete block beside it, and the scores, the choice of blocks and the additive mask
//! are device ops, so the step reads nothing back. The composed step's host selection
//! ([`QsaIndexer::select`], one read-back of the projection a call) is its reference.
//!
//! The choice needs no sort. The host keeps the first `k` blocks of a stable sort by score,
//! highest first, the earlier block first among equal scores; block `b` is among them exactly
//! when fewer than `k` blocks come before it in that order:
//! `rank_b = #{j : s_j > s_b} + #{j < b : s_j = s_b}`, kept iff `rank_b < k`. The relu makes
//! exact ties common (every block whose heads all score ≤ 0 scores 0), and the rank keeps the
//! host's rule for them. Composed, the ranks compare all pairs: `[m, m]` bytes for `m` blocks
//! (1 MiB at 4,096 tokens of the release config's compression 4, 1 GiB at 131,072), which
//! a selection kernel would not need.

use super::{IndexerCache, QsaIndexer};
use crate::candle_ops::{cat, full, matmul, write_at, zeros};
use crate::tensor::{cast, contiguous};
use anyhow::{ensure, Context, Result};
use candle_core::{DType, Device, Tensor};
use gdn_ops::launches::{candle_op, read_back};

/// Block keys the device buffer grows by when full: 64 blocks of the release config's 4
/// tokens are the KV cache's step of 256 positions.
const BLOCK_STEP: usize = 64;

/// The indexer's keys of one sequence on the device.
#[derive(Debug, Clone)]
pub struct DeviceIndexKeys {
    /// `[capacity, Di]` f32: the normalised, rotated block keys; rows from `blocks` on are
    /// unused.
    buf: Tensor,
    blocks: usize,
    /// `[r, Di]` f32, `0 < r < c`: the raw keys of the incomplete block.
    tail: Option<Tensor>,
}

impl DeviceIndexKeys {
    /// The host's keys on `device` (a new sequence has none).
    fn upload(blocks: &[Vec<f32>], tail: &[Vec<f32>], di: usize, device: &Device) -> Result<Self> {
        let rows = |v: &[Vec<f32>]| -> Result<Tensor> {
            ensure!(
                v.iter().all(|r| r.len() == di),
                "QSA indexer keys of another width than {di}"
            );
            let flat: Vec<f32> = v.iter().flatten().copied().collect();
            Ok(Tensor::from_vec(flat, (v.len(), di), device)?)
        };
        let capacity = blocks.len().div_ceil(BLOCK_STEP).max(1) * BLOCK_STEP;
        let buf = zeros((capacity, di), DType::F32, device)?;
        if !blocks.is_empty() {
            write_at(&buf, &rows(blocks)?, 0, 0)?;
        }
        let tail = if tail.is_empty() {
            None
        } else {
            Some(rows(tail)?)
        };
        Ok(Self {
            buf,
            blocks: blocks.len(),
            tail,
        })
    }

    /// The block keys and the tail keys on the host (read back: for a prompt's host
    /// selection or a prompt-cache file, never inside a decode step).
    pub fn download(&self) -> Result<(Vec<Vec<f32>>, Vec<Vec<f32>>)> {
        let host = |t: &Tensor| read_back(t.to_device(&Device::Cpu)?.to_vec2::<f32>());
        let blocks = host(&self.buf.narrow(0, 0, self.blocks)?)?;
        let tail = match &self.tail {
            Some(t) => host(t)?,
            None => Vec::new(),
        };
        Ok((blocks, tail))
    }

    /// Complete blocks held.
    pub fn blocks(&self) -> usize {
        self.blocks
    }

    /// Bytes in use (block keys and tail keys, f32).
    pub fn bytes(&self) -> u64 {
        let di = self.buf.dim(1).unwrap_or(0);
        let tail = self.tail.as_ref().map_or(0, |t| t.dim(0).unwrap_or(0));
        (4 * di * (self.blocks + tail)) as u64
    }

    /// A copy that shares no storage: the block buffer is written in place.
    pub fn deep_clone(&self) -> Result<Self> {
        Ok(Self {
            buf: self.buf.copy()?,
            ..self.clone()
        })
    }

    /// Appends a block key `[1, Di]`, growing the buffer by [`BLOCK_STEP`] when full.
    fn push_block(&mut self, key: &Tensor) -> Result<()> {
        let (capacity, di) = self.buf.dims2()?;
        if self.blocks == capacity {
            let grown = zeros((capacity + BLOCK_STEP, di), DType::F32, self.buf.device())?;
            write_at(&grown, &self.buf, 0, 0)?;
            self.buf = grown;
        }
        write_at(&self.buf, key, 0, self.blocks)?;
        self.blocks += 1;
        Ok(())
    }
}

impl QsaIndexer {
    /// Whether [`QsaIndexer::select_on_device`] can run: the device plan's copy.
    pub fn selects_on_device(&self) -> bool {
        self.device_norms.is_some()
    }

    /// `1 + w`-weighted RMSNorm of the rows of `x` `[rows, Di]` (f32) on the device.
    fn norm_rows(&self, x: &Tensor, w: &Tensor) -> Result<Tensor> {
        let ms = candle_op(candle_op(x.sqr())?.mean_keepdim(1))?;
        let inv = candle_op(candle_op((ms + self.eps as f64)?.sqrt())?.recip())?;
        candle_op(candle_op(x.broadcast_mul(&inv))?.broadcast_mul(w))
    }

    /// The fused decode step's selection for the one token `x` `[1, H]` at position
    /// `offset`: advances `cache` (whose keys move to `x`'s device at the first call, one
    /// upload) and returns the additive mask `[1, offset + 1]` (0 open, −∞ closed) in `x`'s
    /// dtype on `x`'s device, or `None` while every key is visible (`m ≤ k`, plain causal
    /// attention). The same selection as [`QsaIndexer::select`], with nothing read back.
    pub fn select_on_device(
        &self,
        x: &Tensor,
        cache: &mut IndexerCache,
        offset: usize,
    ) -> Result<Option<Tensor>> {
        ensure!(
            cache.len == offset,
            "QSA indexer: cache holds {} tokens, offset {offset}",
            cache.len
        );
        ensure!(
            x.dim(0)? == 1,
            "QSA device selection: one token a call, got {}",
            x.dim(0)?
        );
        let (q_norm, k_norm) = self
            .device_norms
            .as_ref()
            .context("QSA device selection needs the device plan")?;
        let (n, di, c) = (self.qsa.n_heads, self.qsa.head_dim, self.qsa.compress_ratio);
        let device = x.device();
        if cache.device.is_none() {
            let keys = DeviceIndexKeys::upload(&cache.blocks, &cache.tail, di, device)?;
            cache.blocks.clear();
            cache.tail.clear();
            cache.device = Some(keys);
        }
        let keys = cache.device.as_mut().expect("set above");
        let qk = cast(&self.proj.forward(x)?, DType::F32)?;
        // The key of this token joins the tail; a full tail becomes a block.
        let raw = qk.narrow(1, n * di, di)?;
        let tail = match keys.tail.take() {
            Some(t) => cat(&[&t, &raw], 0)?,
            None => contiguous(&raw)?,
        };
        cache.len += 1;
        if tail.dim(0)? == c {
            let pooled = candle_op(tail.mean_keepdim(0))?;
            let normed = self.norm_rows(&pooled, k_norm)?.reshape((1, 1, 1, di))?;
            let start = keys.blocks * c;
            keys.push_block(&self.rope.forward(&normed, start)?.reshape((1, di))?)?;
        } else {
            keys.tail = Some(tail);
        }
        let (t, k) = (offset, self.qsa.block_topk());
        let m = (t + 1) / c;
        debug_assert_eq!(m, keys.blocks);
        if m <= k {
            return Ok(None);
        }
        // Queries: per head norm, then RoPE at the token's position.
        let q = contiguous(&qk.narrow(1, 0, n * di)?)?.reshape((n, di))?;
        let q = self.norm_rows(&q, q_norm)?.reshape((1, n, 1, di))?;
        let q = self.rope.forward(&q, t)?.reshape((n, di))?;
        let scores = matmul(&q, &keys.buf.narrow(0, 0, m)?.t()?)?; // [n, m]
        let scale = 1.0 / (di as f64).sqrt();
        let scores = candle_op(candle_op(candle_op(scores.relu())?.sum(0))?.affine(scale, 0.0))?;
        let kept = kept_blocks(&scores, k)?; // [m] f32, 1 kept
                                             // Every token of a kept block, then the incomplete block's, open: log(1) = 0,
                                             // log(0) = −∞.
        let tokens = candle_op(kept.reshape((m, 1))?.broadcast_as((m, c))?.contiguous())?;
        let open = cat(
            &[&tokens.reshape(m * c)?, &full(1f32, t + 1 - m * c, device)?],
            0,
        )?;
        let mask = candle_op(open.log())?;
        Ok(Some(cast(&mask, x.dtype())?.reshape((1, t + 1))?))
    }
}

/// `[m]` f32: 1 for the `k` blocks the host's order puts first (highest score, the earlier
/// block among equal scores), 0 for the rest, from `scores` `[m]` f32 (see the module's
/// rank).
pub fn kept_blocks(scores: &Tensor, k: usize) -> Result<Tensor> {
    let m = scores.dim(0)?;
    // Row b compares block b's score (a column) with every block j's (a row).
    let (own, other) = (scores.reshape((m, 1))?, scores.reshape((1, m))?);
    let higher = candle_op(other.broadcast_gt(&own))?;
    let equal = candle_op(other.broadcast_eq(&own))?;
    let ids = candle_op(Tensor::arange(0u32, m as u32, scores.device()))?;
    let earlier = candle_op(ids.reshape((1, m))?.broadcast_lt(&ids.reshape((m, 1))?))?;
    // j comes before b: an equal score and an earlier block, or else a higher score (no
    // arithmetic on the u8 comparisons, which not every backend has).
    let ahead = candle_op(equal.where_cond(&earlier, &higher))?;
    let rank = candle_op(cast(&ahead, DType::F32)?.sum(1))?;
    cast(&candle_op(rank.lt(k as f32))?, DType::F32)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The host's rule ([`QsaIndexer::select`]): a stable sort by score, highest first, the
    /// earlier block first among equals; its first `k` blocks.
    fn host_top_k(scores: &[f32], k: usize) -> Vec<bool> {
        let mut order: Vec<(f32, usize)> = scores.iter().copied().zip(0..).collect();
        order.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let mut kept = vec![false; scores.len()];
        order[..k].iter().for_each(|&(_, b)| kept[b] = true);
        kept
    }

    /// The ranks keep exactly the host's blocks, on scores with many exact ties (zeros, as
    /// the relu gives, and a few repeated levels) and on distinct scores, for every `k` from 1
    /// to `m`.
    #[test]
    fn kept_blocks_are_the_hosts_top_k_ties_included() {
        let mut seed = 0x9e37_79b9_u32;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            seed
        };
        for m in [1usize, 2, 5, 17, 64] {
            for levels in [0u32, 1, 3, 1000] {
                let scores: Vec<f32> = (0..m)
                    .map(|_| match levels {
                        0 => (next() % 1_000_000) as f32 / 7.0,
                        l => (next() % (l + 1)) as f32 * 0.5,
                    })
                    .collect();
                let t = Tensor::from_slice(&scores, m, &Device::Cpu).unwrap();
                for k in 1..=m {
                    let got: Vec<bool> = kept_blocks(&t, k)
                        .unwrap()
                        .to_vec1::<f32>()
                        .unwrap()
                        .iter()
                        .map(|&v| v == 1.0)
                        .collect();
                    assert_eq!(got, host_top_k(&scores, k), "m {m}, k {k}: {scores:?}");
                }
            }
        }
    }
}
