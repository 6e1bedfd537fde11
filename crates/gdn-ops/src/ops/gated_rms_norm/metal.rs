//! Metal host side of `kernels/gated_rms_norm.metal`: binding and launch geometry. The
//! geometry here is what `kernels/emu/gated_rms_norm_harness.cpp` emulates; change both
//! together.

use super::Inputs;
use crate::backend::kernel_instance;
use crate::backend::metal::{
    encode, from_start, metal_buffer, metal_buffer_of_view, metal_device, metal_source, new_output,
    output, pipeline, reads_then_writes, size, KernelSource,
};
use anyhow::Result;
use candle_core::Tensor;

const SOURCE: KernelSource = metal_source!("gated_rms_norm.metal", "params/gated_rms_norm.h");

/// Simdgroups (rows) per threadgroup.
pub const ROWS_PER_THREADGROUP: usize = 4;

pub(crate) fn gated_rms_norm(inputs: &Inputs) -> Result<Tensor> {
    const OP: &str = "gated_rms_norm";
    let dev = &metal_device(inputs.y, OP)?;
    let dtype = inputs.y.dtype();
    let name = kernel_instance("gated_rms_norm", &[dtype], OP)?;
    let pipeline = pipeline(dev, &SOURCE, &name)?;
    let params = inputs.params()?;
    let len = inputs.y.elem_count();
    let out = new_output(dev, len, dtype, "gated_rms_norm_out")?;
    if len > 0 {
        let y = metal_buffer(inputs.y, OP)?;
        // z may be a view: its row layout was checked by the caller.
        let z = metal_buffer_of_view(inputs.z, OP)?;
        let weight = metal_buffer(inputs.weight, OP)?;
        let out_buf = from_start(&out);
        encode(
            dev,
            &pipeline,
            &reads_then_writes(&[&y, &z, &weight], &[&out_buf]),
            &params,
            size(1, inputs.rows().div_ceil(ROWS_PER_THREADGROUP), 1),
            size(32, ROWS_PER_THREADGROUP, 1),
            0,
        )?;
    }
    Ok(output(dev, out, inputs.y.dims(), dtype))
}
