//! CUDA host side of `gated_delta_norm_slots_*` (kernels/gated_delta_norm_slots.cu, the body in
//! kernels/gated_delta_norm.cu): the table of
//! the states' device addresses, uploaded on candle's stream, and the per-sequence op's
//! launch geometry over B sequences.

use super::SlotInputs;
use crate::backend::cuda::{
    address_table, config, cuda_source, launch, tensor, with_input_and_state_types, Element, Held,
    Kernel, KernelSource,
};
use crate::ops::gated_delta::cuda::HeldInputs;
use crate::ops::gated_delta_norm::cuda::{checked_device, HeldNorm, Split};
use anyhow::Result;
use candle_core::cuda_backend::cudarc::driver::PushKernelArg;
use candle_core::{CudaDevice, Tensor};

const OP: &str = "gated_delta_update_norm_slots";
const SOURCE: KernelSource = cuda_source!("gated_delta_norm_slots");

pub(crate) fn gated_delta_update_norm_slots(inputs: &SlotInputs) -> Result<Tensor> {
    let (dev, dtype, st) = checked_device(&inputs.batch, OP)?;
    with_input_and_state_types!(dtype, st, OP, |I, S| launch_as::<I, S>(inputs, &dev))
}

fn launch_as<I, S>(inputs: &SlotInputs, dev: &CudaDevice) -> Result<Tensor>
where
    I: Element,
    S: Element,
{
    let batch = &inputs.batch;
    let d = inputs.dims;
    // The entry one sequence's launch would take (cluster or not): the same sums per head.
    let plan = Split::of(batch, d.value_heads)?;
    let name = format!(
        "gated_delta_norm_slots{}",
        &plan.kernel["gated_delta_norm".len()..]
    );
    let kernel = Kernel::typed(dev, &SOURCE, &name, &[I::DTYPE, S::DTYPE], OP)?;
    let params = batch.params()?;
    let prepared = batch.recurrence.prepare()?;
    let len = d.batch * d.steps * d.value_heads * d.value_dim;
    // SAFETY: the kernel writes every element of out.
    let out = unsafe { dev.alloc::<I>(len)? };
    if len > 0 {
        // The states stay read-locked (their storage alive and unmoved) until the launch is
        // queued; candle's single stream orders the kernel's in-place writes after earlier
        // readers, as for the per-sequence op's state view.
        let states: Vec<Held> = inputs.states.iter().map(Held::new).collect();
        let slots = address_table::<S>(dev, &states, OP)?;
        let held = HeldInputs::new(&prepared, batch.state);
        let views = held.views::<I, S>(OP)?;
        let norm = HeldNorm::new(batch);
        let norm = norm.views::<I>(batch, OP)?;
        let mut args = kernel.args();
        views.push_gates(&mut args);
        args.arg(slots.as_ref());
        norm.push(&mut args);
        args.arg(&out).arg(&params);
        let blocks = (d.batch * d.value_heads * plan.blocks_per_head) as u32;
        let geometry = config((blocks, 1, 1), (32, plan.warps as u32, 1), 0);
        // SAFETY: arguments in the order and types of `gated_delta_norm_slots_*` in
        // kernels/gated_delta_norm.cu; slots[b] addresses sequence b's whole [1, Hv, Dv, Dk]
        // state (each view is its contiguous tensor), and every other view covers the
        // elements the kernel indexes.
        unsafe { launch(args, geometry) }?;
    }
    Ok(tensor(
        out,
        dev,
        (d.batch, d.steps, d.value_heads, d.value_dim),
    ))
}
