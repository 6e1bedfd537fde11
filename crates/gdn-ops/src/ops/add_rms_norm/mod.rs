//! The residual add and RMSNorm of a layer's pre-norm, fused: one kernel per call instead of
//! an add and a norm.
//!
//! `residual` `[.., H]` (N rows of H), optional `delta` of the same shape, `weight` `[H]`, all
//! in the activation dtype InT:
//! - `sum = round_InT(f32(residual) + f32(delta))`; without `delta` the sum is `residual`
//!   itself (returned as is, neither written nor copied);
//! - `normed = round_InT(f32(sum) · rsqrt(mean(f32(sum)²) + eps) · f32(weight))`, the mean
//!   over the row, from the rounded sum (as the composed add-then-norm sees it).
//!
//! Kernels: `kernels/add_rms_norm.{metal,cu}`, one threadgroup (block) per row of
//! [`row_threads`] threads, each holding [`PER_THREAD`] of the row's values in registers.

pub(crate) mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(any(feature = "metal", target_os = "macos"))]
pub mod metal;

use crate::backend::on_device;
use crate::profile::{self, tensor_bytes, Traffic};
use anyhow::{ensure, Result};
use candle_core::{DType, Tensor, D};

/// Widest row the kernels take (`hidden_size` is 2048 in Qwen3-Next-80B-A3B).
pub const MAX_COLS: usize = 8192;

/// Values of a row each thread holds (`kPer` in both kernels): a threadgroup of up to 1024
/// threads takes a row of up to [`MAX_COLS`].
pub const PER_THREAD: usize = 8;

/// Threads of a row's threadgroup (block): [`PER_THREAD`] values each, whole simdgroups.
/// One simdgroup walking a row in a loop waited on one load after another (30–60 µs per call
/// on the H100, a quarter of a decode step, docs/perf-notes-gpu.md); a row's loads now go out
/// together.
pub fn row_threads(cols: usize) -> usize {
    (cols.div_ceil(PER_THREAD).div_ceil(32) * 32).clamp(32, 1024)
}

/// `AddRmsNormParams` of kernels/params/add_rms_norm.h, field for field.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AddRmsNormParams {
    pub rows: u32,
    pub cols: u32,
    pub has_delta: u32,
    pub eps: f32,
}

/// The inputs of one call after the checks, as the backends receive them.
pub(crate) struct Inputs<'a> {
    pub residual: &'a Tensor,
    pub delta: Option<&'a Tensor>,
    pub weight: &'a Tensor,
    pub eps: f32,
    /// H, the values of each row.
    pub cols: usize,
}

#[cfg_attr(
    not(any(feature = "metal", target_os = "macos", feature = "cuda")),
    allow(dead_code)
)]
impl Inputs<'_> {
    /// N, the rows of H values.
    pub(crate) fn rows(&self) -> usize {
        self.residual.elem_count() / self.cols
    }

    pub(crate) fn params(&self) -> AddRmsNormParams {
        AddRmsNormParams {
            rows: self.rows() as u32,
            cols: self.cols as u32,
            has_delta: self.delta.is_some() as u32,
            eps: self.eps,
        }
    }
}

/// Whether the kernels cover this residual (dtype f32, f16 or bf16; `0 < H ≤ MAX_COLS`).
pub fn supports(residual: &Tensor) -> bool {
    let cols = residual.dims().last().copied().unwrap_or(0);
    matches!(residual.dtype(), DType::F32 | DType::F16 | DType::BF16)
        && (1..=MAX_COLS).contains(&cols)
}

/// Returns `(sum, normed)`, both shaped as `residual`. See the module doc for the maths.
pub fn add_rms_norm(
    residual: &Tensor,
    delta: Option<&Tensor>,
    weight: &Tensor,
    eps: f32,
) -> Result<(Tensor, Tensor)> {
    const OP: &str = "add_rms_norm";
    ensure!(
        residual.rank() >= 1,
        "{OP}: residual must have a feature axis"
    );
    let cols = residual.dim(D::Minus1)?;
    ensure!(
        supports(residual),
        "{OP}: no kernel for {:?} rows of {cols} (f32/f16/bf16, 1..={MAX_COLS} columns)",
        residual.dtype()
    );
    if let Some(d) = delta {
        ensure!(
            d.dims() == residual.dims(),
            "{OP}: delta {:?} must match residual {:?}",
            d.dims(),
            residual.dims()
        );
        ensure!(
            d.dtype() == residual.dtype(),
            "{OP}: delta is {:?}, residual {:?}",
            d.dtype(),
            residual.dtype()
        );
    }
    ensure!(
        weight.dims() == [cols],
        "{OP}: weight {:?}, expected [{cols}]",
        weight.dims()
    );
    ensure!(
        weight.dtype() == residual.dtype(),
        "{OP}: weight is {:?}, residual {:?}",
        weight.dtype(),
        residual.dtype()
    );
    ensure!(
        eps.is_finite() && eps >= 0.0,
        "{OP}: eps must be finite and non-negative"
    );
    ensure!(
        residual.elem_count() > 0,
        "{OP}: residual {:?} has no rows",
        residual.dims()
    );
    let inputs = Inputs {
        residual,
        delta,
        weight,
        eps,
        cols,
    };
    let device = residual.device();
    profile::kernel(
        OP,
        device,
        || Ok(traffic(residual, delta, weight)),
        || on_device!(device, OP, add_rms_norm(&inputs)),
    )
}

/// Bytes moved (the decode profile): the residual, the delta if any and the weight read;
/// the normed rows written, and the sum when there is a delta (without one the sum is the
/// residual itself, not written).
fn traffic(residual: &Tensor, delta: Option<&Tensor>, weight: &Tensor) -> Traffic {
    let rows = tensor_bytes(residual);
    let with_delta = if delta.is_some() { rows } else { 0 };
    Traffic::new()
        .read(rows + with_delta + tensor_bytes(weight))
        .write(rows + with_delta)
}
