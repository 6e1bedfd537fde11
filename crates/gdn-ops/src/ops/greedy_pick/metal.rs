//! Metal host side of `kernels/greedy_pick.metal`: the slice pass on (B, N) threadgroups of
//! [`THREADS`] threads, then the finish pass on N simdgroups.
//!
//! The launch geometry here is what `kernels/emu/greedy_pick_harness.cpp` emulates; change both
//! together.

use super::{GreedyPickParams, THREADS};
use crate::backend::dtype_tag;
use crate::backend::metal::{
    encode, metal_buffer, metal_device, metal_source, new_output, output, pipeline, Binding,
    KernelSource,
};
use anyhow::Result;
use candle_core::{DType, Tensor};
use objc2_metal::MTLSize;

const SOURCE: KernelSource = metal_source!("greedy_pick.metal", "params/greedy_pick.h");

pub(crate) fn greedy_pick(logits: &Tensor, p: &GreedyPickParams) -> Result<Tensor> {
    const OP: &str = "greedy_pick";
    let dev = metal_device(logits, OP)?;
    let slices = pipeline(
        &dev,
        &SOURCE,
        &format!("greedy_pick_slices_{}", dtype_tag(logits.dtype(), OP)?),
    )?;
    let finish = pipeline(&dev, &SOURCE, "greedy_pick_finish")?;
    // Before the encoder is taken: candle ops lock the same command state.
    let logits = logits.contiguous()?;
    let rows = p.rows as usize;
    let out = new_output(&dev, rows * 2, DType::U32, "greedy_pick_out")?;
    let partials = new_output(&dev, p.partial_words(), DType::U32, "greedy_pick_partials")?;
    let (partials, out_view) = ((partials.as_ref().clone(), 0), (out.as_ref().clone(), 0));
    let one = |width| MTLSize {
        width,
        height: 1,
        depth: 1,
    };
    // 3 words a simdgroup (96 bytes: a multiple of 16, as Metal wants).
    let scratch_bytes = THREADS / 32 * 3 * 4;
    encode(
        &dev,
        &slices,
        &[
            Binding::Read(&metal_buffer(&logits, OP)?),
            Binding::Write(&partials),
        ],
        p,
        MTLSize {
            width: p.blocks as usize,
            height: rows,
            depth: 1,
        },
        one(THREADS),
        scratch_bytes,
    )?;
    encode(
        &dev,
        &finish,
        &[Binding::Read(&partials), Binding::Write(&out_view)],
        p,
        one(rows),
        one(32),
        0,
    )?;
    Ok(output(&dev, out, (rows, 2), DType::U32))
}
