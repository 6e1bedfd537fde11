//! The CPU twin of `kernels/add_rms_norm.{metal,cu}`: row by row in f32, rounding where the
//! kernels round.

use super::Inputs;
use crate::backend::{f32_values, round_to};
use anyhow::Result;
use candle_core::Tensor;

pub(crate) fn add_rms_norm(inputs: &Inputs) -> Result<(Tensor, Tensor)> {
    let Inputs {
        residual,
        delta,
        weight,
        eps,
        cols,
        ..
    } = *inputs;
    let dtype = residual.dtype();
    let r = f32_values(residual)?;
    let w = f32_values(weight)?;
    let sum: Vec<f32> = match delta {
        Some(d) => {
            let d = f32_values(d)?;
            r.iter()
                .zip(&d)
                .map(|(a, b)| round_to(dtype, a + b))
                .collect()
        }
        None => r,
    };
    let mut normed = vec![0f32; sum.len()];
    for (s, n) in sum.chunks_exact(cols).zip(normed.chunks_exact_mut(cols)) {
        let inv = rms_scale(s, eps);
        for ((n, &x), &w) in n.iter_mut().zip(s).zip(&w) {
            *n = x * inv * w;
        }
    }
    let shape = residual.shape();
    let normed = Tensor::from_vec(normed, shape, residual.device())?.to_dtype(dtype)?;
    let sum = match delta {
        Some(_) => Tensor::from_vec(sum, shape, residual.device())?.to_dtype(dtype)?,
        None => residual.clone(),
    };
    Ok((sum, normed))
}

/// `1 / sqrt(mean(x²) + eps)` in f32.
pub(crate) fn rms_scale(x: &[f32], eps: f32) -> f32 {
    let ss: f32 = x.iter().map(|v| v * v).sum();
    1.0 / (ss / x.len() as f32 + eps).sqrt()
}
