//! CUDA host side of `kernels/gated_rms_norm.cu`: binding and launch geometry, on candle's
//! stream.

use super::{GatedRmsNormParams, Inputs};
use crate::backend::cuda::{
    cuda_device, function, launch, rows_view, tensor, view, with_float_type, KernelSource,
};
use crate::backend::dtype_tag;
use anyhow::{ensure, Result};
use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::CudaDType;
use candle_core::{CudaDevice, Tensor, WithDType};

const OP: &str = "gated_rms_norm";
const SOURCE: KernelSource = KernelSource {
    module: "qwen_gdn_gated_rms_norm",
    ptx: include_str!(concat!(env!("OUT_DIR"), "/gated_rms_norm.ptx")),
};

// SAFETY: `GatedRmsNormParams` is `repr(C)` of six u32 and one f32, as the kernel's struct.
unsafe impl DeviceRepr for GatedRmsNormParams {}

/// Warps (rows) per block.
const ROWS_PER_BLOCK: u32 = 4;

pub(crate) fn gated_rms_norm(inputs: &Inputs) -> Result<Tensor> {
    let dev = cuda_device(inputs.y, OP)?;
    with_float_type!(inputs.y.dtype(), OP, |T| launch_as::<T>(inputs, &dev))
}

fn launch_as<T>(inputs: &Inputs, dev: &CudaDevice) -> Result<Tensor>
where
    T: CudaDType + DeviceRepr + WithDType,
{
    let func = function(
        dev,
        &SOURCE,
        &format!("gated_rms_norm_{}", dtype_tag(T::DTYPE, OP)?),
    )?;
    let params = inputs.params()?;
    let blocks = inputs.rows().div_ceil(ROWS_PER_BLOCK as usize);
    ensure!(
        blocks <= i32::MAX as usize,
        "{OP}: {} rows exceed the CUDA grid",
        inputs.rows()
    );
    let len = inputs.y.elem_count();
    // SAFETY: the kernel writes every element of out.
    let out = unsafe { dev.alloc::<T>(len)? };
    if len > 0 {
        let (y_s, y_l) = inputs.y.storage_and_layout();
        let (z_s, _) = inputs.z.storage_and_layout();
        let (w_s, w_l) = inputs.weight.storage_and_layout();
        let y = view::<T>(&y_s, y_l, OP)?;
        // z may be a view: its row layout was checked by the caller.
        let z = rows_view::<T>(&z_s, &inputs.z_rows, OP)?;
        let weight = view::<T>(&w_s, w_l, OP)?;
        let stream = dev.cuda_stream();
        let mut args = stream.launch_builder(&func);
        args.arg(&y).arg(&z).arg(&weight).arg(&out).arg(&params);
        let config = LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: (32, ROWS_PER_BLOCK, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: arguments in the order and types of `gated_rms_norm_*` in
        // kernels/gated_rms_norm.cu; every view covers the elements the kernel indexes.
        unsafe { launch(args, config) }?;
    }
    Ok(tensor(out, dev, inputs.y.dims()))
}
