//! CUDA host side of `kernels/add_rms_norm.cu`: one warp per row, four rows per block.

use super::{row_threads, AddRmsNormParams, Inputs, PER_THREAD};
use crate::backend::cuda::{
    config, cuda_device, cuda_source, launch, tensor, view_or, with_float_type, Element, Held,
    Kernel, KernelSource,
};
use anyhow::{ensure, Result};
use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, PushKernelArg};
use candle_core::{CudaDevice, Tensor};

const OP: &str = "add_rms_norm";
const SOURCE: KernelSource = cuda_source!("add_rms_norm");
// SAFETY: `AddRmsNormParams` is `repr(C)` of three u32 and an f32, as the kernel's struct.
unsafe impl DeviceRepr for AddRmsNormParams {}

pub(crate) fn add_rms_norm(inputs: &Inputs) -> Result<(Tensor, Tensor)> {
    let dev = cuda_device(inputs.residual, OP)?;
    let residual = inputs.residual.contiguous()?;
    let delta = inputs.delta.map(|d| d.contiguous()).transpose()?;
    let weight = inputs.weight.contiguous()?;
    let contiguous = Inputs {
        residual: &residual,
        delta: delta.as_ref(),
        weight: &weight,
        ..*inputs
    };
    with_float_type!(residual.dtype(), OP, |T| run::<T>(&contiguous, &dev))
}

/// `inputs`: contiguous.
fn run<T: Element>(inputs: &Inputs, dev: &CudaDevice) -> Result<(Tensor, Tensor)> {
    let Inputs {
        residual,
        delta,
        weight,
        cols,
        ..
    } = *inputs;
    let rows = inputs.rows();
    let kernel = Kernel::typed(dev, &SOURCE, "add_rms_norm", &[T::DTYPE], OP)?;
    let len = rows * cols;
    // SAFETY: the kernel writes every element of normed, and of sum when there is a delta.
    let normed = unsafe { dev.alloc::<T>(len)? };
    let sum = match delta {
        Some(_) => Some(unsafe { dev.alloc::<T>(len)? }),
        None => None,
    };
    {
        let (r_held, w_held) = (Held::new(residual), Held::new(weight));
        let d_held = delta.map(Held::new);
        let r_view = r_held.view::<T>(OP)?;
        let w_view = w_held.view::<T>(OP)?;
        // Never read without a delta (has_delta = 0).
        let d_view = view_or::<T>(&d_held, &r_held, OP)?;
        let params = inputs.params();
        let mut args = kernel.args();
        args.arg(&r_view).arg(&d_view).arg(&w_view);
        // Never written without a delta: normed fills the slot.
        match &sum {
            Some(s) => args.arg(s),
            None => args.arg(&normed),
        };
        args.arg(&normed).arg(&params);
        ensure!(
            cols <= PER_THREAD * 1024,
            "{OP}: {cols} columns exceed the kernel's {}",
            PER_THREAD * 1024
        );
        let geometry = config((rows as u32, 1, 1), (row_threads(cols) as u32, 1, 1), 0);
        // SAFETY: arguments in the order and types of `add_rms_norm_*` in
        // kernels/add_rms_norm.cu; every view holds rows × cols elements (weight: cols).
        unsafe { launch(args, geometry) }?;
    }
    let shape = residual.shape().clone();
    let normed = tensor(normed, dev, shape.clone());
    let sum = match sum {
        Some(s) => tensor(s, dev, shape),
        None => residual.clone(),
    };
    Ok((sum, normed))
}
