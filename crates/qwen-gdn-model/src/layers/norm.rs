//! RMSNorm and the gated RMSNorm of GDN layers (mlx-lm-reference.md §3.5, §3.6).
//!
//! `launches::record` calls count the kernels each op costs on a GPU (docs/metal.md).

use anyhow::Result;
use candle_core::{DType, Device, Tensor};
use gdn_ops::launches::record;

/// A copy kernel when `x` is a strided view, none otherwise.
pub fn contiguous(x: &Tensor) -> Result<Tensor> {
    if !x.is_contiguous() {
        record(1);
    }
    Ok(x.contiguous()?)
}

/// A cast kernel when the dtype changes, none otherwise.
pub fn cast(x: &Tensor, dtype: DType) -> Result<Tensor> {
    if x.dtype() != dtype {
        record(1);
    }
    Ok(x.to_dtype(dtype)?)
}

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
        record(1);
        Ok(candle_nn::ops::rms_norm(
            &x,
            &cast(&self.weight, x.dtype())?,
            self.eps,
        )?)
    }
}

/// `rms_norm(x) · weight · silu(z)`, the product taken in f32 as mlx-lm's `_precise_swiglu`.
#[derive(Debug, Clone)]
pub struct GatedRmsNorm {
    pub norm: RmsNorm,
}

impl GatedRmsNorm {
    pub fn forward(&self, x: &Tensor, z: &Tensor) -> Result<Tensor> {
        let n = cast(&self.norm.forward(x)?, DType::F32)?;
        let gate = cast(z, DType::F32)?.silu()?;
        record(2);
        cast(&(gate * n)?, x.dtype())
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
