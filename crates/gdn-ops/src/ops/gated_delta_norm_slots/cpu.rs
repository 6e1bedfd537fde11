//! The CPU twin of `gated_delta_norm_slots_*` (kernels/gated_delta_norm.cu): the per-sequence
//! op's twin on each sequence's rows and state, the outputs stacked. By construction it is
//! the per-sequence op, bit for bit; what it checks is the batched callers' addressing (which
//! row goes with which state).

use super::SlotInputs;
use crate::ops::gated_delta_norm::cpu::gated_delta_update_norm;
use anyhow::Result;
use candle_core::Tensor;

pub(crate) fn gated_delta_update_norm_slots(inputs: &SlotInputs) -> Result<Tensor> {
    let outs = inputs
        .rows
        .iter()
        .map(gated_delta_update_norm)
        .collect::<Result<Vec<_>>>()?;
    Ok(Tensor::cat(&outs, 0)?)
}
