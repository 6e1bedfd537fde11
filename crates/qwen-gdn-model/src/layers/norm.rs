//! RMSNorm and the gated RMSNorm of GDN layers (mlx-lm-reference.md §3.5, §3.6).

use anyhow::Result;
use candle_core::{DType, Tensor};

/// `x · rsqrt(mean(x²) + eps) · weight`. Checkpoint weights are already `1 + w`.
#[derive(Debug, Clone)]
pub struct RmsNorm {
    pub weight: Tensor,
    pub eps: f32,
}

impl RmsNorm {
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Ok(candle_nn::ops::rms_norm(
            &x.contiguous()?,
            &self.weight.to_dtype(x.dtype())?,
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
        let n = self.norm.forward(x)?.to_dtype(DType::F32)?;
        let gate = z.to_dtype(DType::F32)?.silu()?;
        Ok((gate * n)?.to_dtype(x.dtype())?)
    }
}

/// Unweighted RMS normalisation with the epsilon mlx-lm uses on GDN queries and keys,
/// scaled by `scale`: together they L2-normalise and fold in the attention scale.
pub fn scaled_rms(x: &Tensor, eps: f64, scale: f64) -> Result<Tensor> {
    let ms = x.sqr()?.mean_keepdim(candle_core::D::Minus1)?;
    Ok((x.broadcast_div(&(ms + eps)?.sqrt()?)? * scale)?)
}
