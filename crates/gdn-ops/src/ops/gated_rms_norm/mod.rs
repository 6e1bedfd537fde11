//! The gated RMSNorm that closes a Gated DeltaNet layer (before its out projection) in one
//! kernel.
//!
//! Per row `(b, t, hv)` of `Dv` values, activation dtype `InT` ∈ {f32, f16, bf16}:
//!
//! ```text
//! n   = InT(y·rsqrt(mean(y²) + eps)·weight)      (the mean square in f32 over the InT values)
//! out = InT(silu(f32(z))·f32(n))
//! ```
//!
//! the model's `GatedRmsNorm` (an RMSNorm in `InT`, then the gate and product in f32, as
//! mlx-lm's `_precise_swiglu`).
//!
//! Inputs: `y` `[B, T, Hv, Dv]` contiguous (the recurrence's output); `z` `[B, T, Hv, Dv]` or
//! `[B, T, Hv·Dv]` whose tokens each hold their `Hv·Dv` values contiguously while the tokens
//! may lie at any stride: a slice of the merged projection's output is read in place; `weight`
//! `[Dv]` contiguous (checkpoint weights are already `1 + w`). All in one dtype. Output
//! `[B, T, Hv, Dv]` in that dtype. Any `T` (decode and prefill) and any `Dv`.

pub(crate) mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(any(feature = "metal", target_os = "macos"))]
pub mod metal;

use crate::backend::on_device;
use crate::backend::{ensure_same_device, row_layout, RowLayout};
use crate::profile::{self, Traffic};
use anyhow::{ensure, Result};
use candle_core::{DType, Tensor};

/// `GatedRmsNormParams` of kernels/params/gated_rms_norm.h, field for field: the launch
/// parameters shared by the Metal and CUDA kernels.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GatedRmsNormParams {
    pub rows: u32,
    pub tokens: u32,
    pub value_heads: u32,
    pub value_dim: u32,
    pub z_batch_stride: u32,
    pub z_token_stride: u32,
    pub eps: f32,
}

/// Whether the device kernels cover this activation dtype (f32, f16, bf16; any shape). The
/// model falls back to the composed path otherwise.
pub fn supports(dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::F16 | DType::BF16)
}

/// The inputs of one call after the checks, as the backends receive them.
#[cfg_attr(
    not(any(feature = "metal", target_os = "macos", feature = "cuda")),
    allow(dead_code)
)]
pub(crate) struct Inputs<'a> {
    pub y: &'a Tensor,
    pub z: &'a Tensor,
    pub weight: &'a Tensor,
    pub eps: f32,
    /// `(B, T, Hv, Dv)`.
    pub shape: (usize, usize, usize, usize),
    /// Where z's tokens are (a view is read in place).
    pub z_rows: RowLayout,
}

// What only the device backends use.
#[cfg_attr(
    not(any(feature = "metal", target_os = "macos", feature = "cuda")),
    allow(dead_code)
)]
impl Inputs<'_> {
    pub(crate) fn params(&self) -> Result<GatedRmsNormParams> {
        let (b, t, hv, dv) = self.shape;
        let u = |n: usize, what: &str| super::param_u32("gated_rms_norm", what, n);
        Ok(GatedRmsNormParams {
            rows: u(b * t * hv, "rows")?,
            tokens: u(t, "tokens")?,
            value_heads: u(hv, "value heads")?,
            value_dim: u(dv, "value dim")?,
            z_batch_stride: u(self.z_rows.strides[0], "z batch stride")?,
            z_token_stride: u(self.z_rows.strides[1], "z token stride")?,
            eps: self.eps,
        })
    }

    pub(crate) fn rows(&self) -> usize {
        let (b, t, hv, _) = self.shape;
        b * t * hv
    }
}

/// `InT(silu(z)·InT(rms_norm(y)·weight))` per `(b, t, hv)` row; see the module documentation.
pub fn gated_rms_norm(y: &Tensor, z: &Tensor, weight: &Tensor, eps: f32) -> Result<Tensor> {
    const OP: &str = "gated_rms_norm";
    let shape = y
        .dims4()
        .map_err(|_| anyhow::anyhow!("{OP}: y {:?} must be [B, T, Hv, Dv]", y.dims()))?;
    let (b, t, hv, dv) = shape;
    let dtype = y.dtype();
    ensure!(
        matches!(dtype, DType::F32 | DType::F16 | DType::BF16),
        "{OP}: activations must be f32, f16 or bf16 (got {dtype:?})"
    );
    ensure!(y.is_contiguous(), "{OP}: y must be contiguous");
    ensure!(
        weight.dims() == [dv] && weight.is_contiguous(),
        "{OP}: weight {:?} must be a contiguous [{dv}]",
        weight.dims()
    );
    for (name, x) in [("z", z), ("weight", weight)] {
        ensure!(
            x.dtype() == dtype,
            "{OP}: {name} is {:?}, y {dtype:?}: they must match",
            x.dtype()
        );
    }
    ensure_same_device(OP, y, "y", &[("z", z), ("weight", weight)])?;
    ensure!(
        eps.is_finite() && eps >= 0.0,
        "{OP}: eps must be finite and non-negative (got {eps})"
    );
    let inputs = Inputs {
        y,
        z,
        weight,
        eps,
        shape,
        z_rows: row_layout(z, &[b, t], hv * dv, "gated_rms_norm: z")?,
    };
    // Bytes moved (the decode profile): y, z and the weight read, the output (y's size)
    // written.
    let traffic = || {
        Ok(Traffic::new()
            .read_all(y)
            .read_all(z)
            .read_all(weight)
            .write_all(y))
    };
    let device = y.device();
    profile::kernel(OP, device, traffic, || {
        on_device!(device, OP, gated_rms_norm(&inputs))
    })
}
