//! Metal host side of `kernels/moe_route.metal`: one simdgroup per token.
//!
//! The launch geometry here is what `kernels/emu/moe_route_harness.cpp` emulates; change both
//! together.

use super::MoeRouteParams;
use crate::backend::kernel_instance;
use crate::backend::metal::{
    encode, from_start, metal_buffer, metal_device, metal_source, new_output, output, pipeline,
    reads_then_writes, size, KernelSource,
};
use anyhow::Result;
use candle_core::{DType, Tensor};

const SOURCE: KernelSource = metal_source!("moe_route.metal", "params/moe_route.h");

pub(crate) fn moe_route(logits: &Tensor, p: &MoeRouteParams) -> Result<(Tensor, Tensor)> {
    const OP: &str = "moe_route";
    let dev = metal_device(logits, OP)?;
    let name = kernel_instance("moe_route", &[logits.dtype()], OP)?;
    let pipeline = pipeline(&dev, &SOURCE, &name)?;
    // Before the encoder is taken: candle ops lock the same command state.
    let logits = logits.contiguous()?;
    let (tokens, slots) = (p.tokens as usize, (p.top_k + p.has_shared) as usize);
    let ids = new_output(&dev, tokens * slots, DType::U32, "moe_route_ids")?;
    let weights = new_output(&dev, tokens * slots, DType::F32, "moe_route_weights")?;
    let (ids_out, weights_out) = (from_start(&ids), from_start(&weights));
    encode(
        &dev,
        &pipeline,
        &reads_then_writes(&[&metal_buffer(&logits, OP)?], &[&ids_out, &weights_out]),
        p,
        size(tokens, 1, 1),
        size(32, 1, 1),
        0,
    )?;
    Ok((
        output(&dev, ids, (tokens, slots), DType::U32),
        output(&dev, weights, (tokens, slots), DType::F32),
    ))
}
