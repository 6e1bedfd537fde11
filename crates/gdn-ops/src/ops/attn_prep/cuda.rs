//! CUDA host side of `kernels/attn_prep.cu`: one warp per head task.

use super::{AttnPrepDims, AttnPrepParams, Inputs};
use crate::backend::cuda::{
    cuda_device, function, launch, tensor, view, with_float_type, KernelSource,
};
use crate::backend::dtype_tag;
use anyhow::{ensure, Result};
use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::CudaDType;
use candle_core::{CudaDevice, Tensor, WithDType};

const OP: &str = "attn_prep";
const SOURCE: KernelSource = KernelSource {
    module: "qwen_gdn_attn_prep",
    ptx: include_str!(concat!(env!("OUT_DIR"), "/attn_prep.ptx")),
};

// SAFETY: `AttnPrepParams` is `repr(C)` of six u32 and an f32, as the kernel's struct.
unsafe impl DeviceRepr for AttnPrepParams {}

pub(crate) fn attn_prep(d: AttnPrepDims, inputs: &Inputs) -> Result<(Tensor, Tensor)> {
    let dev = cuda_device(inputs.qkv, OP)?;
    ensure!(d.batch <= 65535, "{OP}: at most 65535 sequences per call");
    let qkv = inputs.qkv.contiguous()?;
    let (q_norm, k_norm, inv_freq) = (
        inputs.q_norm.contiguous()?,
        inputs.k_norm.contiguous()?,
        inputs.inv_freq.contiguous()?,
    );
    let eps = inputs.eps;
    let inputs = [
        &qkv,
        &q_norm,
        &k_norm,
        &inv_freq,
        inputs.pos,
        inputs.keys,
        inputs.values,
    ];
    with_float_type!(qkv.dtype(), OP, |T| run::<T>(d, eps, inputs, &dev))
}

/// `inputs`: qkv, q_norm, k_norm, inv_freq, pos, keys, values (contiguous).
fn run<T>(
    d: AttnPrepDims,
    eps: f32,
    inputs: [&Tensor; 7],
    dev: &CudaDevice,
) -> Result<(Tensor, Tensor)>
where
    T: CudaDType + DeviceRepr + WithDType,
{
    let func = function(
        dev,
        &SOURCE,
        &format!("attn_prep_{}", dtype_tag(T::DTYPE, OP)?),
    )?;
    let q_len = d.batch * d.q_heads * d.head_dim;
    // SAFETY: the kernel writes every element of q and gate.
    let q = unsafe { dev.alloc::<T>(q_len)? };
    let gate = unsafe { dev.alloc::<T>(q_len)? };
    {
        let [qkv, q_norm, k_norm, inv_freq, pos, keys, values] = inputs;
        let (xs, xl) = qkv.storage_and_layout();
        let (qns, qnl) = q_norm.storage_and_layout();
        let (kns, knl) = k_norm.storage_and_layout();
        let (fs, fl) = inv_freq.storage_and_layout();
        let (ps, pl) = pos.storage_and_layout();
        let (ks, kl) = keys.storage_and_layout();
        let (vs, vl) = values.storage_and_layout();
        let x_view = view::<T>(&xs, xl, OP)?;
        let qn_view = view::<T>(&qns, qnl, OP)?;
        let kn_view = view::<T>(&kns, knl, OP)?;
        let f_view = view::<f32>(&fs, fl, OP)?;
        let p_view = view::<u32>(&ps, pl, OP)?;
        // Written in place through these views; candle's single stream orders the writes
        // after earlier readers of the buffers.
        let k_view = view::<T>(&ks, kl, OP)?;
        let v_view = view::<T>(&vs, vl, OP)?;
        let params = d.params(eps);
        let stream = dev.cuda_stream();
        let mut args = stream.launch_builder(&func);
        args.arg(&x_view)
            .arg(&qn_view)
            .arg(&kn_view)
            .arg(&f_view)
            .arg(&p_view)
            .arg(&k_view)
            .arg(&v_view)
            .arg(&q)
            .arg(&gate)
            .arg(&params);
        let config = LaunchConfig {
            grid_dim: ((d.q_heads + 2 * d.kv_heads) as u32, d.batch as u32, 1),
            block_dim: (32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: arguments in the order and types of `attn_prep_*` in kernels/attn_prep.cu;
        // the views cover the shapes checked in ops/attn_prep/mod.rs.
        unsafe { launch(args, config) }?;
    }
    Ok((
        tensor(q, dev, (d.batch, d.q_heads, d.head_dim)),
        tensor(gate, dev, (d.batch, d.q_heads * d.head_dim)),
    ))
}
