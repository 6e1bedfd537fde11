//! The CPU twin of `attn_prep_slots_*` (kernels/attn_prep.cu): the per-sequence op's twin on
//! each row, its KV buffers and its position, q and gate stacked. By construction it is the
//! per-sequence op, bit for bit; what it checks is the batched callers' addressing.

use super::SlotInputs;
use crate::ops::attn_prep::cpu::attn_prep;
use anyhow::Result;
use candle_core::Tensor;

pub(crate) fn attn_prep_slots(inputs: &SlotInputs) -> Result<(Tensor, Tensor)> {
    let (qs, gates): (Vec<_>, Vec<_>) = inputs
        .rows
        .iter()
        .map(|(d, row)| attn_prep(*d, row))
        .collect::<Result<Vec<_>>>()?
        .into_iter()
        .unzip();
    Ok((Tensor::cat(&qs, 0)?, Tensor::cat(&gates, 0)?))
}
