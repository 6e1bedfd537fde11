//! Metal host side of `kernels/moe_combine.metal`: one threadgroup of 8 simdgroups per token
//! row.
//!
//! The launch geometry here is what `kernels/emu/moe_combine_harness.cpp` emulates; change
//! both together.

use super::{combine_threads, CombineKernel, Inputs, MoeCombineParams};
use crate::backend::kernel_instance;
use crate::backend::metal::{
    encode, from_start, metal_buffer, metal_buffer_or, metal_device, metal_source, new_output,
    output, pipeline, reads_then_writes, size, KernelSource,
};
use anyhow::Result;
use candle_core::Tensor;

const SOURCE: KernelSource = metal_source!("moe_combine.metal", "params/moe_combine.h");

pub(crate) fn moe_combine(
    inputs: &Inputs,
    p: &MoeCombineParams,
    _kernel: CombineKernel, // one kernel
) -> Result<(Tensor, Option<Tensor>)> {
    const OP: &str = "moe_combine";
    let dtype = inputs.down.dtype();
    let dev = metal_device(&inputs.down, OP)?;
    let name = kernel_instance("moe_combine", &[dtype], OP)?;
    let pipeline = pipeline(&dev, &SOURCE, &name)?;
    let (tokens, hidden) = (p.tokens as usize, p.hidden as usize);
    let sum = new_output(&dev, tokens * hidden, dtype, "moe_combine_sum")?;
    let normed = match inputs.norm_weight {
        Some(_) => Some(new_output(
            &dev,
            tokens * hidden,
            dtype,
            "moe_combine_normed",
        )?),
        None => None,
    };
    let down = metal_buffer(&inputs.down, OP)?;
    // The buffers a call does not use are never touched; `down` and the sum are bound there
    // so that every slot holds a buffer.
    let rows = metal_buffer_or(inputs.rows.as_ref(), &down, OP)?;
    let residual = metal_buffer_or(inputs.residual.as_ref(), &down, OP)?;
    let norm_weight = metal_buffer_or(inputs.norm_weight.as_ref(), &down, OP)?;
    let sum_out = from_start(&sum);
    let normed_out = match &normed {
        Some(b) => from_start(b),
        None => sum_out.clone(),
    };
    let weights = metal_buffer(&inputs.weights, OP)?;
    encode(
        &dev,
        &pipeline,
        &reads_then_writes(
            &[&down, &rows, &weights, &residual, &norm_weight],
            &[&sum_out, &normed_out],
        ),
        p,
        size(tokens, 1, 1),
        size(combine_threads(hidden), 1, 1),
        // One partial sum of squares per simdgroup, 32 at most.
        32 * std::mem::size_of::<f32>(),
    )?;
    Ok((
        output(&dev, sum, (tokens, hidden), dtype),
        normed.map(|b| output(&dev, b, (tokens, hidden), dtype)),
    ))
}
