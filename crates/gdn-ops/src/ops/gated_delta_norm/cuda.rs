//! CUDA host side of `kernels/gated_delta_norm.cu`: binding and launch geometry, with the
//! state advanced in place on candle's stream.

use super::{supports, GdnNormParams, Inputs, MAX_SIMDGROUPS};
use crate::backend::cuda::{
    config, cuda_device, cuda_source, launch, tensor, with_input_and_state_types, Element, Held,
    Kernel, KernelSource,
};
use crate::ops::gated_delta::cuda::HeldInputs;
use anyhow::{ensure, Result};
use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, PushKernelArg};
use candle_core::{CudaDevice, Tensor};

const OP: &str = "gated_delta_update_norm";
const SOURCE: KernelSource = cuda_source!("gated_delta_norm");

// SAFETY: `GdnNormParams` is `repr(C)` of eight u32 and one f32, as the kernel's struct.
unsafe impl DeviceRepr for GdnNormParams {}

pub(crate) fn gated_delta_update_norm(inputs: &Inputs) -> Result<Tensor> {
    let dev = cuda_device(inputs.state, OP)?;
    let (dtype, st) = (inputs.recurrence.q.dtype(), inputs.state.dtype());
    ensure!(
        supports(&inputs.dims, dtype, st),
        "{OP}: no CUDA kernel for {:?} with {dtype:?} activations and a {st:?} state",
        inputs.dims
    );
    with_input_and_state_types!(dtype, st, OP, |I, S| launch_as::<I, S>(inputs, &dev))
}

fn launch_as<I, S>(inputs: &Inputs, dev: &CudaDevice) -> Result<Tensor>
where
    I: Element,
    S: Element,
{
    let d = inputs.dims;
    let kernel = Kernel::typed(dev, &SOURCE, "gated_delta_norm", &[I::DTYPE, S::DTYPE], OP)?;
    let warps = inputs.simdgroups(32 * MAX_SIMDGROUPS)?;
    let params = inputs.params()?;
    // Contiguous copies where needed; the dtypes were checked (no conversion) and there is no
    // mask.
    let prepared = inputs.recurrence.prepare()?;
    let len = d.batch * d.steps * d.value_heads * d.value_dim;
    // SAFETY: the kernel writes every element of out.
    let out = unsafe { dev.alloc::<I>(len)? };
    if len > 0 {
        let held = HeldInputs::new(&prepared, inputs.state);
        let views = held.views::<I, S>(OP)?;
        let [z_held, w_held] = [inputs.z, inputs.weight].map(Held::new);
        // z may be a view: its row layout was checked by the caller.
        let z_view = z_held.rows::<I>(&inputs.z_rows, OP)?;
        let w_view = w_held.view::<I>(OP)?;
        let mut args = kernel.args();
        views.push_recurrence(&mut args);
        args.arg(&z_view).arg(&w_view).arg(&out).arg(&params);
        let heads = (d.batch * d.value_heads) as u32;
        let geometry = config((heads, 1, 1), (32, warps as u32, 1), 0);
        // SAFETY: arguments in the order and types of `gated_delta_norm_*` in
        // kernels/gated_delta_norm.cu; every view covers the elements the kernel indexes.
        unsafe { launch(args, geometry) }?;
    }
    Ok(tensor(
        out,
        dev,
        (d.batch, d.steps, d.value_heads, d.value_dim),
    ))
}
