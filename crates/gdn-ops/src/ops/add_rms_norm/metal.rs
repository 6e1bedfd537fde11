//! Metal host side of `kernels/add_rms_norm.metal`: one simdgroup per row.
//!
//! The geometry here is what `kernels/emu/add_rms_norm_harness.cpp` emulates; change both
//! together.

use super::{row_threads, AddRmsNormParams};
use crate::backend::dtype_tag;
use crate::backend::metal::{
    encode, metal_buffer, metal_device, metal_source, new_output, output, pipeline, Binding,
    KernelSource,
};
use anyhow::Result;
use candle_core::Tensor;
use objc2_metal::MTLSize;

const SOURCE: KernelSource = metal_source!("add_rms_norm.metal", "params/add_rms_norm.h");

pub(crate) fn add_rms_norm(
    residual: &Tensor,
    delta: Option<&Tensor>,
    weight: &Tensor,
    eps: f32,
    rows: usize,
    cols: usize,
) -> Result<(Tensor, Tensor)> {
    const OP: &str = "add_rms_norm";
    let dev = &metal_device(residual, OP)?;
    let dtype = residual.dtype();
    let name = format!("add_rms_norm_{}", dtype_tag(dtype, OP)?);
    let pipeline = pipeline(dev, &SOURCE, &name)?;
    // Before the encoder is taken: candle ops lock the same command state.
    let residual = residual.contiguous()?;
    let delta = delta.map(|d| d.contiguous()).transpose()?;
    let weight = weight.contiguous()?;
    let normed = new_output(dev, rows * cols, dtype, "add_rms_norm_normed")?;
    let sum = match delta {
        Some(_) => Some(new_output(dev, rows * cols, dtype, "add_rms_norm_sum")?),
        None => None,
    };
    let rb = metal_buffer(&residual, OP)?;
    let db = match &delta {
        Some(d) => metal_buffer(d, OP)?,
        // Never read without a delta (has_delta = 0).
        None => rb.clone(),
    };
    let wb = metal_buffer(&weight, OP)?;
    let nb = (normed.as_ref().clone(), 0);
    let sb = sum.as_ref().map(|s| (s.as_ref().clone(), 0));
    let sum_binding = match &sb {
        Some(s) => Binding::Write(s),
        // Never written without a delta.
        None => Binding::Read(&rb),
    };
    let params = AddRmsNormParams {
        rows: rows as u32,
        cols: cols as u32,
        has_delta: delta.is_some() as u32,
        eps,
    };
    encode(
        dev,
        &pipeline,
        &[
            Binding::Read(&rb),
            Binding::Read(&db),
            Binding::Read(&wb),
            sum_binding,
            Binding::Write(&nb),
        ],
        &params,
        MTLSize {
            width: rows,
            height: 1,
            depth: 1,
        },
        MTLSize {
            width: row_threads(cols),
            height: 1,
            depth: 1,
        },
        // The simdgroups' partial sums of squares: 32 floats.
        32 * 4,
    )?;
    let shape = residual.shape().clone();
    let normed = output(dev, normed, shape.clone(), dtype);
    let sum = match sum {
        Some(s) => output(dev, s, shape, dtype),
        None => residual,
    };
    Ok((sum, normed))
}
