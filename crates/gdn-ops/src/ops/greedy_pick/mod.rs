//! Greedy decoding's per-token pick in one read-back: the argmax of each logits row and the
//! count of its non-finite values, so that the host learns both the next token and whether the
//! logits are usable from 2 u32 per row (one sync), instead of a finiteness reduction read back
//! on its own and then an argmax read back again.
//!
//! Spec. `logits` `[N, V]` in f32, f16 or bf16 (the model gives `[1, vocab]` f32) →
//! `[N, 2]` u32, per row n:
//! - column 0: the index of the largest *finite* value of the row, the lowest such index when
//!   several are equal (the rule of `qwen-gdn`'s `sampler::argmax` and mx.argmax); −0 and +0
//!   are equal. 0 when the row holds no finite value;
//! - column 1: how many values of the row are NaN, +Inf or −Inf.
//!
//! Non-finite values are counted and never picked. On a finite row the pick is exactly
//! `sampler::argmax`; on any other row callers treat the count as an error (a broken model's
//! token means nothing), and the pick is only defined so that every backend agrees with
//! [`cpu`]. The kernels test finiteness on the f32 bits (exponent all ones), never with
//! `isfinite`: Metal compiles with fast math, which may assume no NaN or Inf.
//!
//! Kernels: `kernels/greedy_pick.metal` and `kernels/greedy_pick.cu`, two passes each. The
//! slice pass (`greedy_pick_slices_<in>`) runs [`THREADS`] threads on each of B slices of each
//! row (grid (B, N)); each reduces its slice to one record (largest finite value, its first
//! index, non-finite count) with simdgroup / warp shuffles and threadgroup memory. The finish
//! pass (`greedy_pick_finish`, one simdgroup / warp per row) reduces a row's B records in
//! index order and writes the two words. Two launches rather than a "last block done" atomic
//! counter: nothing persists between calls, so the pair replays in a CUDA graph as is, and
//! the emulator (one threadgroup at a time) runs it unchanged. [`cpu`] is the twin both must
//! match exactly.

pub(crate) mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(any(feature = "metal", target_os = "macos"))]
pub mod metal;

use crate::backend::on_device;
use anyhow::{ensure, Result};
use candle_core::{DType, Tensor};

/// Threads of a slice block (`GREEDY_PICK_THREADS` of kernels/params/greedy_pick.h).
pub const THREADS: usize = 256;
/// Most slice blocks per row: above the H100's 132 SMs, so that a 152k vocabulary's row
/// spreads over the whole GPU (149 blocks of ~1020 values).
pub const MAX_BLOCKS: usize = 256;
/// Values a slice block aims for (4 per thread): fewer, smaller blocks for small vocabularies.
pub const BLOCK_VALUES: usize = 1024;
/// 32-bit words of one partial record (`GreedyPickPartial`: value, index, count).
pub const PARTIAL_WORDS: usize = 3;

/// `GreedyPickParams` of kernels/params/greedy_pick.h, field for field.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GreedyPickParams {
    pub rows: u32,
    pub vocab: u32,
    pub blocks: u32,
    pub slice: u32,
}

impl GreedyPickParams {
    /// The launch geometry for `rows` rows of `vocab` values: B = ⌈V / [`BLOCK_VALUES`]⌉
    /// blocks, at most [`MAX_BLOCKS`], of ⌈V / B⌉ values each (the last one may be shorter,
    /// or empty).
    pub fn new(rows: usize, vocab: usize) -> Self {
        let blocks = vocab.div_ceil(BLOCK_VALUES).clamp(1, MAX_BLOCKS);
        Self {
            rows: rows as u32,
            vocab: vocab as u32,
            blocks: blocks as u32,
            slice: vocab.div_ceil(blocks) as u32,
        }
    }

    /// 32-bit words of the partials buffer between the two passes.
    pub fn partial_words(&self) -> usize {
        self.rows as usize * self.blocks as usize * PARTIAL_WORDS
    }
}

/// Whether the kernels take logits in `dtype`.
pub fn supports(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::F16 | DType::BF16)
}

/// The pick of every row of `logits` `[N, V]`: `[N, 2]` u32 of (first index of the largest
/// finite value, non-finite count); see the module doc.
pub fn greedy_pick(logits: &Tensor) -> Result<Tensor> {
    let (rows, vocab) = logits
        .dims2()
        .map_err(|_| anyhow::anyhow!("greedy_pick: logits {:?} must be [N, V]", logits.dims()))?;
    ensure!(vocab > 0, "greedy_pick: empty rows (V = 0)");
    // The index sentinel is u32::MAX and the count must fit a u32.
    ensure!(
        vocab < u32::MAX as usize && rows <= u32::MAX as usize,
        "greedy_pick: [{rows}, {vocab}] is too large"
    );
    ensure!(
        supports(logits.dtype()),
        "greedy_pick: no kernel for {:?} logits",
        logits.dtype()
    );
    if rows == 0 {
        return Ok(Tensor::zeros((0, 2), DType::U32, logits.device())?);
    }
    let p = GreedyPickParams::new(rows, vocab);
    on_device!(logits.device(), "greedy_pick", greedy_pick(logits, &p))
}
