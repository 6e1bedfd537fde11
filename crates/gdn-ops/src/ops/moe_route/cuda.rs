//! CUDA host side of `kernels/moe_route.cu`: one warp per token.

use super::MoeRouteParams;
use crate::backend::cuda::{
    cuda_device, function, launch, tensor, view, with_float_type, KernelSource,
};
use crate::backend::dtype_tag;
use anyhow::{ensure, Result};
use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::CudaDType;
use candle_core::{Tensor, WithDType};

const SOURCE: KernelSource = KernelSource {
    module: "qwen_gdn_moe_route",
    ptx: include_str!(concat!(env!("OUT_DIR"), "/moe_route.ptx")),
};

// SAFETY: `MoeRouteParams` is `repr(C)` of five u32, as the kernel's struct.
unsafe impl DeviceRepr for MoeRouteParams {}

/// Warps (tokens) per block.
const TOKENS_PER_BLOCK: u32 = 4;

pub(crate) fn moe_route(logits: &Tensor, p: &MoeRouteParams) -> Result<(Tensor, Tensor)> {
    with_float_type!(logits.dtype(), "moe_route", |T| moe_route_as::<T>(
        logits, p
    ))
}

fn moe_route_as<T: CudaDType + DeviceRepr + WithDType>(
    logits: &Tensor,
    p: &MoeRouteParams,
) -> Result<(Tensor, Tensor)> {
    const OP: &str = "moe_route";
    let dev = cuda_device(logits, OP)?;
    let logits = logits.contiguous()?;
    let name = format!("moe_route_{}", dtype_tag(T::DTYPE, OP)?);
    let func = function(&dev, &SOURCE, &name)?;
    let (tokens, slots) = (p.tokens as usize, (p.top_k + p.has_shared) as usize);
    ensure!(
        p.tokens.div_ceil(TOKENS_PER_BLOCK) <= i32::MAX as u32,
        "{OP}: {tokens} tokens exceed the CUDA grid"
    );
    // SAFETY: the kernel writes every element of both outputs.
    let ids = unsafe { dev.alloc::<u32>(tokens * slots)? };
    let weights = unsafe { dev.alloc::<f32>(tokens * slots)? };
    if tokens > 0 {
        let (ls, ll) = logits.storage_and_layout();
        let logits_view = view::<T>(&ls, ll, OP)?;
        let stream = dev.cuda_stream();
        let mut args = stream.launch_builder(&func);
        args.arg(&logits_view).arg(&ids).arg(&weights).arg(p);
        let config = LaunchConfig {
            grid_dim: (p.tokens.div_ceil(TOKENS_PER_BLOCK), 1, 1),
            block_dim: (32, TOKENS_PER_BLOCK, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: arguments in the order and types of `moe_route_*` in kernels/moe_route.cu;
        // logits holds tokens rows of experts + has_shared values.
        unsafe { launch(args, config) }?;
    }
    Ok((
        tensor(ids, &dev, (tokens, slots)),
        tensor(weights, &dev, (tokens, slots)),
    ))
}
