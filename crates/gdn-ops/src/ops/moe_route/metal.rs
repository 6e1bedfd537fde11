//! Metal host side of `kernels/moe_route.metal`: one simdgroup per token.
//!
//! The launch geometry here is what `kernels/emu/moe_route_harness.cpp` emulates; change both
//! together.

use super::MoeRouteParams;
use crate::backend::dtype_tag;
use crate::backend::metal::{
    encode, metal_buffer, metal_device, metal_source, new_output, output, pipeline, Binding,
    KernelSource,
};
use anyhow::Result;
use candle_core::{DType, Tensor};
use objc2_metal::MTLSize;

const SOURCE: KernelSource = metal_source!("moe_route.metal", "params/moe_route.h");

pub(crate) fn moe_route(logits: &Tensor, p: &MoeRouteParams) -> Result<(Tensor, Tensor)> {
    const OP: &str = "moe_route";
    let dev = metal_device(logits, OP)?;
    let name = format!("moe_route_{}", dtype_tag(logits.dtype(), OP)?);
    let pipeline = pipeline(&dev, &SOURCE, &name)?;
    // Before the encoder is taken: candle ops lock the same command state.
    let logits = logits.contiguous()?;
    let (tokens, slots) = (p.tokens as usize, (p.top_k + p.has_shared) as usize);
    let ids = new_output(&dev, tokens * slots, DType::U32, "moe_route_ids")?;
    let weights = new_output(&dev, tokens * slots, DType::F32, "moe_route_weights")?;
    let (ids_out, weights_out) = ((ids.as_ref().clone(), 0), (weights.as_ref().clone(), 0));
    encode(
        &dev,
        &pipeline,
        &[
            Binding::Read(&metal_buffer(&logits, OP)?),
            Binding::Write(&ids_out),
            Binding::Write(&weights_out),
        ],
        p,
        MTLSize {
            width: tokens,
            height: 1,
            depth: 1,
        },
        MTLSize {
            width: 32,
            height: 1,
            depth: 1,
        },
        0,
    )?;
    Ok((
        output(&dev, ids, (tokens, slots), DType::U32),
        output(&dev, weights, (tokens, slots), DType::F32),
    ))
}
