//! Metal host side of `kernels/greedy_pick.metal`: the slice pass on (B, N) threadgroups of
//! [`THREADS`] threads, then the finish pass on N simdgroups.
//!
//! The launch geometry here is what `kernels/emu/greedy_pick_harness.cpp` emulates; change both
//! together.

use super::{GreedyPickParams, THREADS};
use crate::backend::kernel_instance;
use crate::backend::metal::{
    encode, from_start, metal_buffer, metal_device, metal_source, new_output, output, pipeline,
    reads_then_writes, size, KernelSource,
};
use anyhow::Result;
use candle_core::{DType, Tensor};

const SOURCE: KernelSource = metal_source!("greedy_pick.metal", "params/greedy_pick.h");

pub(crate) fn greedy_pick(logits: &Tensor, p: &GreedyPickParams) -> Result<Tensor> {
    const OP: &str = "greedy_pick";
    let dev = metal_device(logits, OP)?;
    let name = kernel_instance("greedy_pick_slices", &[logits.dtype()], OP)?;
    let slices = pipeline(&dev, &SOURCE, &name)?;
    let finish = pipeline(&dev, &SOURCE, "greedy_pick_finish")?;
    // Before the encoder is taken: candle ops lock the same command state.
    let logits = logits.contiguous()?;
    let rows = p.rows as usize;
    let out = new_output(&dev, rows * 2, DType::U32, "greedy_pick_out")?;
    let partials = new_output(&dev, p.partial_words(), DType::U32, "greedy_pick_partials")?;
    let (partials, out_view) = (from_start(&partials), from_start(&out));
    let one = |width| size(width, 1, 1);
    // 3 words a simdgroup (96 bytes: a multiple of 16, as Metal wants).
    let scratch_bytes = THREADS / 32 * 3 * 4;
    encode(
        &dev,
        &slices,
        &reads_then_writes(&[&metal_buffer(&logits, OP)?], &[&partials]),
        p,
        size(p.blocks as usize, rows, 1),
        one(THREADS),
        scratch_bytes,
    )?;
    encode(
        &dev,
        &finish,
        &reads_then_writes(&[&partials], &[&out_view]),
        p,
        one(rows),
        one(32),
        0,
    )?;
    Ok(output(&dev, out, (rows, 2), DType::U32))
}
