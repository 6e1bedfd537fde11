//! CUDA host side of `kernels/indexer_pool.cu`: one warp, the buffers written in place, on
//! candle's stream (so that a CUDA graph captures it with the step).
//!
//! The launch geometry here is what `kernels/emu/indexer_pool_cuda_harness.cpp` emulates;
//! change both together.

use super::{IndexerPoolParams, PoolCall};
use crate::backend::cuda::{
    config, cuda_device, cuda_source, launch, with_float_type, Element, Held, Kernel, KernelSource,
};
use anyhow::Result;
use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, PushKernelArg};

const OP: &str = "indexer_pool";
const SOURCE: KernelSource = cuda_source!("indexer_pool");

// SAFETY: `IndexerPoolParams` is `repr(C)` of five u32 and one f32, as the kernel's struct.
unsafe impl DeviceRepr for IndexerPoolParams {}

pub(crate) fn indexer_pool(call: &PoolCall, p: &IndexerPoolParams) -> Result<()> {
    with_float_type!(call.qk.dtype(), OP, |T| launch_as::<T>(call, p))
}

fn launch_as<T: Element>(call: &PoolCall, p: &IndexerPoolParams) -> Result<()> {
    let dev = cuda_device(call.tail, OP)?;
    let kernel = Kernel::typed(&dev, &SOURCE, "indexer_pool", &[T::DTYPE], OP)?;
    let held = [call.tail, call.blocks, call.cos, call.sin, call.norm].map(Held::new);
    let [tail, blocks, cos, sin, norm] = [0, 1, 2, 3, 4].map(|i| held[i].view::<f32>(OP));
    let rows = [call.tail_row, call.block_row].map(Held::new);
    let (tail_row, block_row) = (rows[0].view::<u32>(OP)?, rows[1].view::<u32>(OP)?);
    let qk_held = Held::new(call.qk);
    let qk = qk_held.view::<T>(OP)?;
    let (tail, blocks, cos, sin, norm) = (tail?, blocks?, cos?, sin?, norm?);
    let mut args = kernel.args();
    args.arg(&qk)
        .arg(&tail)
        .arg(&blocks)
        .arg(&tail_row)
        .arg(&block_row)
        .arg(&cos)
        .arg(&sin)
        .arg(&norm)
        .arg(p);
    // SAFETY: arguments in the order and types of `indexer_pool_*` in kernels/indexer_pool.cu;
    // qk holds at least key_offset + Di values, tail c·Di and blocks capacity·Di f32 (checked
    // by `PoolCall::checked`), and the kernel writes only rows below c and capacity.
    unsafe { launch(args, config((1, 1, 1), (32, 1, 1), 0)) }?;
    Ok(())
}
