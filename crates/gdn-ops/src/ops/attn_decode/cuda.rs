//! CUDA host side of `kernels/attn_decode.cu`: a block of [`SIMDGROUPS`] warps per (query
//! head, sequence), or per (query head, sequence, key range) and a combine pass when the
//! context is split ([`AttnDecodeDims::splits`]).

use super::{AttnDecodeDims, AttnDecodeParams, Inputs, SIMDGROUPS};
use crate::backend::cuda::{
    cuda_device, function, launch, tensor, view, with_float_type, KernelSource,
};
use crate::backend::dtype_tag;
use anyhow::{ensure, Result};
use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::CudaDType;
use candle_core::{CudaDevice, Tensor, WithDType};

const OP: &str = "attn_decode";
const SOURCE: KernelSource = KernelSource {
    module: "qwen_gdn_attn_decode",
    ptx: include_str!(concat!(env!("OUT_DIR"), "/attn_decode.ptx")),
};

// SAFETY: `AttnDecodeParams` is `repr(C)` of seven u32 and an f32, as the kernel's struct.
unsafe impl DeviceRepr for AttnDecodeParams {}

pub(crate) fn attn_decode(d: AttnDecodeDims, inputs: &Inputs) -> Result<Tensor> {
    let dev = cuda_device(inputs.q, OP)?;
    ensure!(d.batch <= 65535, "{OP}: at most 65535 sequences per call");
    let (q, gate) = (inputs.q.contiguous()?, inputs.gate.contiguous()?);
    let inputs = [&q, &gate, inputs.keys, inputs.values, inputs.pos];
    with_float_type!(q.dtype(), OP, |T| run::<T>(d, inputs, &dev))
}

/// `inputs`: q, gate, keys, values, pos (contiguous).
fn run<T>(d: AttnDecodeDims, inputs: [&Tensor; 5], dev: &CudaDevice) -> Result<Tensor>
where
    T: CudaDType + DeviceRepr + WithDType,
{
    let tag = dtype_tag(T::DTYPE, OP)?;
    let len = d.batch * d.q_heads * d.head_dim;
    // SAFETY: the kernel (or the combine pass) writes every element of out.
    let out = unsafe { dev.alloc::<T>(len)? };
    let splits = d.splits();
    {
        let [q, gate, keys, values, pos] = inputs;
        let (qs, ql) = q.storage_and_layout();
        let (gs, gl) = gate.storage_and_layout();
        let (ks, kl) = keys.storage_and_layout();
        let (vs, vl) = values.storage_and_layout();
        let (ps, pl) = pos.storage_and_layout();
        let q_view = view::<T>(&qs, ql, OP)?;
        let g_view = view::<T>(&gs, gl, OP)?;
        let k_view = view::<T>(&ks, kl, OP)?;
        let v_view = view::<T>(&vs, vl, OP)?;
        let p_view = view::<u32>(&ps, pl, OP)?;
        // The kernel reads each lane's keys and values in 16- or 8-byte loads.
        for (name, layout) in [("keys", kl), ("values", vl)] {
            ensure!(
                (layout.start_offset() * std::mem::size_of::<T>()) % 16 == 0,
                "{OP}: {name} must start on a 16-byte boundary"
            );
        }
        let params = d.params(SIMDGROUPS, splits);
        let stream = dev.cuda_stream();
        let block = LaunchConfig {
            grid_dim: (d.q_heads as u32, d.batch as u32, splits as u32),
            block_dim: (32, SIMDGROUPS as u32, 1),
            shared_mem_bytes: d.scratch_bytes(SIMDGROUPS) as u32,
        };
        if splits == 1 {
            let func = function(dev, &SOURCE, &format!("attn_decode_{tag}"))?;
            let mut args = stream.launch_builder(&func);
            args.arg(&q_view)
                .arg(&g_view)
                .arg(&k_view)
                .arg(&v_view)
                .arg(&p_view)
                .arg(&out)
                .arg(&params);
            // SAFETY: arguments in the order and types of `attn_decode_*` in
            // kernels/attn_decode.cu; the views cover the shapes checked in
            // ops/attn_decode/mod.rs, and the shared memory holds SIMDGROUPS * (2 + Dh) floats.
            unsafe { launch(args, block) }?;
        } else {
            // SAFETY: the split pass writes every record (an empty range its neutral one).
            let partials = unsafe { dev.alloc::<f32>(d.partial_len(splits))? };
            let func = function(dev, &SOURCE, &format!("attn_decode_split_{tag}"))?;
            let mut args = stream.launch_builder(&func);
            args.arg(&q_view)
                .arg(&k_view)
                .arg(&v_view)
                .arg(&p_view)
                .arg(&partials)
                .arg(&params);
            // SAFETY: arguments of `attn_decode_split_*`; grid depth = params.splits, and
            // partials holds B·Nq·splits·(2 + Dh) floats.
            unsafe { launch(args, block) }?;
            let func = function(dev, &SOURCE, &format!("attn_decode_combine_{tag}"))?;
            let mut args = stream.launch_builder(&func);
            args.arg(&partials).arg(&g_view).arg(&out).arg(&params);
            let config = LaunchConfig {
                grid_dim: (d.q_heads as u32, d.batch as u32, 1),
                block_dim: (32, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: arguments of `attn_decode_combine_*`, reading the records written above
            // on the same stream.
            unsafe { launch(args, config) }?;
        }
    }
    Ok(tensor(out, dev, (d.batch, 1, d.q_heads * d.head_dim)))
}
