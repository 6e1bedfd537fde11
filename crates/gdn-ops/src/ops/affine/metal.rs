//! Metal host side of `kernels/affine.metal`: MLX affine matrix-vector products (optionally
//! with a per-row expert index read on the device) and row dequantization.
//!
//! The launch geometry here is what `kernels/emu/affine_harness.cpp` emulates; change both
//! together.

use super::{AffineParams, AffineTensor};
use crate::backend::dtype_tag;
use crate::backend::metal::{
    encode, metal_buffer, metal_device, metal_source, new_output, output, pipeline, Binding,
    KernelSource,
};
use anyhow::Result;
use candle_core::{DType, MetalDevice, Tensor};
use candle_metal_kernels::metal::{Buffer, ComputePipeline};
use objc2_metal::MTLSize;

const SOURCE: KernelSource = metal_source!("affine.metal", "params/affine.h");

/// Output rows one simdgroup of `affine_qmv_*` computes.
pub const QMV_ROWS_PER_SIMDGROUP: usize = 4;
/// Simdgroups per threadgroup of `affine_qmv_*`.
pub const QMV_SIMDGROUPS: usize = 2;
/// Threads per threadgroup of `affine_dequant_*`, each writing this many values.
pub const DEQUANT_THREADS: usize = 64;
pub const DEQUANT_VALUES_PER_THREAD: usize = 8;

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

/// One launch: `inputs` read from slots 0.., the output written in the slot after them.
fn launch(
    dev: &MetalDevice,
    pipeline: &ComputePipeline,
    inputs: &[(Buffer, usize)],
    out: &(Buffer, usize),
    params: &AffineParams,
    groups: MTLSize,
    threads: MTLSize,
) -> Result<()> {
    let mut bindings: Vec<Binding> = inputs.iter().map(Binding::Read).collect();
    bindings.push(Binding::Write(out));
    encode(dev, pipeline, &bindings, params, groups, threads, 0)
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
    qmv(
        m,
        x,
        ids,
        x_div,
        out_rows,
        "affine_qmv",
        m.rows,
        "affine matmul",
    )
}

/// SwiGLU activations of a stacked gate-and-up matrix: output row `i` reads x row
/// `i / x_div` with expert `ids[i]` and holds `m.rows / 2` values.
pub(crate) fn swiglu_products(
    m: &AffineTensor,
    x: &Tensor,
    ids: &Tensor,
    x_div: usize,
    out_rows: usize,
) -> Result<Tensor> {
    let im = m.rows / 2;
    qmv(
        m,
        x,
        Some(ids),
        x_div,
        out_rows,
        "affine_qmv_swiglu",
        im,
        "expert swiglu",
    )
}

/// One launch of a qmv-shaped kernel (`<kernel>_<in>_<scale>`, the geometry of
/// `affine_qmv`): `out_rows` rows of `width` values, eight per threadgroup.
#[allow(clippy::too_many_arguments)]
fn qmv(
    m: &AffineTensor,
    x: &Tensor,
    ids: Option<&Tensor>,
    x_div: usize,
    out_rows: usize,
    kernel: &str,
    width: usize,
    op: &str,
) -> Result<Tensor> {
    let dev = metal_device(&m.packed, op)?;
    let name = format!(
        "{kernel}_{}_{}",
        dtype_tag(x.dtype(), op)?,
        dtype_tag(m.scales.dtype(), op)?
    );
    let pipeline = pipeline(&dev, &SOURCE, &name)?;
    // Before the encoder is taken: candle ops lock the same command state.
    let x = x.contiguous()?;
    let ids = ids.map(|t| t.contiguous()).transpose()?;
    let y = new_output(&dev, out_rows * width, x.dtype(), &format!("{kernel}_y"))?;
    let [w, s, b, idb] = weight_buffers(m, ids.as_ref(), op)?;
    let rows_per_group = QMV_ROWS_PER_SIMDGROUP * QMV_SIMDGROUPS;
    launch(
        &dev,
        &pipeline,
        &[w, s, b, metal_buffer(&x, op)?, idb],
        &(y.as_ref().clone(), 0),
        &params(m, m.rows, out_rows, x_div, ids.is_some()),
        MTLSize {
            width: width.div_ceil(rows_per_group),
            height: out_rows,
            depth: 1,
        },
        MTLSize {
            width: 32,
            height: QMV_SIMDGROUPS,
            depth: 1,
        },
    )?;
    Ok(output(&dev, y, (out_rows, width), x.dtype()))
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
        dtype_tag(dtype, OP)?,
        dtype_tag(m.scales.dtype(), OP)?
    );
    let pipeline = pipeline(&dev, &SOURCE, &name)?;
    let ids = ids.map(|t| t.contiguous()).transpose()?;
    let out = new_output(&dev, count * m.cols, dtype, "affine_dequant_out")?;
    let per_group = DEQUANT_THREADS * DEQUANT_VALUES_PER_THREAD;
    launch(
        &dev,
        &pipeline,
        &weight_buffers(m, ids.as_ref(), OP)?,
        &(out.as_ref().clone(), 0),
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
