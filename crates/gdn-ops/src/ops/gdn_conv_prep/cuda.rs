//! CUDA host side of `kernels/gdn_conv_prep.cu`: binding and launch geometry, on candle's
//! stream (so the conv-state update, in place for a decode step, orders with candle's own
//! ops).

use super::{supports, ConvPrepOut, ConvPrepParams, Inputs};
use crate::backend::cuda::{
    config, cuda_device, cuda_source, launch, tensor, with_float_type, Element, Held, Kernel,
    KernelSource,
};
use anyhow::{ensure, Result};
use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, PushKernelArg};
use candle_core::CudaDevice;

const OP: &str = "gdn_conv_prep";
const SOURCE: KernelSource = cuda_source!("gdn_conv_prep");

// SAFETY: `ConvPrepParams` is `repr(C)` of thirteen u32 and three f32, as the kernel's struct.
unsafe impl DeviceRepr for ConvPrepParams {}

/// Warps (head slots) per block.
pub(crate) const SLOTS_PER_BLOCK: u32 = 4;

pub(crate) fn gdn_conv_prep(inputs: &Inputs) -> Result<ConvPrepOut> {
    let dev = cuda_device(inputs.conv_state, OP)?;
    let dtype = inputs.qkv.dtype();
    ensure!(
        supports(&inputs.dims, dtype),
        "{OP}: no CUDA kernel for {:?} in {dtype:?} (head dims multiples of 32 up to 256, 2 to 8 taps)",
        inputs.dims
    );
    ensure!(
        inputs.batch <= 65535 && inputs.tokens <= 65535,
        "{OP}: a batch of {} by {} tokens exceeds the CUDA grid (65535 each)",
        inputs.batch,
        inputs.tokens
    );
    with_float_type!(dtype, OP, |T| launch_as::<T>(inputs, &dev))
}

fn launch_as<T>(inputs: &Inputs, dev: &CudaDevice) -> Result<ConvPrepOut>
where
    T: Element,
{
    let kernel = Kernel::typed(dev, &SOURCE, "gdn_conv_prep", &[T::DTYPE], OP)?;
    let params = inputs.params()?;
    let d = inputs.dims;
    let (bn, s) = (inputs.batch, inputs.tokens);
    let rows = bn * s;
    let qk_len = rows * d.key_heads * d.key_dim;
    let gate_len = rows * d.value_heads;
    // SAFETY: the kernel writes every element of each output.
    let (q, k, v) = unsafe {
        (
            dev.alloc::<T>(qk_len)?,
            dev.alloc::<T>(qk_len)?,
            dev.alloc::<T>(rows * d.value_heads * d.value_dim)?,
        )
    };
    let (g, beta) = unsafe { (dev.alloc::<f32>(gate_len)?, dev.alloc::<f32>(gate_len)?) };
    // A decode step shifts the state in place (each element read, then written, by one
    // thread). A chunk's tokens all read the old state: the last token's blocks write the
    // new one to its own buffer. SAFETY: the last token's blocks write every element.
    let fresh_state = if s > 1 {
        Some(unsafe { dev.alloc::<T>(inputs.conv_state.elem_count())? })
    } else {
        None
    };
    {
        let [qkv, b, a, state, taps, dt_bias, neg_a_exp] = [
            inputs.qkv,
            inputs.b,
            inputs.a,
            inputs.conv_state,
            inputs.taps,
            inputs.dt_bias,
            inputs.neg_a_exp,
        ]
        .map(Held::new);
        // qkv, b and a may be views: their row layouts were checked by the caller.
        let qkv = qkv.rows::<T>(&inputs.qkv_rows, OP)?;
        let b = b.rows::<T>(&inputs.b_rows, OP)?;
        let a = a.rows::<T>(&inputs.a_rows, OP)?;
        let state = state.view::<T>(OP)?;
        let taps = taps.view::<T>(OP)?;
        let dt_bias = dt_bias.view::<f32>(OP)?;
        let neg_a_exp = neg_a_exp.view::<f32>(OP)?;
        let mut args = kernel.args();
        args.arg(&qkv).arg(&b).arg(&a).arg(&state);
        match &fresh_state {
            Some(next) => args.arg(next),
            None => args.arg(&state),
        };
        args.arg(&taps)
            .arg(&dt_bias)
            .arg(&neg_a_exp)
            .arg(&q)
            .arg(&k)
            .arg(&v)
            .arg(&g)
            .arg(&beta)
            .arg(&params);
        let slot_blocks = (d.slots() as u32).div_ceil(SLOTS_PER_BLOCK);
        let geometry = config(
            (slot_blocks, s as u32, bn as u32),
            (32, SLOTS_PER_BLOCK, 1),
            0,
        );
        // SAFETY: arguments in the order and types of `gdn_conv_prep_*` in
        // kernels/gdn_conv_prep.cu; every view covers the elements the kernel indexes.
        unsafe { launch(args, geometry) }?;
    }
    let qk_shape = (bn, s, d.key_heads, d.key_dim);
    Ok(ConvPrepOut {
        q: tensor(q, dev, qk_shape),
        k: tensor(k, dev, qk_shape),
        v: tensor(v, dev, (bn, s, d.value_heads, d.value_dim)),
        g: tensor(g, dev, (bn, s, d.value_heads)),
        beta: tensor(beta, dev, (bn, s, d.value_heads)),
        conv_state: match fresh_state {
            Some(next) => tensor(next, dev, inputs.conv_state.dims()),
            None => inputs.conv_state.clone(),
        },
    })
}
