//! The CPU twin of `kernels/gated_delta_norm.{metal,cu}`: the recurrence's CPU reference,
//! whose output is rounded to the activation dtype, then the gated norm's twin with the
//! call's gate.

use super::{Gate, Inputs};
use crate::ops::gated_delta;
use crate::ops::gated_rms_norm;
use anyhow::Result;
use candle_core::Tensor;

pub(crate) fn gated_delta_update_norm(inputs: &Inputs) -> Result<Tensor> {
    let d = inputs.dims;
    let y = gated_delta::cpu::gated_delta_update(d, &inputs.recurrence, inputs.state)?;
    let norm = gated_rms_norm::Inputs {
        y: &y,
        z: inputs.z,
        weight: inputs.weight,
        eps: inputs.eps,
        shape: (d.batch, d.steps, d.value_heads, d.value_dim),
        z_rows: inputs.z_rows.clone(),
    };
    match inputs.gate {
        Gate::Silu => gated_rms_norm::cpu::gated_rms_norm(&norm),
        // As the kernels compute it: 1 / (1 + exp(−z)).
        Gate::Sigmoid => {
            gated_rms_norm::cpu::gated_rms_norm_with(&norm, |z| 1.0 / (1.0 + (-z).exp()))
        }
    }
}
