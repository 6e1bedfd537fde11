//! CUDA host side of `gdn_conv_prep_slots_*` (kernels/gdn_conv_prep.cu): the table of the
//! conv states' device addresses, uploaded on candle's stream, and the per-sequence op's
//! geometry over B rows.

use super::{SlotInputs, SlotsOut};
use crate::backend::cuda::{
    config, cuda_device, cuda_source, launch, tensor, with_float_type, Element, Held, Kernel,
    KernelSource,
};
use crate::ops::gdn_conv_prep::cuda::SLOTS_PER_BLOCK;
use crate::ops::gdn_conv_prep::supports;
use anyhow::{ensure, Result};
use candle_core::cuda_backend::cudarc::driver::{DevicePtr, PushKernelArg};
use candle_core::CudaDevice;

const OP: &str = "gdn_conv_prep_slots";
const SOURCE: KernelSource = cuda_source!("gdn_conv_prep");

pub(crate) fn gdn_conv_prep_slots(inputs: &SlotInputs) -> Result<SlotsOut> {
    let batch = &inputs.batch;
    let dev = cuda_device(batch.conv_state, OP)?;
    let dtype = batch.qkv.dtype();
    ensure!(
        supports(&batch.dims, dtype),
        "{OP}: no CUDA kernel for {:?} in {dtype:?}",
        batch.dims
    );
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
    let qk_len = bn * d.key_heads * d.key_dim;
    let gate_len = bn * d.value_heads;
    // SAFETY: the kernel writes every element of each output.
    let (q, k, v) = unsafe {
        (
            dev.alloc::<T>(qk_len)?,
            dev.alloc::<T>(qk_len)?,
            dev.alloc::<T>(bn * d.value_heads * d.value_dim)?,
        )
    };
    let (g, beta) = unsafe { (dev.alloc::<f32>(gate_len)?, dev.alloc::<f32>(gate_len)?) };
    {
        // The states stay read-locked until the launch is queued; each is shifted in place
        // (every element read, then written, by one thread), ordered on candle's stream.
        let held: Vec<Held> = inputs.conv_states.iter().map(Held::new).collect();
        let views = held
            .iter()
            .map(|h| h.view::<T>(OP))
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
        let [qkv, b, a, taps, dt_bias, neg_a_exp] = [
            batch.qkv,
            batch.b,
            batch.a,
            batch.taps,
            batch.dt_bias,
            batch.neg_a_exp,
        ]
        .map(Held::new);
        let qkv = qkv.rows::<T>(&batch.qkv_rows, OP)?;
        let b = b.rows::<T>(&batch.b_rows, OP)?;
        let a = a.rows::<T>(&batch.a_rows, OP)?;
        let taps = taps.view::<T>(OP)?;
        let dt_bias = dt_bias.view::<f32>(OP)?;
        let neg_a_exp = neg_a_exp.view::<f32>(OP)?;
        let mut args = kernel.args();
        args.arg(&qkv)
            .arg(&b)
            .arg(&a)
            .arg(&slots)
            .arg(&taps)
            .arg(&dt_bias)
            .arg(&neg_a_exp)
            .arg(&q)
            .arg(&k)
            .arg(&v)
            .arg(&g)
            .arg(&beta)
            .arg(&params);
        let slot_blocks = (d.slots() as u32).div_ceil(SLOTS_PER_BLOCK);
        let geometry = config((slot_blocks, 1, bn as u32), (32, SLOTS_PER_BLOCK, 1), 0);
        // SAFETY: arguments in the order and types of `gdn_conv_prep_slots_*` in
        // kernels/gdn_conv_prep.cu; slots[b] addresses sequence b's whole contiguous
        // [1, K-1, C] conv state; every other view covers the elements the kernel indexes.
        unsafe { launch(args, geometry) }?;
    }
    let qk_shape = (bn, 1, d.key_heads, d.key_dim);
    Ok(SlotsOut {
        q: tensor(q, dev, qk_shape),
        k: tensor(k, dev, qk_shape),
        v: tensor(v, dev, (bn, 1, d.value_heads, d.value_dim)),
        g: tensor(g, dev, (bn, 1, d.value_heads)),
        beta: tensor(beta, dev, (bn, 1, d.value_heads)),
    })
}
