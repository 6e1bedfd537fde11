//! CUDA host side of `gated_delta_norm_window_*` (kernels/gated_delta_norm.cu): the plain
//! op's launch geometry (the entry, cluster or not, that a one-token launch takes, so that
//! every token's sums run in the same order), with the window's states as one more argument.

use super::WindowInputs;
use crate::backend::cuda::{
    config, cuda_source, launch, tensor, with_input_and_state_types, Element, Held, Kernel,
    KernelSource,
};
use crate::ops::gated_delta::cuda::HeldInputs;
use crate::ops::gated_delta_norm::cuda::{checked_device, HeldNorm, Split};
use anyhow::Result;
use candle_core::cuda_backend::cudarc::driver::PushKernelArg;
use candle_core::{CudaDevice, Tensor};

const OP: &str = "gated_delta_update_norm_window";
const SOURCE: KernelSource = cuda_source!("gated_delta_norm");

pub(crate) fn gated_delta_update_norm_window(window: &WindowInputs) -> Result<Tensor> {
    let (dev, dtype, st) = checked_device(&window.inputs, OP)?;
    with_input_and_state_types!(dtype, st, OP, |I, S| launch_as::<I, S>(window, &dev))
}

fn launch_as<I, S>(window: &WindowInputs, dev: &CudaDevice) -> Result<Tensor>
where
    I: Element,
    S: Element,
{
    let inputs = &window.inputs;
    let d = inputs.dims;
    let plan = Split::of(inputs, d.batch * d.value_heads)?;
    let name = format!(
        "gated_delta_norm_window{}",
        &plan.kernel["gated_delta_norm".len()..]
    );
    let kernel = Kernel::typed(dev, &SOURCE, &name, &[I::DTYPE, S::DTYPE], OP)?;
    let params = inputs.params()?;
    let prepared = inputs.recurrence.prepare()?;
    let len = d.batch * d.steps * d.value_heads * d.value_dim;
    // SAFETY: the kernel writes every element of out.
    let out = unsafe { dev.alloc::<I>(len)? };
    if len > 0 {
        let held = HeldInputs::new(&prepared, inputs.state);
        let views = held.views::<I, S>(OP)?;
        let norm = HeldNorm::new(inputs);
        let norm = norm.views::<I>(inputs, OP)?;
        // Written through this view, as the state is: each row by the warp that owns it.
        let after = Held::new(window.after);
        let after = after.view::<S>(OP)?;
        let mut args = kernel.args();
        views.push_recurrence(&mut args);
        norm.push(&mut args);
        args.arg(&out).arg(&after).arg(&params);
        let blocks = (d.batch * d.value_heads * plan.blocks_per_head) as u32;
        let geometry = config((blocks, 1, 1), (32, plan.warps as u32, 1), 0);
        // SAFETY: arguments in the order and types of `gated_delta_norm_window_*` in
        // kernels/gated_delta_norm.cu; after covers [T − 1, B, Hv, Dv, Dk] (checked), every
        // other view the elements the kernel indexes.
        unsafe { launch(args, geometry) }?;
    }
    Ok(tensor(
        out,
        dev,
        (d.batch, d.steps, d.value_heads, d.value_dim),
    ))
}
