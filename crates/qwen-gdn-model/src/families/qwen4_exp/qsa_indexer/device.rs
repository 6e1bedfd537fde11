//! The QSA indexer's selection on the device, for the fused decode step (one token a call):
//! the pooled block keys stay in a device buffer that grows like the KV cache, the raw keys of
//! the incomplete block beside it, and the scores, the choice of blocks and the additive mask
//! are device ops, so the step reads nothing back. The composed step's host selection
//! ([`QsaIndexer::select`], one read-back of the projection a call) is its reference.
//!
//! Every step launches the same kernels (for a replayed step, and so that a step's launches
//! do not depend on where in a block it falls): each pools the tail as it stands and writes
//! the pooled key into the row where the next block goes. Until the tail is full that row is
//! not a block yet and nothing reads it; the step that fills the tail writes the block.
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
use crate::layers::rope::PartialRope;
use crate::tensor::{cast, contiguous};
use anyhow::{ensure, Context, Result};
use candle_core::{DType, Device, Tensor};
use gdn_ops::launches::{candle_op, read_back};
use gdn_ops::ops::indexer_pool::{self, PoolCall};

/// Block keys the device buffer grows by when full: 64 blocks of the release config's 4
/// tokens are the KV cache's step of 256 positions.
const BLOCK_STEP: usize = 64;

/// The block keys and the tail keys on the host, one `Vec` a key.
pub type HostKeys = (Vec<Vec<f32>>, Vec<Vec<f32>>);

/// The indexer's keys of one sequence on the device.
#[derive(Debug, Clone)]
pub struct DeviceIndexKeys {
    /// `[capacity, Di]` f32: the normalised, rotated block keys; rows from `blocks` on are
    /// unused.
    buf: Tensor,
    blocks: usize,
    /// `[c, Di]` f32: the raw keys of the incomplete block in rows `..tail_len`, written in
    /// place; the rows after hold the previous block's (or zeros).
    tail: Tensor,
    tail_len: usize,
}

impl DeviceIndexKeys {
    /// The host's keys on `device` (a new sequence has none), padded with zeros to the
    /// buffers' sizes on the host: an upload, no kernel.
    fn upload(
        blocks: &[Vec<f32>],
        tail: &[Vec<f32>],
        (di, c): (usize, usize),
        device: &Device,
    ) -> Result<Self> {
        ensure!(
            blocks.iter().chain(tail).all(|r| r.len() == di),
            "QSA indexer keys of another width than {di}"
        );
        ensure!(
            tail.len() < c,
            "QSA indexer: {} tail keys of a block of {c}",
            tail.len()
        );
        let padded = |v: &[Vec<f32>], rows: usize| -> Result<Tensor> {
            let mut flat: Vec<f32> = v.iter().flatten().copied().collect();
            flat.resize(rows * di, 0.0);
            Ok(Tensor::from_vec(flat, (rows, di), device)?)
        };
        // Room for the next block's row, which every step writes.
        let capacity = (blocks.len() + 1).div_ceil(BLOCK_STEP) * BLOCK_STEP;
        Ok(Self {
            buf: padded(blocks, capacity)?,
            blocks: blocks.len(),
            tail: padded(tail, c)?,
            tail_len: tail.len(),
        })
    }

    /// The block keys and the tail keys on the host (read back: for a prompt's host
    /// selection or a prompt-cache file, never inside a decode step).
    pub fn download(&self) -> Result<HostKeys> {
        // No copy of zero rows (a zero-byte transfer is an invalid argument to CUDA).
        let host = |t: &Tensor, rows: usize| -> Result<Vec<Vec<f32>>> {
            match rows {
                0 => Ok(Vec::new()),
                _ => read_back(
                    t.narrow(0, 0, rows)?
                        .to_device(&Device::Cpu)?
                        .to_vec2::<f32>(),
                ),
            }
        };
        let blocks = host(&self.buf, self.blocks)?;
        let tail = host(&self.tail, self.tail_len)?;
        Ok((blocks, tail))
    }

    /// Complete blocks held.
    pub fn blocks(&self) -> usize {
        self.blocks
    }

    /// The host-side counts a step advances: complete blocks and tail keys (saved and put
    /// back around a CUDA graph's capture, which records the step without running it).
    pub fn counts(&self) -> (usize, usize) {
        (self.blocks, self.tail_len)
    }

    pub fn set_counts(&mut self, (blocks, tail_len): (usize, usize)) {
        self.blocks = blocks;
        self.tail_len = tail_len;
    }

    /// The tensors a step writes in place: the block keys and the tail keys.
    pub fn buffers(&self) -> (&Tensor, &Tensor) {
        (&self.buf, &self.tail)
    }

    /// Bytes in use (block keys and tail keys, f32).
    pub fn bytes(&self) -> u64 {
        let di = self.buf.dim(1).unwrap_or(0);
        (4 * di * (self.blocks + self.tail_len)) as u64
    }

    /// A copy that shares no storage: both buffers are written in place.
    pub fn deep_clone(&self) -> Result<Self> {
        Ok(Self {
            buf: self.buf.copy()?,
            tail: self.tail.copy()?,
            ..self.clone()
        })
    }

    /// Whether a step can write the next block's row without growing the buffer (a CUDA
    /// graph's replay cannot grow it).
    pub fn room_for_one(&self) -> bool {
        self.blocks < self.buf.dim(0).unwrap_or(0)
    }

    /// The counts after one token's key joined the tail (a block once the tail holds `c`).
    fn advance(&mut self, c: usize) {
        self.tail_len += 1;
        if self.tail_len == c {
            self.blocks += 1;
            self.tail_len = 0;
        }
    }

    /// Grows the block buffer by [`BLOCK_STEP`] rows when the next block's row is past it.
    fn reserve_next_block(&mut self) -> Result<()> {
        let (capacity, di) = self.buf.dims2()?;
        if self.blocks == capacity {
            let grown = zeros((capacity + BLOCK_STEP, di), DType::F32, self.buf.device())?;
            write_at(&grown, &self.buf, 0, 0)?;
            self.buf = grown;
        }
        Ok(())
    }
}

/// What a step's selection reads that depends on its position, as device tensors (so that
/// a captured CUDA graph's replay reads them from there, rewritten before each replay): the
/// tail row the token's key goes to and the row of the next block, each repeated over a
/// `[1, Di]` u32 index (a scatter's), and the rotation of the next block's first position,
/// cos and sin `[1, rope_dims/2]` f32. The same for every QSA layer of a step.
#[derive(Debug, Clone)]
pub struct IndexerInputs {
    pub tail_row: Tensor,
    pub block_row: Tensor,
    pub cos: Tensor,
    pub sin: Tensor,
}

/// The host values of [`IndexerInputs`] at one position.
#[derive(Debug, Clone, PartialEq)]
pub struct IndexerValues {
    pub tail_row: Vec<u32>,
    pub block_row: Vec<u32>,
    pub cos: Vec<f32>,
    pub sin: Vec<f32>,
}

impl IndexerValues {
    /// The values of the token at position `offset` for keys of `di` values pooled into
    /// blocks of `c` tokens, rotated by `rope` ([`QsaIndexer::step_values`]).
    fn at(rope: &PartialRope, di: usize, c: usize, offset: usize) -> Self {
        let blocks = offset / c;
        let (cos, sin) = rope.angles(blocks * c);
        Self {
            tail_row: vec![(offset % c) as u32; di],
            block_row: vec![blocks as u32; di],
            cos,
            sin,
        }
    }

    /// Uploaded to `device` (new tensors).
    pub fn upload(&self, device: &Device) -> Result<IndexerInputs> {
        let row = |v: &[u32]| Tensor::from_slice(v, (1, v.len()), device);
        let angle = |v: &[f32]| Tensor::from_slice(v, (1, v.len()), device);
        Ok(IndexerInputs {
            tail_row: row(&self.tail_row)?,
            block_row: row(&self.block_row)?,
            cos: angle(&self.cos)?,
            sin: angle(&self.sin)?,
        })
    }
}

impl IndexerCache {
    /// The host-side counts after one step of the device selection (blocks of `c` tokens):
    /// what [`QsaIndexer::select_on_device`] advances, and a CUDA graph's replay of it.
    pub fn advance_on_device(&mut self, c: usize) {
        self.len += 1;
        if let Some(keys) = self.device.as_mut() {
            keys.advance(c);
        }
    }
}

impl QsaIndexer {
    /// The step inputs of the token at position `offset` (the indexer has seen `offset`
    /// tokens): its key goes to tail row `offset mod c`, the tail pooled to block row
    /// `offset div c`, rotated at that block's first position.
    pub fn step_values(&self, offset: usize) -> IndexerValues {
        IndexerValues::at(
            &self.rope,
            self.qsa.head_dim,
            self.qsa.compress_ratio,
            offset,
        )
    }

    /// Whether [`QsaIndexer::select_on_device`] can run: the device plan's copy.
    pub fn selects_on_device(&self) -> bool {
        self.device_norms.is_some()
    }

    /// Whether a step at position `offset` sees every key (the selection returns no mask).
    pub fn within_budget(&self, offset: usize) -> bool {
        (offset + 1) / self.qsa.compress_ratio <= self.qsa.block_topk()
    }

    /// The fused decode step's selection for the one token `x` `[1, H]` at position
    /// `offset`, with that position's `step` inputs ([`QsaIndexer::step_values`]): advances
    /// `cache` (whose keys move to `x`'s device at the first call, one upload) and returns
    /// the additive mask `[1, offset + 1]` (0 open, −∞ closed) in `x`'s dtype on `x`'s
    /// device, or `None` while every key is visible (`m ≤ k`, plain causal attention). The
    /// same selection as [`QsaIndexer::select`], with nothing read back. Inside the budget
    /// its launches and their arguments do not depend on the position (the rows written
    /// and the rotation come from `step`): a CUDA graph can replay it.
    pub fn select_on_device(
        &self,
        x: &Tensor,
        cache: &mut IndexerCache,
        offset: usize,
        step: &IndexerInputs,
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
            let keys = DeviceIndexKeys::upload(&cache.blocks, &cache.tail, (di, c), device)?;
            cache.blocks.clear();
            cache.tail.clear();
            cache.device = Some(keys);
        }
        let keys = cache.device.as_mut().expect("set above");
        let proj = self.proj.forward(x)?;
        // The key of this token joins the tail; the tail pooled (mean, norm, RoPE at the
        // block's first position) goes to the next block's row, a block once the tail is full.
        ensure!(
            keys.tail_len == offset % c && keys.blocks == offset / c,
            "QSA indexer: {} blocks and {} tail keys at position {offset}",
            keys.blocks,
            keys.tail_len
        );
        keys.reserve_next_block()?;
        let layer = PoolLayer {
            key_offset: n * di,
            norm: k_norm,
            rope: &self.rope,
            eps: self.eps,
        };
        pool_step(&layer, &proj, keys, step)?;
        cache.advance_on_device(c);
        let keys = cache.device.as_ref().expect("set above");
        let (t, k) = (offset, self.qsa.block_topk());
        let m = (t + 1) / c;
        debug_assert_eq!(m, keys.blocks);
        if m <= k {
            return Ok(None);
        }
        // Queries: per head norm, then RoPE at the token's position.
        let qk = cast(&proj, DType::F32)?;
        let q = contiguous(&qk.narrow(1, 0, n * di)?)?.reshape((n, di))?;
        let q = norm_rows(&q, q_norm, self.eps)?.reshape((1, n, 1, di))?;
        let q = self.rope.forward(&q, t)?.reshape((n, di))?;
        let scores = matmul(&q, &keys.buf.narrow(0, 0, m)?.t()?)?; // [n, m]
        let scale = 1.0 / (di as f64).sqrt();
        let scores = candle_op(candle_op(candle_op(scores.relu())?.sum(0))?.affine(scale, 0.0))?;
        let kept = kept_blocks(&scores, k)?; // [m] f32, 1 kept
                                             // Every token of a kept block, then the incomplete block's, open: log(1) = 0,
                                             // log(0) = −∞.
        let tokens = candle_op(kept.reshape((m, 1))?.broadcast_as((m, c))?.contiguous())?;
        // The incomplete block's 0..c open positions: a whole open block, then cut to t + 1
        // by a view. Never a zero-length tensor (right after a block completes, a zero-byte
        // allocation is an invalid argument to the CUDA driver), and the same launches every
        // step of a block.
        let open =
            cat(&[&tokens.reshape(m * c)?, &full(1f32, c, device)?], 0)?.narrow(0, 0, t + 1)?;
        let mask = candle_op(open.log())?;
        Ok(Some(cast(&mask, x.dtype())?.reshape((1, t + 1))?))
    }
}

/// `1 + w`-weighted RMSNorm of the rows of `x` `[rows, Di]` (f32) on the device.
fn norm_rows(x: &Tensor, w: &Tensor, eps: f32) -> Result<Tensor> {
    let ms = candle_op(candle_op(x.sqr())?.mean_keepdim(1))?;
    let inv = candle_op(candle_op((ms + eps as f64)?.sqrt())?.recip())?;
    candle_op(candle_op(x.broadcast_mul(&inv))?.broadcast_mul(w))
}

/// What a step's pooling takes from its layer: where the key sits in the projection row, the
/// key norm's `1 + w` (f32 on the device), the rotation and the norm's epsilon.
struct PoolLayer<'a> {
    key_offset: usize,
    norm: &'a Tensor,
    rope: &'a PartialRope,
    eps: f32,
}

/// One step's pooling: the key of the projection row `qk` `[1, (n + 1)·Di]` joins the tail at
/// the step's tail row, and the tail pooled (mean, norm, RoPE at the block's first position)
/// goes to the step's block row. One launch (`indexer_pool`) where its kernels take the
/// shape; the composed ops otherwise, named once on stderr on a GPU.
fn pool_step(
    layer: &PoolLayer,
    qk: &Tensor,
    keys: &DeviceIndexKeys,
    step: &IndexerInputs,
) -> Result<()> {
    let di = keys.tail.dim(1)?;
    if !indexer_pool::supports(di, layer.rope.dims(), qk.dtype()) {
        if !qk.device().is_cpu() {
            static ONCE: std::sync::Once = std::sync::Once::new();
            ONCE.call_once(|| {
                eprintln!(
                    "note: the QSA indexer's {di}-value keys (rotated over {}) are pooled by \
                     composed ops: indexer_pool has no kernel for them",
                    layer.rope.dims()
                )
            });
        }
        return pool_step_composed(layer, qk, keys, step);
    }
    indexer_pool::indexer_pool(&PoolCall {
        qk: &contiguous(qk)?,
        key_offset: layer.key_offset,
        tail: &keys.tail,
        blocks: &keys.buf,
        tail_row: &step.tail_row,
        block_row: &step.block_row,
        cos: &step.cos,
        sin: &step.sin,
        norm: layer.norm,
        eps: layer.eps,
    })
}

/// [`pool_step`] in candle ops (13 launches on a GPU): the reference the kernel replaced.
fn pool_step_composed(
    layer: &PoolLayer,
    qk: &Tensor,
    keys: &DeviceIndexKeys,
    step: &IndexerInputs,
) -> Result<()> {
    let di = keys.tail.dim(1)?;
    let key = cast(
        &contiguous(&qk.narrow(1, layer.key_offset, di)?)?,
        DType::F32,
    )?;
    candle_op(keys.tail.scatter_set(&step.tail_row, &key, 0))?;
    let pooled = candle_op(keys.tail.mean_keepdim(0))?;
    let normed = norm_rows(&pooled, layer.norm, layer.eps)?.reshape((1, 1, 1, di))?;
    let pooled = layer
        .rope
        .rotate(&normed, &step.cos, &step.sin)?
        .reshape((1, di))?;
    candle_op(
        keys.buf
            .scatter_set(&step.block_row, &contiguous(&pooled)?, 0),
    )?;
    Ok(())
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

    /// The one-launch pooling (`indexer_pool`, its CPU twin here) writes what the composed
    /// ops it replaced write, over several steps of the release config's shapes (4 query
    /// heads of 128 before the key, blocks of 4, RoPE over 64 values) from a bf16 projection:
    /// the tail bit for bit, the block rows within 4 ulps of their largest value (the norm's
    /// squares are summed in another order); one launch against the composed ops' 13.
    /// Catches a wrong key offset, norm, rotation or row.
    #[test]
    fn one_launch_pooling_matches_the_composed_ops() {
        let (n, di, c) = (4usize, 128usize, 4usize);
        let dev = &Device::Cpu;
        let rope = PartialRope::new(64, 10_000.0);
        let mut seed = 0x51ed_2701_u32;
        let mut next = |n: usize| -> Vec<f32> {
            (0..n)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 17;
                    seed ^= seed << 5;
                    (seed % 20_001) as f32 / 5_000.0 - 2.0
                })
                .collect()
        };
        let norm =
            Tensor::from_vec(next(di).iter().map(|v| 1.0 + v / 4.0).collect(), di, dev).unwrap();
        let layer = PoolLayer {
            key_offset: n * di,
            norm: &norm,
            rope: &rope,
            eps: 1e-6,
        };
        let fresh = || -> DeviceIndexKeys {
            DeviceIndexKeys::upload(&vec![vec![0.5; di]; 3], &[vec![-0.25; di]], (di, c), dev)
                .unwrap()
        };
        let (fused, composed) = (fresh(), fresh());
        for offset in 13..23 {
            let qk = Tensor::from_vec(next((n + 1) * di), (1, (n + 1) * di), dev)
                .unwrap()
                .to_dtype(DType::BF16)
                .unwrap();
            let step = IndexerValues::at(&rope, di, c, offset).upload(dev).unwrap();
            let launches = |f: &dyn Fn() -> Result<()>| {
                let before = gdn_ops::launches::count();
                f().unwrap();
                gdn_ops::launches::count() - before
            };
            // One launch where the composed ops took 13 (counted as on a GPU).
            assert_eq!(launches(&|| pool_step(&layer, &qk, &fused, &step)), 1);
            assert_eq!(
                launches(&|| pool_step_composed(&layer, &qk, &composed, &step)),
                13
            );
            let flat = |t: &Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            assert_eq!(flat(&fused.tail), flat(&composed.tail), "tail at {offset}");
            let (got, want) = (flat(&fused.buf), flat(&composed.buf));
            let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g - w).abs() <= 4.0 * f32::EPSILON * scale,
                    "block value {i} at {offset}: {g} against {w}"
                );
            }
        }
    }

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
