//! The CPU twin of `attn_decode_slots_*` (kernels/attn_decode.cu): the per-sequence op's twin
//! on each row, its KV buffers and its position, the outputs stacked. By construction it is
//! the per-sequence op, bit for bit; what it checks is the batched callers' addressing.

use super::SlotInputs;
use crate::ops::attn_decode::cpu::attn_decode;
use anyhow::Result;
use candle_core::Tensor;

pub(crate) fn attn_decode_slots(inputs: &SlotInputs) -> Result<Tensor> {
    let outs = inputs
        .rows
        .iter()
        .map(|(d, row)| attn_decode(*d, row))
        .collect::<Result<Vec<_>>>()?;
    Ok(Tensor::cat(&outs, 0)?)
}
