//! CUDA host side of `attn_prep_slots_*` (kernels/attn_prep.cu): the table of each
//! sequence's KV buffers, position and capacity, uploaded on candle's stream, and the
//! per-sequence op's geometry over B rows.

use super::SlotInputs;
use crate::backend::cuda::{
    config, cuda_device, cuda_source, launch, slot_table, tensor, with_float_type, Element, HeldKv,
    Kernel, KernelSource,
};
use crate::ops::attn_prep::cuda::HeldInputs;
use anyhow::{ensure, Result};
use candle_core::cuda_backend::cudarc::driver::PushKernelArg;
use candle_core::{CudaDevice, Tensor};

const OP: &str = "attn_prep_slots";
const SOURCE: KernelSource = cuda_source!("attn_prep");

pub(crate) fn attn_prep_slots(inputs: &SlotInputs) -> Result<(Tensor, Tensor)> {
    let dev = cuda_device(inputs.qkv, OP)?;
    let n = inputs.rows.len();
    ensure!(n <= 65535, "{OP}: at most 65535 sequences per call");
    with_float_type!(inputs.qkv.dtype(), OP, |T| run::<T>(inputs, &dev))
}

fn run<T>(inputs: &SlotInputs, dev: &CudaDevice) -> Result<(Tensor, Tensor)>
where
    T: Element,
{
    let kernel = Kernel::typed(dev, &SOURCE, "attn_prep_slots", &[T::DTYPE], OP)?;
    let n = inputs.rows.len();
    let (d0, first) = &inputs.rows[0];
    let d = crate::ops::attn_prep::AttnPrepDims { batch: n, ..*d0 };
    let qkv = inputs.qkv.contiguous()?;
    let (q_norm, k_norm, inv_freq) = (
        first.q_norm.contiguous()?,
        first.k_norm.contiguous()?,
        first.inv_freq.contiguous()?,
    );
    let q_len = n * d.q_heads * d.head_dim;
    // SAFETY: the kernel writes every element of q and gate.
    let q = unsafe { dev.alloc::<T>(q_len)? };
    let gate = unsafe { dev.alloc::<T>(q_len)? };
    {
        // Every sequence's buffers and position stay read-locked until the launch is queued;
        // the kernel writes the buffers in place, ordered on candle's stream.
        let kv = HeldKv::new(inputs.rows.iter().map(|(_, r)| [r.keys, r.values, r.pos]));
        let mut table = Vec::with_capacity(4 * n);
        for ((rd, _), [k, v, p]) in inputs.rows.iter().zip(kv.addresses::<T>(dev, OP)?) {
            table.extend([k, v, p, rd.capacity as u64]);
        }
        let slots = slot_table(dev, &table)?;
        let held = HeldInputs::new([&qkv, &q_norm, &k_norm, &inv_freq]);
        let views = held.views::<T>(OP)?;
        let params = d.params(first.eps);
        let mut args = kernel.args();
        views.push(&mut args);
        args.arg(slots.as_ref()).arg(&q).arg(&gate).arg(&params);
        let heads = (d.q_heads + 2 * d.kv_heads) as u32;
        let geometry = config((heads, n as u32, 1), (32, 1, 1), 0);
        // SAFETY: arguments in the order and types of `attn_prep_slots_*` in
        // kernels/attn_prep.cu; each table entry addresses its sequence's whole contiguous
        // [1, Nkv, cap, Dh] buffers (cap its own, checked per row) and its [1] u32 position.
        unsafe { launch(args, geometry) }?;
    }
    Ok((
        tensor(q, dev, (n, d.q_heads, d.head_dim)),
        tensor(gate, dev, (n, d.q_heads * d.head_dim)),
    ))
}
