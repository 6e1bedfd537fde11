//! CUDA host side of `kernels/gdn_conv_prep.cu`: binding and launch geometry, on candle's
//! stream (so the conv-state update, in place for a decode step, orders with candle's own
//! ops).

use super::{supports, ConvPrepOut, ConvPrepParams, Inputs};
use crate::backend::cuda::{
    cuda_device, function, launch, rows_view, tensor, view, with_float_type, KernelSource,
};
use crate::backend::dtype_tag;
use anyhow::{ensure, Result};
use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::CudaDType;
use candle_core::{CudaDevice, WithDType};

const OP: &str = "gdn_conv_prep";
const SOURCE: KernelSource = KernelSource {
    module: "qwen_gdn_gdn_conv_prep",
    ptx: include_str!(concat!(env!("OUT_DIR"), "/gdn_conv_prep.ptx")),
};

// SAFETY: `ConvPrepParams` is `repr(C)` of thirteen u32 and three f32, as the kernel's struct.
unsafe impl DeviceRepr for ConvPrepParams {}

/// Warps (head slots) per block.
const SLOTS_PER_BLOCK: u32 = 4;

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
    T: CudaDType + DeviceRepr + WithDType,
{
    let func = function(
        dev,
        &SOURCE,
        &format!("gdn_conv_prep_{}", dtype_tag(T::DTYPE, OP)?),
    )?;
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
        let (qkv_s, _) = inputs.qkv.storage_and_layout();
        let (b_s, _) = inputs.b.storage_and_layout();
        let (a_s, _) = inputs.a.storage_and_layout();
        let (st_s, st_l) = inputs.conv_state.storage_and_layout();
        let (taps_s, taps_l) = inputs.taps.storage_and_layout();
        let (dt_s, dt_l) = inputs.dt_bias.storage_and_layout();
        let (na_s, na_l) = inputs.neg_a_exp.storage_and_layout();
        // qkv, b and a may be views: their row layouts were checked by the caller.
        let qkv = rows_view::<T>(&qkv_s, &inputs.qkv_rows, OP)?;
        let b = rows_view::<T>(&b_s, &inputs.b_rows, OP)?;
        let a = rows_view::<T>(&a_s, &inputs.a_rows, OP)?;
        let state = view::<T>(&st_s, st_l, OP)?;
        let taps = view::<T>(&taps_s, taps_l, OP)?;
        let dt_bias = view::<f32>(&dt_s, dt_l, OP)?;
        let neg_a_exp = view::<f32>(&na_s, na_l, OP)?;
        let stream = dev.cuda_stream();
        let mut args = stream.launch_builder(&func);
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
        let config = LaunchConfig {
            grid_dim: (
                (d.slots() as u32).div_ceil(SLOTS_PER_BLOCK),
                s as u32,
                bn as u32,
            ),
            block_dim: (32, SLOTS_PER_BLOCK, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: arguments in the order and types of `gdn_conv_prep_*` in
        // kernels/gdn_conv_prep.cu; every view covers the elements the kernel indexes.
        unsafe { launch(args, config) }?;
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
