//! CUDA host side of `kernels/add_rms_norm.cu`: one warp per row, four rows per block.

use super::{row_threads, AddRmsNormParams, PER_THREAD};
use crate::backend::cuda::{
    cuda_device, function, launch, tensor, view, with_float_type, KernelSource,
};
use crate::backend::dtype_tag;
use anyhow::{ensure, Result};
use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::CudaDType;
use candle_core::{CudaDevice, Tensor, WithDType};

const OP: &str = "add_rms_norm";
const SOURCE: KernelSource = KernelSource {
    module: "qwen_gdn_add_rms_norm",
    ptx: include_str!(concat!(env!("OUT_DIR"), "/add_rms_norm.ptx")),
};
/// Rows (warps) per block.

// SAFETY: `AddRmsNormParams` is `repr(C)` of three u32 and an f32, as the kernel's struct.
unsafe impl DeviceRepr for AddRmsNormParams {}

pub(crate) fn add_rms_norm(
    residual: &Tensor,
    delta: Option<&Tensor>,
    weight: &Tensor,
    eps: f32,
    rows: usize,
    cols: usize,
) -> Result<(Tensor, Tensor)> {
    let dev = cuda_device(residual, OP)?;
    let residual = residual.contiguous()?;
    let delta = delta.map(|d| d.contiguous()).transpose()?;
    let weight = weight.contiguous()?;
    with_float_type!(residual.dtype(), OP, |T| run::<T>(
        &residual,
        delta.as_ref(),
        &weight,
        eps,
        rows,
        cols,
        &dev
    ))
}

fn run<T>(
    residual: &Tensor,
    delta: Option<&Tensor>,
    weight: &Tensor,
    eps: f32,
    rows: usize,
    cols: usize,
    dev: &CudaDevice,
) -> Result<(Tensor, Tensor)>
where
    T: CudaDType + DeviceRepr + WithDType,
{
    let func = function(
        dev,
        &SOURCE,
        &format!("add_rms_norm_{}", dtype_tag(T::DTYPE, OP)?),
    )?;
    let len = rows * cols;
    // SAFETY: the kernel writes every element of normed, and of sum when there is a delta.
    let normed = unsafe { dev.alloc::<T>(len)? };
    let sum = match delta {
        Some(_) => Some(unsafe { dev.alloc::<T>(len)? }),
        None => None,
    };
    {
        let (rs, rl) = residual.storage_and_layout();
        let (ws, wl) = weight.storage_and_layout();
        let r_view = view::<T>(&rs, rl, OP)?;
        let w_view = view::<T>(&ws, wl, OP)?;
        let delta_guard = delta.map(|d| d.storage_and_layout());
        let d_view = match &delta_guard {
            Some((ds, dl)) => view::<T>(ds, dl, OP)?,
            // Never read without a delta (has_delta = 0).
            None => view::<T>(&rs, rl, OP)?,
        };
        let params = AddRmsNormParams {
            rows: rows as u32,
            cols: cols as u32,
            has_delta: delta.is_some() as u32,
            eps,
        };
        let stream = dev.cuda_stream();
        let mut args = stream.launch_builder(&func);
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
        let config = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (row_threads(cols) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: arguments in the order and types of `add_rms_norm_*` in
        // kernels/add_rms_norm.cu; every view holds rows × cols elements (weight: cols).
        unsafe { launch(args, config) }?;
    }
    let shape = residual.shape().clone();
    let normed = tensor(normed, dev, shape.clone());
    let sum = match sum {
        Some(s) => tensor(s, dev, shape),
        None => residual.clone(),
    };
    Ok((sum, normed))
}
