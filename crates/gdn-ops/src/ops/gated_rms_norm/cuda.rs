//! CUDA host side of `kernels/gated_rms_norm.cu`: binding and launch geometry, on candle's
//! stream.

use super::{GatedRmsNormParams, Inputs};
use crate::backend::cuda::{
    config, cuda_device, cuda_source, launch, tensor, with_float_type, Element, Held, Kernel,
    KernelSource,
};
use anyhow::{ensure, Result};
use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, PushKernelArg};
use candle_core::{CudaDevice, Tensor};

const OP: &str = "gated_rms_norm";
const SOURCE: KernelSource = cuda_source!("gated_rms_norm");

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
    T: Element,
{
    let kernel = Kernel::typed(dev, &SOURCE, "gated_rms_norm", &[T::DTYPE], OP)?;
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
        let [y_held, z_held, w_held] = [inputs.y, inputs.z, inputs.weight].map(Held::new);
        let y = y_held.view::<T>(OP)?;
        // z may be a view: its row layout was checked by the caller.
        let z = z_held.rows::<T>(&inputs.z_rows, OP)?;
        let weight = w_held.view::<T>(OP)?;
        let mut args = kernel.args();
        args.arg(&y).arg(&z).arg(&weight).arg(&out).arg(&params);
        let geometry = config((blocks as u32, 1, 1), (32, ROWS_PER_BLOCK, 1), 0);
        // SAFETY: arguments in the order and types of `gated_rms_norm_*` in
        // kernels/gated_rms_norm.cu; every view covers the elements the kernel indexes.
        unsafe { launch(args, geometry) }?;
    }
    Ok(tensor(out, dev, inputs.y.dims()))
}
