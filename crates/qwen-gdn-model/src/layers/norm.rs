//! RMSNorm and the gated RMSNorm of GDN layers (mlx-lm-reference.md §3.5, §3.6).
//!
//! Candle ops run through `crate::candle_ops` (or `launches::candle_op`), which count the kernel
//! each costs on a GPU (docs/metal.md).

use crate::candle_ops::{sigmoid, silu};
use crate::tensor::{cast, contiguous};
use anyhow::Result;
use candle_core::{DType, Device, Tensor};
use gdn_ops::launches::candle_op;

/// `x · rsqrt(mean(x²) + eps) · weight`. Checkpoint weights are already `1 + w`.
#[derive(Debug, Clone)]
pub struct RmsNorm {
    pub weight: Tensor,
    pub eps: f32,
}

impl RmsNorm {
    pub fn into_device(self, device: &Device, dtype: DType) -> Result<Self> {
        Ok(Self {
            weight: self.weight.to_device(device)?.to_dtype(dtype)?,
            eps: self.eps,
        })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let x = contiguous(x)?;
        candle_op(candle_nn::ops::rms_norm(
            &x,
            &cast(&self.weight, x.dtype())?,
            self.eps,
        ))
    }
}

/// `rms_norm(x) · weight · gate(z)`, the product taken in f32 as mlx-lm's `_precise_swiglu`.
#[derive(Debug, Clone)]
pub struct GatedRmsNorm {
    pub norm: RmsNorm,
    pub gate: Gate,
}

/// The gate of a [`GatedRmsNorm`]: `silu(z)` (Qwen3-Next, Qwen3.5), or `sigmoid(z)` (a
/// family's choice: `qwen4_exp` with `output_gate_type: sigmoid`). The fused decode kernel's
/// own choice, so that the layer hands it over as it is.
pub use gdn_ops::ops::gated_delta_norm::Gate;

impl GatedRmsNorm {
    pub fn forward(&self, x: &Tensor, z: &Tensor) -> Result<Tensor> {
        let n = cast(&self.norm.forward(x)?, DType::F32)?;
        let z = cast(z, DType::F32)?;
        let gate = match self.gate {
            Gate::Sigmoid => sigmoid(&z)?,
            Gate::Silu => silu(&z)?,
        };
        cast(&candle_op(gate.mul(&n))?, x.dtype())
    }
}

/// Unweighted RMS normalisation with the epsilon mlx-lm uses on GDN queries and keys, scaled
/// by a constant: together they L2-normalise and fold in the attention scale. One fused
/// kernel: an RMSNorm whose weight is the constant.
#[derive(Debug, Clone)]
pub struct ScaledRms {
    pub norm: RmsNorm,
}

impl ScaledRms {
    pub fn new(dim: usize, scale: f64, eps: f32) -> Result<Self> {
        Ok(Self {
            norm: RmsNorm {
                weight: Tensor::full(scale as f32, dim, &Device::Cpu)?,
                eps,
            },
        })
    }
}
