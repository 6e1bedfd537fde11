//! The CPU twin of the MoE combine kernels: f32 arithmetic, rounded to the activation dtype
//! exactly where the kernels store (the expert sum, the residual sum, the normed value).

use super::{CombineKernel, Inputs, MoeCombineParams};
use crate::backend::{f32_values, round_to};
use anyhow::Result;
use candle_core::Tensor;

pub(crate) fn moe_combine(
    inputs: &Inputs,
    p: &MoeCombineParams,
    _kernel: CombineKernel, // the twin of every kernel
) -> Result<(Tensor, Option<Tensor>)> {
    let (tokens, slots, hidden) = (p.tokens as usize, p.slots as usize, p.hidden as usize);
    let dtype = inputs.down.dtype();
    let round = |x: f32| round_to(dtype, x);
    let down = f32_values(&inputs.down)?;
    let weights = f32_values(&inputs.weights)?;
    let rows: Option<Vec<u32>> = inputs
        .rows
        .as_ref()
        .map(|r| r.flatten_all()?.to_vec1())
        .transpose()?;
    let residual = inputs.residual.as_ref().map(f32_values).transpose()?;
    let norm_weight = inputs.norm_weight.as_ref().map(f32_values).transpose()?;
    let mut sum = vec![0f32; tokens * hidden];
    let mut normed = norm_weight.as_ref().map(|_| vec![0f32; tokens * hidden]);
    for n in 0..tokens {
        let row = &mut sum[n * hidden..(n + 1) * hidden];
        for (j, out) in row.iter_mut().enumerate() {
            let mut acc = 0f32;
            for s in 0..slots {
                let r = match &rows {
                    Some(rows) => rows[n * slots + s] as usize,
                    None => n * slots + s,
                };
                // A gathered row past `down` adds nothing, as in the kernels.
                if let Some(d) = down.get(r * hidden + j) {
                    acc += weights[n * slots + s] * d;
                }
            }
            *out = match &residual {
                Some(res) => round(res[n * hidden + j] + round(acc)),
                None => round(acc),
            };
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
