//! Metal host side of `kernels/moe_route.metal`: one simdgroup per token (`moe_route_<in>`),
//! or one threadgroup per token, one thread an expert (`moe_route_block_<in>`).
//!
//! The launch geometry here is what `kernels/emu/moe_route_harness.cpp` emulates; change both
//! together.

use super::{block_threads, MoeRouteParams, RouteKernel, BLOCK_SCRATCH_WORDS};
use crate::backend::kernel_instance;
use crate::backend::metal::{
    encode, from_start, metal_buffer, metal_device, metal_source, new_output, output, pipeline,
    reads_then_writes, size, KernelSource,
};
use anyhow::Result;
use candle_core::{DType, Tensor};

const SOURCE: KernelSource = metal_source!("moe_route.metal", "params/moe_route.h");

pub(crate) fn moe_route(
    logits: &Tensor,
    p: &MoeRouteParams,
    body: RouteKernel,
) -> Result<(Tensor, Tensor)> {
    const OP: &str = "moe_route";
    let dev = metal_device(logits, OP)?;
    let threads = block_threads(p.experts as usize);
    let block = match body {
        RouteKernel::Block => {
            let name = kernel_instance("moe_route_block", &[logits.dtype()], OP)?;
            let pipeline = pipeline(&dev, &SOURCE, &name)?;
            // A pipeline that cannot hold a thread per expert takes the simdgroup body: the
            // same outputs.
            (pipeline.max_total_threads_per_threadgroup() >= threads).then_some(pipeline)
        }
        // `Auto` was resolved by `moe_route_with` (`RouteKernel::for_tokens`).
        RouteKernel::Warp | RouteKernel::Auto => None,
    };
    let (pipeline, threads, scratch) = match block {
        Some(pipeline) => (pipeline, threads, 4 * BLOCK_SCRATCH_WORDS),
        None => {
            let name = kernel_instance("moe_route", &[logits.dtype()], OP)?;
            (pipeline(&dev, &SOURCE, &name)?, 32, 0)
        }
    };
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
        size(threads, 1, 1),
        scratch,
    )?;
    Ok((
        output(&dev, ids, (tokens, slots), DType::U32),
        output(&dev, weights, (tokens, slots), DType::F32),
    ))
}
