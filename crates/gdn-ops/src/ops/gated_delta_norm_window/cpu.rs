//! The CPU twin of `gated_delta_norm_window_*` (kernels/gated_delta_norm.{metal,cu}): the
//! plain op's twin once per token on that token's rows, the state copied into `after` after
//! every token but the last. By construction T one-token calls; what the kernels are tested
//! against.

use super::WindowInputs;
use crate::ops::gated_delta_norm::cpu::gated_delta_update_norm;
use crate::ops::gated_delta_norm::Inputs;
use anyhow::Result;
use candle_core::Tensor;

pub(crate) fn gated_delta_update_norm_window(window: &WindowInputs) -> Result<Tensor> {
    let i = &window.inputs;
    let r = &i.recurrence;
    let steps = i.dims.steps;
    let mut outs = Vec::with_capacity(steps);
    for t in 0..steps {
        let at = |x: &Tensor| x.narrow(1, t, 1);
        let (q, k, v, g, beta, z) = (
            at(r.q)?,
            at(r.k)?,
            at(r.v)?,
            at(r.g)?,
            at(r.beta)?,
            at(i.z)?,
        );
        let one = Inputs::checked(&q, &k, &v, &g, &beta, i.state, &z, i.weight, i.eps, i.gate)?;
        outs.push(gated_delta_update_norm(&one)?);
        if t + 1 < steps {
            window.after.slice_set(&i.state.unsqueeze(0)?, 0, t)?;
        }
    }
    Ok(Tensor::cat(&outs, 1)?)
}
