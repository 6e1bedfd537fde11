//! Metal host side of `kernels/affine.metal`: MLX affine matrix-vector products (optionally
//! with a per-row expert index read on the device) and row dequantization.
//!
//! The launch geometry here is what `kernels/emu/affine_harness.cpp` emulates; change both
//! together.

use super::{AffineParams, AffineTensor, ProductKind, Products};
use crate::backend::kernel_instance;
use crate::backend::metal::{
    encode, from_start, metal_buffer, metal_buffer_or, metal_buffers, metal_device, metal_source,
    new_output, output, pipeline, reads_then_writes, size, KernelSource,
};
use anyhow::Result;
use candle_core::{DType, Tensor};
use candle_metal_kernels::metal::Buffer;

const SOURCE: KernelSource = metal_source!("affine.metal", "params/affine.h");

/// Output rows one simdgroup of `affine_qmv_*` computes.
pub const QMV_ROWS_PER_SIMDGROUP: usize = 4;
/// Simdgroups per threadgroup of `affine_qmv_*`.
pub const QMV_SIMDGROUPS: usize = 2;
/// Threads per threadgroup of `affine_dequant_*`, each writing this many values.
pub const DEQUANT_THREADS: usize = 64;
pub const DEQUANT_VALUES_PER_THREAD: usize = 8;

/// The packed words, scales and biases: the first three slots of every affine kernel (the
/// grouped GEMM's too).
pub(crate) fn weight_buffers(m: &AffineTensor, op: &str) -> Result<[(Buffer, usize); 3]> {
    metal_buffers([&m.packed, &m.scales, &m.biases], op)
}

/// The products of `call` (see [`Products`]): one launch of `affine_qmv_*` (or its SwiGLU
/// form `affine_qmv_swiglu_*`, the same geometry), `out_rows` rows of `width` values, eight
/// per threadgroup; with [`super::DenseRows::OnePass`], 2..=8 dense rows in one pass over the
/// weights (`affine_qmv_pass_*`).
pub(crate) fn products(m: &AffineTensor, call: &Products) -> Result<Tensor> {
    let (op, width, out_rows) = (call.op(), call.width(m), call.out_rows);
    let (x, ids) = (call.x, call.ids);
    let dense = call.kind == ProductKind::Plain && ids.is_none() && call.x_div == 1;
    if dense && super::dense_rows::one_pass() && PASS_ROWS.contains(&out_rows) {
        return products_in_one_pass(m, x, out_rows);
    }
    let kernel = match call.kind {
        ProductKind::Plain => "affine_qmv",
        ProductKind::Swiglu => "affine_qmv_swiglu",
    };
    let dev = metal_device(&m.packed, op)?;
    let name = kernel_instance(kernel, &[x.dtype(), m.scales.dtype()], op)?;
    let pipeline = pipeline(&dev, &SOURCE, &name)?;
    // Before the encoder is taken: candle ops lock the same command state.
    let x = x.contiguous()?;
    let ids = ids.map(|t| t.contiguous()).transpose()?;
    let y = new_output(&dev, out_rows * width, x.dtype(), &format!("{kernel}_y"))?;
    let [w, s, b] = weight_buffers(m, op)?;
    // Without ids, the words again: the kernel never reads that slot, but it must be bound.
    let idb = metal_buffer_or(ids.as_ref(), &w, op)?;
    let rows_per_group = QMV_ROWS_PER_SIMDGROUP * QMV_SIMDGROUPS;
    encode(
        &dev,
        &pipeline,
        &reads_then_writes(
            &[&w, &s, &b, &metal_buffer(&x, op)?, &idb],
            &[&from_start(&y)],
        ),
        &AffineParams::new(m, m.rows, out_rows, call.x_div, ids.is_some()),
        size(width.div_ceil(rows_per_group), out_rows, 1),
        size(32, QMV_SIMDGROUPS, 1),
        0,
    )?;
    Ok(output(&dev, y, (out_rows, width), x.dtype()))
}

/// Dense rows `affine_qmv_pass_*` takes at once (more run `affine_qmv`, a threadgroup row
/// each).
const PASS_ROWS: std::ops::RangeInclusive<usize> = 2..=8;

/// `x [rows, K] W^T` for 2..=8 dense rows in one launch of `affine_qmv_pass_*`: each weight
/// word read and unpacked once for all rows, each row's bits what `affine_qmv` gives it
/// alone (kernels/affine.metal).
fn products_in_one_pass(m: &AffineTensor, x: &Tensor, rows: usize) -> Result<Tensor> {
    const OP: &str = "affine matmul";
    let dev = metal_device(&m.packed, OP)?;
    let name = kernel_instance("affine_qmv_pass", &[x.dtype(), m.scales.dtype()], OP)?;
    let pipeline = pipeline(&dev, &SOURCE, &name)?;
    let x = x.contiguous()?;
    let y = new_output(&dev, rows * m.rows, x.dtype(), "affine_qmv_pass_y")?;
    let [w, s, b] = weight_buffers(m, OP)?;
    encode(
        &dev,
        &pipeline,
        &reads_then_writes(&[&w, &s, &b, &metal_buffer(&x, OP)?], &[&from_start(&y)]),
        &AffineParams::new(m, m.rows, rows, 1, false),
        size(
            m.rows.div_ceil(QMV_ROWS_PER_SIMDGROUP * QMV_SIMDGROUPS),
            1,
            1,
        ),
        size(32, QMV_SIMDGROUPS, 1),
        0,
    )?;
    Ok(output(&dev, y, (rows, m.rows), x.dtype()))
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
    let name = kernel_instance("affine_dequant", &[dtype, m.scales.dtype()], OP)?;
    let pipeline = pipeline(&dev, &SOURCE, &name)?;
    let ids = ids.map(|t| t.contiguous()).transpose()?;
    let out = new_output(&dev, count * m.cols, dtype, "affine_dequant_out")?;
    let per_group = DEQUANT_THREADS * DEQUANT_VALUES_PER_THREAD;
    let [w, s, b] = weight_buffers(m, OP)?;
    let idb = metal_buffer_or(ids.as_ref(), &w, OP)?;
    encode(
        &dev,
        &pipeline,
        &reads_then_writes(&[&w, &s, &b, &idb], &[&from_start(&out)]),
        &AffineParams::new(m, m.experts * m.rows, count, 1, ids.is_some()),
        size(m.cols.div_ceil(per_group), count, 1),
        size(DEQUANT_THREADS, 1, 1),
        0,
    )?;
    Ok(output(&dev, out, (count, m.cols), dtype))
}
