//! Metal host side of `kernels/indexer_pool.metal`: one simdgroup with the pooled key in
//! threadgroup memory, the buffers written in place.
//!
//! The launch geometry here is what `kernels/emu/indexer_pool_harness.cpp` emulates; change
//! both together.

use super::{IndexerPoolParams, PoolCall};
use crate::backend::kernel_instance;
use crate::backend::metal::{
    encode, metal_buffer, metal_device, metal_source, pipeline, size, Binding, KernelSource,
};
use anyhow::Result;

const SOURCE: KernelSource = metal_source!("indexer_pool.metal", "params/indexer_pool.h");

pub(crate) fn indexer_pool(call: &PoolCall, p: &IndexerPoolParams) -> Result<()> {
    const OP: &str = "indexer_pool";
    let dev = &metal_device(call.tail, OP)?;
    let name = kernel_instance("indexer_pool", &[call.qk.dtype()], OP)?;
    let pipeline = pipeline(dev, &SOURCE, &name)?;
    let buffer = |t| metal_buffer(t, OP);
    let (qk, tail, blocks) = (buffer(call.qk)?, buffer(call.tail)?, buffer(call.blocks)?);
    let (tail_row, block_row) = (buffer(call.tail_row)?, buffer(call.block_row)?);
    let (cos, sin, norm) = (buffer(call.cos)?, buffer(call.sin)?, buffer(call.norm)?);
    // Di floats of threadgroup memory, in the 16-byte steps Metal sizes it in.
    let pooled_bytes = (4 * p.dim as usize).div_ceil(16) * 16;
    encode(
        dev,
        &pipeline,
        &[
            Binding::Read(&qk),
            Binding::Write(&tail),
            Binding::Write(&blocks),
            Binding::Read(&tail_row),
            Binding::Read(&block_row),
            Binding::Read(&cos),
            Binding::Read(&sin),
            Binding::Read(&norm),
        ],
        p,
        size(1, 1, 1),
        size(32, 1, 1),
        pooled_bytes,
    )?;
    Ok(())
}
