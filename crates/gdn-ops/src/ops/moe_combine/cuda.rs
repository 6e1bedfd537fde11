//! CUDA host side of `kernels/moe_combine.cu`: one block per token row.

use super::{combine_threads, Inputs, MoeCombineParams};
use crate::backend::cuda::{
    cuda_device, function, launch, tensor, view, with_float_type, KernelSource,
};
use crate::backend::dtype_tag;
use anyhow::{ensure, Result};
use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::CudaDType;
use candle_core::{Tensor, WithDType};

const SOURCE: KernelSource = KernelSource {
    module: "qwen_gdn_moe_combine",
    ptx: include_str!(concat!(env!("OUT_DIR"), "/moe_combine.ptx")),
};

// SAFETY: `MoeCombineParams` is `repr(C)` of u32 and f32 fields, as the kernel's struct.
unsafe impl DeviceRepr for MoeCombineParams {}

pub(crate) fn moe_combine(
    inputs: &Inputs,
    p: &MoeCombineParams,
) -> Result<(Tensor, Option<Tensor>)> {
    with_float_type!(inputs.down.dtype(), "moe_combine", |T| moe_combine_as::<T>(
        inputs, p
    ))
}

fn moe_combine_as<T: CudaDType + DeviceRepr + WithDType>(
    inputs: &Inputs,
    p: &MoeCombineParams,
) -> Result<(Tensor, Option<Tensor>)> {
    const OP: &str = "moe_combine";
    let dev = cuda_device(&inputs.down, OP)?;
    let name = format!("moe_combine_{}", dtype_tag(T::DTYPE, OP)?);
    let func = function(&dev, &SOURCE, &name)?;
    let (tokens, hidden) = (p.tokens as usize, p.hidden as usize);
    ensure!(
        p.tokens <= i32::MAX as u32,
        "{OP}: {tokens} tokens exceed the CUDA grid"
    );
    // SAFETY: the kernel writes every element of sum, and of normed when has_norm.
    let sum = unsafe { dev.alloc::<T>(tokens * hidden)? };
    let normed = match inputs.norm_weight {
        Some(_) => Some(unsafe { dev.alloc::<T>(tokens * hidden)? }),
        None => None,
    };
    if tokens > 0 {
        let (ds, dl) = inputs.down.storage_and_layout();
        let (ws, wl) = inputs.weights.storage_and_layout();
        let rows_guard = inputs.rows.as_ref().map(|t| t.storage_and_layout());
        let residual_guard = inputs.residual.as_ref().map(|t| t.storage_and_layout());
        let norm_guard = inputs.norm_weight.as_ref().map(|t| t.storage_and_layout());
        let down = view::<T>(&ds, dl, OP)?;
        let weights = view::<f32>(&ws, wl, OP)?;
        // The buffers a call does not use are never read: `down` stands in, and a null
        // pointer for the rows (no u32 buffer is at hand).
        let rows = rows_guard
            .as_ref()
            .map(|(s, l)| view::<u32>(s, l, OP))
            .transpose()?;
        let no_rows: u64 = 0;
        let residual = match &residual_guard {
            Some((s, l)) => view::<T>(s, l, OP)?,
            None => view::<T>(&ds, dl, OP)?,
        };
        let norm_weight = match &norm_guard {
            Some((s, l)) => view::<T>(s, l, OP)?,
            None => view::<T>(&ds, dl, OP)?,
        };
        let stream = dev.cuda_stream();
        let mut args = stream.launch_builder(&func);
        args.arg(&down);
        match &rows {
            Some(r) => args.arg(r),
            None => args.arg(&no_rows),
        };
        args.arg(&weights)
            .arg(&residual)
            .arg(&norm_weight)
            .arg(&sum);
        // Never written without a norm (has_norm = 0).
        match &normed {
            Some(n) => args.arg(n),
            None => args.arg(&sum),
        };
        args.arg(p);
        let config = LaunchConfig {
            grid_dim: (p.tokens, 1, 1),
            block_dim: (combine_threads(hidden) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: arguments in the order and types of `moe_combine_*` in
        // kernels/moe_combine.cu; every view covers the elements the kernel indexes: down
        // [N, S, H] (gathered: [down_rows, H], each row index checked against down_rows in
        // the kernel), rows [N, S] when gathered, weights [N, S], residual [N, H] when
        // has_residual, norm_weight [H] when has_norm.
        unsafe { launch(args, config) }?;
    }
    Ok((
        tensor(sum, &dev, (tokens, hidden)),
        normed.map(|n| tensor(n, &dev, (tokens, hidden))),
    ))
}
