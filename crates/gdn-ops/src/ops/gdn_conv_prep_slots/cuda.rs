//! CUDA host side of `gdn_conv_prep_slots_*` (kernels/gdn_conv_prep.cu): the table of the
//! conv states' device addresses, uploaded on candle's stream, and the per-sequence op's
//! geometry over B rows.

use super::{SlotInputs, SlotsOut};
use crate::backend::cuda::{
    address_table, config, cuda_source, launch, with_float_type, Element, Held, Kernel,
    KernelSource,
};
use crate::ops::gdn_conv_prep::cuda::{checked_device, HeldInputs, Outputs, SLOTS_PER_BLOCK};
use anyhow::{ensure, Result};
use candle_core::cuda_backend::cudarc::driver::PushKernelArg;
use candle_core::CudaDevice;

const OP: &str = "gdn_conv_prep_slots";
const SOURCE: KernelSource = cuda_source!("gdn_conv_prep");

pub(crate) fn gdn_conv_prep_slots(inputs: &SlotInputs) -> Result<SlotsOut> {
    let batch = &inputs.batch;
    let (dev, dtype) = checked_device(batch, OP)?;
    ensure!(
        batch.batch <= 65535,
        "{OP}: {} sequences exceed the CUDA grid (65535)",
        batch.batch
    );
    with_float_type!(dtype, OP, |T| launch_as::<T>(inputs, &dev))
}

fn launch_as<T>(inputs: &SlotInputs, dev: &CudaDevice) -> Result<SlotsOut>
where
    T: Element,
{
    let batch = &inputs.batch;
    let kernel = Kernel::typed(dev, &SOURCE, "gdn_conv_prep_slots", &[T::DTYPE], OP)?;
    let params = batch.params()?;
    let d = batch.dims;
    let bn = batch.batch;
    let out = Outputs::<T>::alloc(dev, d, bn)?;
    {
        // The states stay read-locked until the launch is queued; each is shifted in place
        // (every element read, then written, by one thread), ordered on candle's stream.
        let states: Vec<Held> = inputs.conv_states.iter().map(Held::new).collect();
        let slots = address_table::<T>(dev, &states, OP)?;
        let held = HeldInputs::new(batch);
        let views = held.views::<T>(batch, OP)?;
        let mut args = kernel.args();
        views.push_rows(&mut args);
        args.arg(slots.as_ref());
        views.push_layer(&mut args);
        out.push(&mut args);
        args.arg(&params);
        let slot_blocks = (d.slots() as u32).div_ceil(SLOTS_PER_BLOCK);
        let geometry = config((slot_blocks, 1, bn as u32), (32, SLOTS_PER_BLOCK, 1), 0);
        // SAFETY: arguments in the order and types of `gdn_conv_prep_slots_*` in
        // kernels/gdn_conv_prep.cu; slots[b] addresses sequence b's whole contiguous
        // [1, K-1, C] conv state; every other view covers the elements the kernel indexes.
        unsafe { launch(args, geometry) }?;
    }
    let [q, k, v, g, beta] = out.into_tensors(dev, d, (bn, 1));
    Ok(SlotsOut { q, k, v, g, beta })
}
