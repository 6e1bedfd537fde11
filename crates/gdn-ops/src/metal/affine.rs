//! Metal host side of `kernels/affine.metal`: MLX affine matrix-vector products (optionally
//! with a per-row expert index read on the device) and row dequantization.
//!
//! The launch geometry here is what `kernels/emu/affine_harness.cpp` emulates; change both
//! together.

use super::{metal_buffer, metal_device, pipeline, KernelSource};
use crate::affine_tensor::{AffineParams, AffineTensor};
use anyhow::{bail, Context, Result};
use candle_core::op::BackpropOp;
use candle_core::{DType, MetalDevice, MetalStorage, Storage, Tensor};
use candle_metal_kernels::metal::{Buffer, ComputePipeline};
use objc2_metal::MTLSize;

/// Output rows one simdgroup of `affine_qmv_*` computes.
pub const QMV_ROWS_PER_SIMDGROUP: usize = 4;
/// Simdgroups per threadgroup of `affine_qmv_*`.
pub const QMV_SIMDGROUPS: usize = 2;
/// Threads per threadgroup of `affine_dequant_*`, each writing this many values.
pub const DEQUANT_THREADS: usize = 64;
pub const DEQUANT_VALUES_PER_THREAD: usize = 8;

fn tag(dtype: DType, what: &str) -> Result<&'static str> {
    Ok(match dtype {
        DType::F32 => "f32",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        other => bail!("affine kernels: no {what} dtype {other:?}"),
    })
}

fn params(m: &AffineTensor, rows: usize, out_rows: usize, x_div: usize, ids: bool) -> AffineParams {
    AffineParams {
        rows: rows as u32,
        cols: m.cols as u32,
        bits: m.bits as u32,
        group_size: m.group_size as u32,
        out_rows: out_rows as u32,
        x_div: x_div as u32,
        has_ids: ids as u32,
    }
}

fn output(
    dev: &MetalDevice,
    buffer: std::sync::Arc<Buffer>,
    shape: (usize, usize),
    dtype: DType,
) -> Tensor {
    let storage = MetalStorage::new(buffer, dev.clone(), shape.0 * shape.1, dtype);
    Tensor::from_storage(Storage::Metal(storage), shape, BackpropOp::none(), false)
}

/// One launch: `inputs` bound to slots 0.., the output buffer and the parameters after them.
fn encode(
    dev: &MetalDevice,
    pipeline: &ComputePipeline,
    inputs: &[(Buffer, usize)],
    out: &Buffer,
    params: &AffineParams,
    groups: MTLSize,
    threads: MTLSize,
) -> Result<()> {
    let guard = dev.command_encoder()?;
    let encoder: &candle_metal_kernels::metal::ComputeCommandEncoder = guard.as_ref();
    encoder.set_compute_pipeline_state(pipeline);
    for (slot, (buf, offset)) in inputs.iter().enumerate() {
        encoder.set_input_buffer(slot, Some(buf), *offset);
    }
    encoder.set_output_buffer(inputs.len(), Some(out), 0);
    encoder.set_bytes(inputs.len() + 1, params);
    encoder.dispatch_thread_groups(groups, threads);
    Ok(())
}

/// The packed words, scales and biases, then the ids (or, without ids, the words again: the
/// kernel never reads that slot, but it must be bound).
fn weight_buffers(
    m: &AffineTensor,
    ids: Option<&Tensor>,
    op: &str,
) -> Result<[(Buffer, usize); 4]> {
    let w = metal_buffer(&m.packed, op)?;
    let ids = match ids {
        Some(t) => metal_buffer(t, op)?,
        None => w.clone(),
    };
    Ok([
        w,
        metal_buffer(&m.scales, op)?,
        metal_buffer(&m.biases, op)?,
        ids,
    ])
}

/// `out_rows` products: row `i` reads x row `i / x_div` with expert `ids[i]` (or expert 0).
pub(crate) fn products(
    m: &AffineTensor,
    x: &Tensor,
    ids: Option<&Tensor>,
    x_div: usize,
    out_rows: usize,
) -> Result<Tensor> {
    const OP: &str = "affine matmul";
    let dev = metal_device(&m.packed, OP)?;
    let name = format!(
        "affine_qmv_{}_{}",
        tag(x.dtype(), "input")?,
        tag(m.scales.dtype(), "scale")?
    );
    let pipeline = pipeline(&dev, KernelSource::Affine, &name)?;
    // Before the encoder is taken: candle ops lock the same command state.
    let x = x.contiguous()?;
    let ids = ids.map(|t| t.contiguous()).transpose()?;
    let y = dev
        .new_buffer(out_rows * m.rows, x.dtype(), "affine_qmv_y")
        .context("allocating the product")?;
    let [w, s, b, idb] = weight_buffers(m, ids.as_ref(), OP)?;
    let rows_per_group = QMV_ROWS_PER_SIMDGROUP * QMV_SIMDGROUPS;
    encode(
        &dev,
        &pipeline,
        &[w, s, b, metal_buffer(&x, OP)?, idb],
        &y,
        &params(m, m.rows, out_rows, x_div, ids.is_some()),
        MTLSize {
            width: m.rows.div_ceil(rows_per_group),
            height: out_rows,
            depth: 1,
        },
        MTLSize {
            width: 32,
            height: QMV_SIMDGROUPS,
            depth: 1,
        },
    )?;
    Ok(output(&dev, y, (out_rows, m.rows), x.dtype()))
}

/// `count` rows (those listed in `ids`, or the first `count`) of the stacked matrix in `dtype`.
pub(crate) fn dequantize(
    m: &AffineTensor,
    ids: Option<&Tensor>,
    count: usize,
    dtype: DType,
) -> Result<Tensor> {
    const OP: &str = "affine dequantize";
    let dev = metal_device(&m.packed, OP)?;
    let name = format!(
        "affine_dequant_{}_{}",
        tag(dtype, "output")?,
        tag(m.scales.dtype(), "scale")?
    );
    let pipeline = pipeline(&dev, KernelSource::Affine, &name)?;
    let ids = ids.map(|t| t.contiguous()).transpose()?;
    let out = dev
        .new_buffer(count * m.cols, dtype, "affine_dequant_out")
        .context("allocating dequantized rows")?;
    let per_group = DEQUANT_THREADS * DEQUANT_VALUES_PER_THREAD;
    encode(
        &dev,
        &pipeline,
        &weight_buffers(m, ids.as_ref(), OP)?,
        &out,
        &params(m, m.experts * m.rows, count, 1, ids.is_some()),
        MTLSize {
            width: m.cols.div_ceil(per_group),
            height: count,
            depth: 1,
        },
        MTLSize {
            width: DEQUANT_THREADS,
            height: 1,
            depth: 1,
        },
    )?;
    Ok(output(&dev, out, (count, m.cols), dtype))
}
