//! CUDA host side of `kernels/greedy_pick.cu`: the slice pass on (B, N) blocks of
//! [`THREADS`] threads, then the finish pass on N warps, both on candle's stream (so the
//! finish pass sees the partials, and a CUDA graph captures the pair as is).
//!
//! The launch geometry here is what `kernels/emu/greedy_pick_cuda_harness.cpp` emulates; change
//! both together.

use super::{GreedyPickParams, THREADS};
use crate::backend::cuda::{
    cuda_device, function, launch, tensor, view, with_float_type, KernelSource,
};
use crate::backend::dtype_tag;
use anyhow::{ensure, Result};
use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::CudaDType;
use candle_core::{Tensor, WithDType};

const OP: &str = "greedy_pick";
const SOURCE: KernelSource = KernelSource {
    module: "qwen_gdn_greedy_pick",
    ptx: include_str!(concat!(env!("OUT_DIR"), "/greedy_pick.ptx")),
};

// SAFETY: `GreedyPickParams` is `repr(C)` of four u32, as the kernel's struct.
unsafe impl DeviceRepr for GreedyPickParams {}

pub(crate) fn greedy_pick(logits: &Tensor, p: &GreedyPickParams) -> Result<Tensor> {
    with_float_type!(logits.dtype(), OP, |T| greedy_pick_as::<T>(logits, p))
}

fn greedy_pick_as<T: CudaDType + DeviceRepr + WithDType>(
    logits: &Tensor,
    p: &GreedyPickParams,
) -> Result<Tensor> {
    let dev = cuda_device(logits, OP)?;
    let logits = logits.contiguous()?;
    let rows = p.rows as usize;
    // The rows are the grid's y dimension.
    ensure!(p.rows <= 65535, "{OP}: {rows} rows exceed the CUDA grid");
    // SAFETY: the finish pass writes every element of out.
    let out = unsafe { dev.alloc::<u32>(rows * 2)? };
    // The logits' storage guard lives only for the launches.
    {
        let slices = function(
            &dev,
            &SOURCE,
            &format!("greedy_pick_slices_{}", dtype_tag(T::DTYPE, OP)?),
        )?;
        let finish = function(&dev, &SOURCE, "greedy_pick_finish")?;
        // SAFETY: the slice pass writes every record (an empty slice its neutral one).
        let partials = unsafe { dev.alloc::<u32>(p.partial_words())? };
        let (ls, ll) = logits.storage_and_layout();
        let logits_view = view::<T>(&ls, ll, OP)?;
        let stream = dev.cuda_stream();
        let mut args = stream.launch_builder(&slices);
        args.arg(&logits_view).arg(&partials).arg(p);
        let config = LaunchConfig {
            grid_dim: (p.blocks, p.rows, 1),
            block_dim: (THREADS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: arguments in the order and types of `greedy_pick_slices_*` in
        // kernels/greedy_pick.cu (partials: N·B records of 3 words); logits holds N rows of
        // V values and the blocks' slices stay within them.
        unsafe { launch(args, config) }?;
        let mut args = stream.launch_builder(&finish);
        args.arg(&partials).arg(&out).arg(p);
        let config = LaunchConfig {
            grid_dim: (p.rows, 1, 1),
            block_dim: (32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: arguments of `greedy_pick_finish`, reading the records written above on the
        // same stream; out holds N·2 words.
        unsafe { launch(args, config) }?;
    }
    Ok(tensor(out, &dev, (rows, 2)))
}
