//! Metal host side of `kernels/moe_combine.metal`: one threadgroup of 8 simdgroups per token
//! row.
//!
//! The launch geometry here is what `kernels/emu/moe_combine_harness.cpp` emulates; change
//! both together.

use super::{combine_threads, Inputs, MoeCombineParams};
use crate::backend::dtype_tag;
use crate::backend::metal::{
    encode, metal_buffer, metal_device, metal_source, new_output, output, pipeline, Binding,
    KernelSource,
};
use anyhow::Result;
use candle_core::Tensor;
use objc2_metal::MTLSize;

const SOURCE: KernelSource = metal_source!("moe_combine.metal", "params/moe_combine.h");

pub(crate) fn moe_combine(
    inputs: &Inputs,
    p: &MoeCombineParams,
) -> Result<(Tensor, Option<Tensor>)> {
    const OP: &str = "moe_combine";
    let dtype = inputs.down.dtype();
    let dev = metal_device(&inputs.down, OP)?;
    let name = format!("moe_combine_{}", dtype_tag(dtype, OP)?);
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
    let bound_or_down = |t: &Option<Tensor>| match t {
        Some(t) => metal_buffer(t, OP),
        None => Ok(down.clone()),
    };
    let rows = bound_or_down(&inputs.rows)?;
    let residual = bound_or_down(&inputs.residual)?;
    let norm_weight = bound_or_down(&inputs.norm_weight)?;
    let sum_out = (sum.as_ref().clone(), 0);
    let normed_out = match &normed {
        Some(b) => (b.as_ref().clone(), 0),
        None => sum_out.clone(),
    };
    encode(
        &dev,
        &pipeline,
        &[
            Binding::Read(&down),
            Binding::Read(&rows),
            Binding::Read(&metal_buffer(&inputs.weights, OP)?),
            Binding::Read(&residual),
            Binding::Read(&norm_weight),
            Binding::Write(&sum_out),
            Binding::Write(&normed_out),
        ],
        p,
        MTLSize {
            width: tokens,
            height: 1,
            depth: 1,
        },
        MTLSize {
            width: combine_threads(hidden),
            height: 1,
            depth: 1,
        },
        // One partial sum of squares per simdgroup, 32 at most.
        32 * std::mem::size_of::<f32>(),
    )?;
    Ok((
        output(&dev, sum, (tokens, hidden), dtype),
        normed.map(|b| output(&dev, b, (tokens, hidden), dtype)),
    ))
}
