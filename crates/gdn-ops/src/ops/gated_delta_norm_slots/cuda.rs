//! CUDA host side of `gated_delta_norm_slots_*` (kernels/gated_delta_norm.cu): the table of
//! the states' device addresses, uploaded on candle's stream, and the per-sequence op's
//! launch geometry over B sequences.

use super::SlotInputs;
use crate::backend::cuda::{
    config, cuda_device, cuda_source, launch, tensor, with_input_and_state_types, Element, Held,
    Kernel, KernelSource,
};
use crate::ops::gated_delta_norm::cuda::Split;
use crate::ops::gated_delta_norm::supports;
use anyhow::{ensure, Result};
use candle_core::cuda_backend::cudarc::driver::{DevicePtr, PushKernelArg};
use candle_core::{CudaDevice, Tensor};

const OP: &str = "gated_delta_update_norm_slots";
const SOURCE: KernelSource = cuda_source!("gated_delta_norm");

pub(crate) fn gated_delta_update_norm_slots(inputs: &SlotInputs) -> Result<Tensor> {
    let batch = &inputs.batch;
    let dev = cuda_device(batch.state, OP)?;
    let (dtype, st) = (batch.recurrence.q.dtype(), batch.state.dtype());
    ensure!(
        supports(&inputs.dims, dtype, st),
        "{OP}: no CUDA kernel for {:?} with {dtype:?} activations and a {st:?} state",
        inputs.dims
    );
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
        let held: Vec<Held> = inputs.states.iter().map(Held::new).collect();
        let views = held
            .iter()
            .map(|h| h.view::<S>(OP))
            .collect::<Result<Vec<_>>>()?;
        let stream = dev.cuda_stream();
        let addresses: Vec<u64> = views
            .iter()
            .map(|v| {
                let (ptr, _sync) = v.device_ptr(&stream);
                ptr
            })
            .collect();
        let slots = dev.clone_htod(addresses.as_slice())?;
        let [q, k, v, g, beta] = [
            &prepared.q,
            &prepared.k,
            &prepared.v,
            &prepared.g,
            &prepared.beta,
        ]
        .map(Held::new);
        let (q, k, v) = (q.view::<I>(OP)?, k.view::<I>(OP)?, v.view::<I>(OP)?);
        let (g, beta) = (g.view::<f32>(OP)?, beta.view::<f32>(OP)?);
        let [z_held, w_held] = [batch.z, batch.weight].map(Held::new);
        let z = z_held.rows::<I>(&batch.z_rows, OP)?;
        let w = w_held.view::<I>(OP)?;
        let mut args = kernel.args();
        args.arg(&q)
            .arg(&k)
            .arg(&v)
            .arg(&g)
            .arg(&beta)
            .arg(&slots)
            .arg(&z)
            .arg(&w)
            .arg(&out)
            .arg(&params);
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
