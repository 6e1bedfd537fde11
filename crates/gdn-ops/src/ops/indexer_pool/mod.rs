//! The QSA indexer's block pooling of one decode step in one launch (qwen4_exp's attention
//! layers, docs/qwen4_exp.md §2.2): the token's index key joins the tail of the incomplete
//! block, and the tail as it stands is pooled into the row where the next block goes. Every
//! step does it (until the tail is full that row is not a block yet and nothing reads it), so
//! that every step launches the same kernel and a CUDA graph replays it. Composed, the same
//! work was 14 small candle launches a layer (the projection's cast, the key's scatter, the
//! mean, the norm's seven ops, the rotation and its concat's copies, the block's scatter): 168
//! launches of a Qwen3.8 release decode step.
//!
//! Spec, in f32, for `key = qk[0, key_offset .. key_offset + Di]` (`qk` in f32, f16 or bf16):
//!
//! ```text
//! tail[tail_row, :]   = key
//! pooled[d]           = (Σ_r tail[r, d], r = 0..c in order) / c
//! inv                 = 1 / sqrt(Σ_d pooled[d]² / Di + eps)
//! v[d]                = pooled[d] · (inv · norm[d])                  (norm = 1 + w)
//! blocks[block_row,d] = v[d]·cos[d] − v[d+h]·sin[d]                  d < h
//!                       v[d−h]·sin[d−h] + v[d]·cos[d−h]              h ≤ d < 2h
//!                       v[d]                                         otherwise, h = rope_half
//! ```
//!
//! i.e. the mean of the tail, the indexer's `1 + w` RMSNorm and candle's half-split `rope` over
//! the first `2h` values, as `QsaIndexer::select` pools a block on the host. `Σ_d pooled²` is
//! summed as the kernels sum it: per lane of a 32-lane warp in column order (lane `l` takes
//! columns `l, l + 32, …`), then over the lanes by an xor butterfly; [`cpu`] does the same, so
//! the twins agree to the last bit where no FMA contraction intervenes (Metal's fast math may
//! contract: within an ulp).
//!
//! `tail_row` and `block_row` are read on the device (one u32 each, the first element of the
//! step's row tensors): a replayed graph reads the step's rows there. A row past its buffer
//! writes nothing (the host never asks for one).

pub(crate) mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(any(feature = "metal", target_os = "macos"))]
pub mod metal;

use crate::backend::{ensure_same_device, on_device};
use crate::profile::{self, tensor_bytes, Traffic};
use anyhow::{ensure, Result};
use candle_core::{DType, Tensor};

/// The widest key one warp pools (`INDEXER_POOL_MAX_DIM` of kernels/params/indexer_pool.h).
pub const MAX_DIM: usize = 1024;

/// `IndexerPoolParams` of kernels/params/indexer_pool.h, field for field.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IndexerPoolParams {
    pub key_offset: u32,
    pub dim: u32,
    pub rows: u32,
    pub capacity: u32,
    pub rope_half: u32,
    pub eps: f32,
}

/// One step's pooling: what [`indexer_pool`] reads and the two buffers it writes in place.
#[derive(Debug, Clone, Copy)]
pub struct PoolCall<'a> {
    /// `[1, W]` (f32, f16 or bf16): the indexer's projection row, the key at `key_offset`.
    pub qk: &'a Tensor,
    pub key_offset: usize,
    /// `[c, Di]` f32, contiguous: the tail's raw keys, row `tail_row` written.
    pub tail: &'a Tensor,
    /// `[capacity, Di]` f32, contiguous: the pooled block keys, row `block_row` written.
    pub blocks: &'a Tensor,
    /// u32 tensors whose first element is the row to write (the step's inputs on the device).
    pub tail_row: &'a Tensor,
    pub block_row: &'a Tensor,
    /// `[h]` (or `[1, h]`) f32: the rotation of the block's first position.
    pub cos: &'a Tensor,
    pub sin: &'a Tensor,
    /// `[Di]` f32: the key norm's `1 + w`.
    pub norm: &'a Tensor,
    pub eps: f32,
}

/// Whether the kernels pool keys of `dim` values rotated over `rope_dims` of them, from a
/// projection in `dtype` (callers fall back to the composed ops otherwise). At least one pair
/// is rotated: an empty cos/sin would be a zero-byte buffer, which CUDA refuses.
pub fn supports(dim: usize, rope_dims: usize, dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::F16 | DType::BF16)
        && (1..=MAX_DIM).contains(&dim)
        && rope_dims.is_multiple_of(2)
        && (2..=dim).contains(&rope_dims)
}

impl PoolCall<'_> {
    /// The parameters, after checking every shape, dtype and device.
    fn checked(&self) -> Result<IndexerPoolParams> {
        const OP: &str = "indexer_pool";
        let (rows, dim) = self
            .tail
            .dims2()
            .map_err(|_| anyhow::anyhow!("{OP}: tail {:?} must be [c, Di]", self.tail.dims()))?;
        let (capacity, block_dim) = self.blocks.dims2().map_err(|_| {
            anyhow::anyhow!(
                "{OP}: blocks {:?} must be [capacity, Di]",
                self.blocks.dims()
            )
        })?;
        ensure!(
            block_dim == dim && rows >= 1,
            "{OP}: tail {:?} and blocks {:?} must be [c >= 1, Di] and [capacity, Di]",
            self.tail.dims(),
            self.blocks.dims()
        );
        let half = self.cos.elem_count();
        ensure!(
            supports(dim, 2 * half, self.qk.dtype()),
            "{OP}: no kernel for {dim}-value keys rotated over {} from a {:?} projection",
            2 * half,
            self.qk.dtype()
        );
        ensure!(
            self.qk.rank() == 2
                && self.qk.dim(0)? == 1
                && self.qk.dim(1)? >= self.key_offset + dim
                && self.qk.is_contiguous(),
            "{OP}: qk {:?} must be a contiguous [1, >= {}]",
            self.qk.dims(),
            self.key_offset + dim
        );
        for (name, t) in [("tail", self.tail), ("blocks", self.blocks)] {
            ensure!(
                t.dtype() == DType::F32 && t.is_contiguous(),
                "{OP}: {name} must be contiguous f32 to be written in place"
            );
        }
        for (name, t, n) in [
            ("cos", self.cos, half),
            ("sin", self.sin, half),
            ("norm", self.norm, dim),
        ] {
            ensure!(
                t.dtype() == DType::F32 && t.elem_count() == n && t.is_contiguous(),
                "{OP}: {name} must be {n} contiguous f32 values (got {:?} {:?})",
                t.dtype(),
                t.dims()
            );
        }
        for (name, t) in [("tail_row", self.tail_row), ("block_row", self.block_row)] {
            ensure!(
                t.dtype() == DType::U32 && t.elem_count() >= 1 && t.is_contiguous(),
                "{OP}: {name} must be a contiguous u32 tensor of at least one element"
            );
        }
        ensure_same_device(
            OP,
            self.tail,
            "tail",
            &[
                ("qk", self.qk),
                ("blocks", self.blocks),
                ("tail_row", self.tail_row),
                ("block_row", self.block_row),
                ("cos", self.cos),
                ("sin", self.sin),
                ("norm", self.norm),
            ],
        )?;
        let u = |n: usize, what: &str| super::param_u32(OP, what, n);
        Ok(IndexerPoolParams {
            key_offset: u(self.key_offset, "key offset")?,
            dim: u(dim, "key width")?,
            rows: u(rows, "tail rows")?,
            capacity: u(capacity, "block capacity")?,
            rope_half: u(half, "rotated pairs")?,
            eps: self.eps,
        })
    }
}

/// Writes the step's key into the tail and the tail's pooled key into the block row, in place
/// (see the module doc). One launch on a GPU.
pub fn indexer_pool(call: &PoolCall) -> Result<()> {
    let p = call.checked()?;
    // Bytes moved (the decode profile): the key, the tail, the rows, the rotation and the
    // norm read; one tail row and one block row written.
    let traffic = || {
        let (di, c) = (p.dim as usize, p.rows as usize);
        Ok(Traffic::new()
            .read(
                di * call.qk.dtype().size_in_bytes()
                    + 4 * c * di
                    + 8
                    + tensor_bytes(call.cos)
                    + tensor_bytes(call.sin)
                    + tensor_bytes(call.norm),
            )
            .write(8 * di))
    };
    profile::kernel("indexer_pool", call.tail.device(), traffic, || {
        on_device!(call.tail.device(), "indexer_pool", indexer_pool(call, &p))
    })
}
