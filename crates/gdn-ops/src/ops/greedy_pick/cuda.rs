//! CUDA host side of `kernels/greedy_pick.cu`: the slice pass on (B, N) blocks of
//! [`THREADS`] threads, then the finish pass on N warps, both on candle's stream (so the
//! finish pass sees the partials, and a CUDA graph captures the pair as is).
//!
//! The launch geometry here is what `kernels/emu/greedy_pick_cuda_harness.cpp` emulates; change
//! both together.

use super::{GreedyPickParams, THREADS};
use crate::backend::cuda::{
    config, cuda_device, cuda_source, launch, tensor, with_float_type, Element, Held, Kernel,
    KernelSource,
};
use anyhow::{ensure, Result};
use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, PushKernelArg};
use candle_core::Tensor;

const OP: &str = "greedy_pick";
const SOURCE: KernelSource = cuda_source!("greedy_pick");

// SAFETY: `GreedyPickParams` is `repr(C)` of four u32, as the kernel's struct.
unsafe impl DeviceRepr for GreedyPickParams {}

pub(crate) fn greedy_pick(logits: &Tensor, p: &GreedyPickParams) -> Result<Tensor> {
    with_float_type!(logits.dtype(), OP, |T| greedy_pick_as::<T>(logits, p))
}

fn greedy_pick_as<T: Element>(logits: &Tensor, p: &GreedyPickParams) -> Result<Tensor> {
    let dev = cuda_device(logits, OP)?;
    let logits = logits.contiguous()?;
    let rows = p.rows as usize;
    // The rows are the grid's y dimension.
    ensure!(p.rows <= 65535, "{OP}: {rows} rows exceed the CUDA grid");
    // SAFETY: the finish pass writes every element of out.
    let out = unsafe { dev.alloc::<u32>(rows * 2)? };
    // The logits' storage guard lives only for the launches.
    {
        let slices = Kernel::typed(&dev, &SOURCE, "greedy_pick_slices", &[T::DTYPE], OP)?;
        let finish = Kernel::load(&dev, &SOURCE, "greedy_pick_finish")?;
        // SAFETY: the slice pass writes every record (an empty slice its neutral one).
        let partials = unsafe { dev.alloc::<u32>(p.partial_words())? };
        let held = Held::new(&logits);
        let logits_view = held.view::<T>(OP)?;
        let mut args = slices.args();
        args.arg(&logits_view).arg(&partials).arg(p);
        let slice_blocks = config((p.blocks, p.rows, 1), (THREADS as u32, 1, 1), 0);
        // SAFETY: arguments in the order and types of `greedy_pick_slices_*` in
        // kernels/greedy_pick.cu (partials: N·B records of 3 words); logits holds N rows of
        // V values and the blocks' slices stay within them.
        unsafe { launch(args, slice_blocks) }?;
        let mut args = finish.args();
        args.arg(&partials).arg(&out).arg(p);
        let row_warps = config((p.rows, 1, 1), (32, 1, 1), 0);
        // SAFETY: arguments of `greedy_pick_finish`, reading the records written above on the
        // same stream; out holds N·2 words.
        unsafe { launch(args, row_warps) }?;
    }
    Ok(tensor(out, &dev, (rows, 2)))
}
