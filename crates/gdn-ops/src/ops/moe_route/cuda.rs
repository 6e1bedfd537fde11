//! CUDA host side of `kernels/moe_route.cu`: one warp per token (`moe_route_<x>`), or one
//! block per token, one thread an expert (`moe_route_block_<x>`). The geometries here are what
//! `kernels/emu/moe_route_cuda_harness.cpp` emulates; change both together.

use super::{block_threads, MoeRouteParams, RouteKernel};
use crate::backend::cuda::{
    config, cuda_device, cuda_source, launch, tensor, with_float_type, Element, Held, Kernel,
    KernelSource,
};
use anyhow::{ensure, Result};
use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, PushKernelArg};
use candle_core::Tensor;

const SOURCE: KernelSource = cuda_source!("moe_route");

// SAFETY: `MoeRouteParams` is `repr(C)` of five u32, as the kernel's struct.
unsafe impl DeviceRepr for MoeRouteParams {}

/// Warps (tokens) per block.
const TOKENS_PER_BLOCK: u32 = 4;

pub(crate) fn moe_route(
    logits: &Tensor,
    p: &MoeRouteParams,
    body: RouteKernel,
) -> Result<(Tensor, Tensor)> {
    with_float_type!(logits.dtype(), "moe_route", |T| moe_route_as::<T>(
        logits, p, body
    ))
}

fn moe_route_as<T: Element>(
    logits: &Tensor,
    p: &MoeRouteParams,
    body: RouteKernel,
) -> Result<(Tensor, Tensor)> {
    const OP: &str = "moe_route";
    let dev = cuda_device(logits, OP)?;
    let logits = logits.contiguous()?;
    // The entry point, its blocks and their shape.
    let (name, blocks, threads) = match body {
        // `Auto` was resolved by `moe_route_with` (`RouteKernel::for_tokens`).
        RouteKernel::Warp | RouteKernel::Auto => (
            "moe_route",
            p.tokens.div_ceil(TOKENS_PER_BLOCK),
            (32, TOKENS_PER_BLOCK, 1),
        ),
        RouteKernel::Block => (
            "moe_route_block",
            p.tokens,
            (block_threads(p.experts as usize) as u32, 1, 1),
        ),
    };
    let kernel = Kernel::typed(&dev, &SOURCE, name, &[T::DTYPE], OP)?;
    let (tokens, slots) = (p.tokens as usize, (p.top_k + p.has_shared) as usize);
    ensure!(
        blocks <= i32::MAX as u32,
        "{OP}: {tokens} tokens exceed the CUDA grid"
    );
    // SAFETY: the kernel writes every element of both outputs.
    let ids = unsafe { dev.alloc::<u32>(tokens * slots)? };
    let weights = unsafe { dev.alloc::<f32>(tokens * slots)? };
    if tokens > 0 {
        let held = Held::new(&logits);
        let logits_view = held.view::<T>(OP)?;
        let mut args = kernel.args();
        args.arg(&logits_view).arg(&ids).arg(&weights).arg(p);
        // The block body's shared memory is static.
        let geometry = config((blocks, 1, 1), threads, 0);
        // SAFETY: arguments in the order and types of `moe_route_*` and `moe_route_block_*`
        // in kernels/moe_route.cu; logits holds tokens rows of experts + has_shared values.
        unsafe { launch(args, geometry) }?;
    }
    Ok((
        tensor(ids, &dev, (tokens, slots)),
        tensor(weights, &dev, (tokens, slots)),
    ))
}
