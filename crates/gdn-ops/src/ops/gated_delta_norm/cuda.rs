//! CUDA host side of `kernels/gated_delta_norm.cu`: binding and launch geometry, with the
//! state advanced in place on candle's stream.

use super::{supports, GdnNormParams, Inputs, MAX_SIMDGROUPS};
use crate::backend::cuda::{cuda_device, function, launch, rows_view, tensor, view, KernelSource};
use crate::backend::dtype_tag;
use anyhow::{bail, ensure, Result};
use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::CudaDType;
use candle_core::{CudaDevice, DType, Tensor, WithDType};
use half::{bf16, f16};

const OP: &str = "gated_delta_update_norm";
const SOURCE: KernelSource = KernelSource {
    module: "qwen_gdn_gated_delta_norm",
    ptx: include_str!(concat!(env!("OUT_DIR"), "/gated_delta_norm.ptx")),
};

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
    match (dtype, st) {
        (DType::F32, DType::F32) => launch_as::<f32, f32>(inputs, &dev),
        (DType::F32, DType::BF16) => launch_as::<f32, bf16>(inputs, &dev),
        (DType::F16, DType::F32) => launch_as::<f16, f32>(inputs, &dev),
        (DType::F16, DType::BF16) => launch_as::<f16, bf16>(inputs, &dev),
        (DType::BF16, DType::F32) => launch_as::<bf16, f32>(inputs, &dev),
        (DType::BF16, DType::BF16) => launch_as::<bf16, bf16>(inputs, &dev),
        (i, s) => bail!("{OP}: no CUDA kernel for activations {i:?} with a {s:?} state"),
    }
}

fn launch_as<I, S>(inputs: &Inputs, dev: &CudaDevice) -> Result<Tensor>
where
    I: CudaDType + DeviceRepr + WithDType,
    S: CudaDType + DeviceRepr + WithDType,
{
    let d = inputs.dims;
    let name = format!(
        "gated_delta_norm_{}_{}",
        dtype_tag(I::DTYPE, OP)?,
        dtype_tag(S::DTYPE, OP)?
    );
    let func = function(dev, &SOURCE, &name)?;
    let warps = inputs.simdgroups(32 * MAX_SIMDGROUPS)?;
    let params = inputs.params()?;
    let r = &inputs.recurrence;
    let (q, k, v, g, beta) = (
        r.q.contiguous()?,
        r.k.contiguous()?,
        r.v.contiguous()?,
        r.g.contiguous()?,
        r.beta.contiguous()?,
    );
    let len = d.batch * d.steps * d.value_heads * d.value_dim;
    // SAFETY: the kernel writes every element of out.
    let out = unsafe { dev.alloc::<I>(len)? };
    if len > 0 {
        let (qs, ql) = q.storage_and_layout();
        let (ks, kl) = k.storage_and_layout();
        let (vs, vl) = v.storage_and_layout();
        let (gs, gl) = g.storage_and_layout();
        let (bs, bl) = beta.storage_and_layout();
        let (ss, sl) = inputs.state.storage_and_layout();
        let (zs, _) = inputs.z.storage_and_layout();
        let (ws, wl) = inputs.weight.storage_and_layout();
        let q_view = view::<I>(&qs, ql, OP)?;
        let k_view = view::<I>(&ks, kl, OP)?;
        let v_view = view::<I>(&vs, vl, OP)?;
        let g_view = view::<f32>(&gs, gl, OP)?;
        let beta_view = view::<f32>(&bs, bl, OP)?;
        // Written in place: each state row by one warp, read once and written once.
        let state_view = view::<S>(&ss, sl, OP)?;
        // z may be a view: its row layout was checked by the caller.
        let z_view = rows_view::<I>(&zs, &inputs.z_rows, OP)?;
        let w_view = view::<I>(&ws, wl, OP)?;
        let stream = dev.cuda_stream();
        let mut args = stream.launch_builder(&func);
        args.arg(&q_view)
            .arg(&k_view)
            .arg(&v_view)
            .arg(&g_view)
            .arg(&beta_view)
            .arg(&state_view)
            .arg(&z_view)
            .arg(&w_view)
            .arg(&out)
            .arg(&params);
        let config = LaunchConfig {
            grid_dim: ((d.batch * d.value_heads) as u32, 1, 1),
            block_dim: (32, warps as u32, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: arguments in the order and types of `gated_delta_norm_*` in
        // kernels/gated_delta_norm.cu; every view covers the elements the kernel indexes.
        unsafe { launch(args, config) }?;
    }
    Ok(tensor(
        out,
        dev,
        (d.batch, d.steps, d.value_heads, d.value_dim),
    ))
}
