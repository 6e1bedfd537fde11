//! Metal host side of `kernels/add_rms_norm.metal`: one simdgroup per row.
//!
//! The geometry here is what `kernels/emu/add_rms_norm_harness.cpp` emulates; change both
//! together.

use super::{row_threads, Inputs};
use crate::backend::kernel_instance;
use crate::backend::metal::{
    encode, from_start, metal_buffer, metal_buffer_or, metal_device, metal_source, new_output,
    output, pipeline, size, Binding, KernelSource,
};
use anyhow::Result;
use candle_core::Tensor;

const SOURCE: KernelSource = metal_source!("add_rms_norm.metal", "params/add_rms_norm.h");

pub(crate) fn add_rms_norm(inputs: &Inputs) -> Result<(Tensor, Tensor)> {
    const OP: &str = "add_rms_norm";
    let (rows, cols) = (inputs.rows(), inputs.cols);
    let dev = &metal_device(inputs.residual, OP)?;
    let dtype = inputs.residual.dtype();
    let name = kernel_instance("add_rms_norm", &[dtype], OP)?;
    let pipeline = pipeline(dev, &SOURCE, &name)?;
    // Before the encoder is taken: candle ops lock the same command state.
    let residual = inputs.residual.contiguous()?;
    let delta = inputs.delta.map(|d| d.contiguous()).transpose()?;
    let weight = inputs.weight.contiguous()?;
    let normed = new_output(dev, rows * cols, dtype, "add_rms_norm_normed")?;
    let sum = match delta {
        Some(_) => Some(new_output(dev, rows * cols, dtype, "add_rms_norm_sum")?),
        None => None,
    };
    let rb = metal_buffer(&residual, OP)?;
    // Never read without a delta (has_delta = 0).
    let db = metal_buffer_or(delta.as_ref(), &rb, OP)?;
    let wb = metal_buffer(&weight, OP)?;
    let nb = from_start(&normed);
    let sb = sum.as_deref().map(from_start);
    let sum_binding = match &sb {
        Some(s) => Binding::Write(s),
        // Never written without a delta.
        None => Binding::Read(&rb),
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
        &inputs.params(),
        size(rows, 1, 1),
        size(row_threads(cols), 1, 1),
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
