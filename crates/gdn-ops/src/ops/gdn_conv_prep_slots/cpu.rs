//! The CPU twin of `gdn_conv_prep_slots_*` (kernels/gdn_conv_prep.cu): the per-sequence op's
//! twin on each row and its conv state (shifted in place, as a decode step's), the outputs
//! stacked. By construction it is the per-sequence op, bit for bit; what it checks is the
//! batched callers' addressing (which row goes with which state).

use super::{SlotInputs, SlotsOut};
use crate::ops::gdn_conv_prep::cpu::gdn_conv_prep;
use anyhow::Result;
use candle_core::Tensor;

pub(crate) fn gdn_conv_prep_slots(inputs: &SlotInputs) -> Result<SlotsOut> {
    let outs = inputs
        .rows
        .iter()
        .map(gdn_conv_prep)
        .collect::<Result<Vec<_>>>()?;
    let stack = |f: fn(&crate::ops::gdn_conv_prep::ConvPrepOut) -> &Tensor| {
        Tensor::cat(&outs.iter().map(f).collect::<Vec<_>>(), 0)
    };
    Ok(SlotsOut {
        q: stack(|o| &o.q)?,
        k: stack(|o| &o.k)?,
        v: stack(|o| &o.v)?,
        g: stack(|o| &o.g)?,
        beta: stack(|o| &o.beta)?,
    })
}
