//! The CPU twin of `kernels/gated_rms_norm.{metal,cu}`: the same function in f32, rounding to
//! the activation dtype where the spec does (the normalised y, the output).

use super::Inputs;
use crate::backend::{f32_values, round_to};
use crate::ops::gdn_conv_prep::cpu::silu;
use anyhow::Result;
use candle_core::Tensor;

pub(crate) fn gated_rms_norm(inputs: &Inputs) -> Result<Tensor> {
    gated_rms_norm_with(inputs, silu)
}

/// [`gated_rms_norm`] with another gate on f32 z (`gated_delta_norm`'s sigmoid).
pub(crate) fn gated_rms_norm_with(inputs: &Inputs, gate: fn(f32) -> f32) -> Result<Tensor> {
    let dtype = inputs.y.dtype();
    let round = |x: f32| round_to(dtype, x);
    let (_, _, _, dv) = inputs.shape;
    let y = f32_values(inputs.y)?;
    // z's rows in [B, T, Hv, Dv] order, whatever its strides.
    let z = f32_values(inputs.z)?;
    let weight = f32_values(inputs.weight)?;
    let mut out = Vec::with_capacity(y.len());
    if dv > 0 {
        for (y_row, z_row) in y.chunks_exact(dv).zip(z.chunks_exact(dv)) {
            let mean = y_row.iter().map(|x| x * x).sum::<f32>() / dv as f32;
            let inv_rms = 1.0 / (mean + inputs.eps).sqrt();
            out.extend(y_row.iter().zip(z_row).zip(&weight).map(|((y, z), w)| {
                let n = round(y * inv_rms * w);
                round(gate(*z) * n)
            }));
        }
    }
    Ok(Tensor::from_vec(out, inputs.y.dims(), inputs.y.device())?.to_dtype(dtype)?)
}
