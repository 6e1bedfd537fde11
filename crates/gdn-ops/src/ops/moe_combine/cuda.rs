//! CUDA host side of `kernels/moe_combine.cu`: one block per token row.

use super::{combine_threads, Inputs, MoeCombineParams};
use crate::backend::cuda::{
    config, cuda_device, cuda_source, launch, tensor, view_or, with_float_type, Element, Held,
    Kernel, KernelSource,
};
use anyhow::{ensure, Result};
use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, PushKernelArg};
use candle_core::Tensor;

const SOURCE: KernelSource = cuda_source!("moe_combine");

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

fn moe_combine_as<T: Element>(
    inputs: &Inputs,
    p: &MoeCombineParams,
) -> Result<(Tensor, Option<Tensor>)> {
    const OP: &str = "moe_combine";
    let dev = cuda_device(&inputs.down, OP)?;
    let kernel = Kernel::typed(&dev, &SOURCE, "moe_combine", &[T::DTYPE], OP)?;
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
        let [down_held, weights_held] = [&inputs.down, &inputs.weights].map(Held::new);
        let [rows_held, residual_held, norm_held] =
            [&inputs.rows, &inputs.residual, &inputs.norm_weight]
                .map(|t| t.as_ref().map(Held::new));
        let down = down_held.view::<T>(OP)?;
        let weights = weights_held.view::<f32>(OP)?;
        // The buffers a call does not use are never read: `down` stands in, and a null
        // pointer for the rows (no u32 buffer is at hand).
        let rows = rows_held
            .as_ref()
            .map(|held| held.view::<u32>(OP))
            .transpose()?;
        let no_rows: u64 = 0;
        let residual = view_or::<T>(&residual_held, &down_held, OP)?;
        let norm_weight = view_or::<T>(&norm_held, &down_held, OP)?;
        let mut args = kernel.args();
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
        let geometry = config((p.tokens, 1, 1), (combine_threads(hidden) as u32, 1, 1), 0);
        // SAFETY: arguments in the order and types of `moe_combine_*` in
        // kernels/moe_combine.cu; every view covers the elements the kernel indexes: down
        // [N, S, H] (gathered: [down_rows, H], each row index checked against down_rows in
        // the kernel), rows [N, S] when gathered, weights [N, S], residual [N, H] when
        // has_residual, norm_weight [H] when has_norm.
        unsafe { launch(args, geometry) }?;
    }
    Ok((
        tensor(sum, &dev, (tokens, hidden)),
        normed.map(|n| tensor(n, &dev, (tokens, hidden))),
    ))
}
