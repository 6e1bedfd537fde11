//! The CPU twin of the MoE combine kernels: f32 arithmetic, rounded to the activation dtype
//! exactly where the kernels store (the expert sum, the residual sum, the normed value).

use super::{Inputs, MoeCombineParams};
use crate::backend::{f32_values, round_to};
use anyhow::Result;
use candle_core::Tensor;

pub(crate) fn moe_combine(
    inputs: &Inputs,
    p: &MoeCombineParams,
) -> Result<(Tensor, Option<Tensor>)> {
    let (tokens, slots, hidden) = (p.tokens as usize, p.slots as usize, p.hidden as usize);
    let dtype = inputs.down.dtype();
    let round = |x: f32| round_to(dtype, x);
    let down = f32_values(&inputs.down)?;
    let weights = f32_values(&inputs.weights)?;
    let residual = f32_values(&inputs.residual)?;
    let norm_weight = inputs.norm_weight.as_ref().map(f32_values).transpose()?;
    let mut sum = vec![0f32; tokens * hidden];
    let mut normed = norm_weight.as_ref().map(|_| vec![0f32; tokens * hidden]);
    for n in 0..tokens {
        let row = &mut sum[n * hidden..(n + 1) * hidden];
        for (j, out) in row.iter_mut().enumerate() {
            let mut acc = 0f32;
            for s in 0..slots {
                acc += weights[n * slots + s] * down[(n * slots + s) * hidden + j];
            }
            *out = round(residual[n * hidden + j] + round(acc));
        }
        if let (Some(w), Some(normed)) = (&norm_weight, &mut normed) {
            let squares: f32 = row.iter().map(|v| v * v).sum();
            let inv_rms = 1.0 / (squares / hidden as f32 + p.eps).sqrt();
            for (j, o) in normed[n * hidden..(n + 1) * hidden].iter_mut().enumerate() {
                *o = round(row[j] * inv_rms * w[j]);
            }
        }
    }
    let dev = inputs.down.device();
    let wrap = |v: Vec<f32>| -> Result<Tensor> {
        Ok(Tensor::from_vec(v, (tokens, hidden), dev)?.to_dtype(dtype)?)
    };
    Ok((wrap(sum)?, normed.map(wrap).transpose()?))
}
