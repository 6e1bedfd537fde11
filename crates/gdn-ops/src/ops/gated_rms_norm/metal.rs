//! Metal host side of `kernels/gated_rms_norm.metal`: binding and launch geometry. The
//! geometry here is what `kernels/emu/gated_rms_norm_harness.cpp` emulates; change both
//! together.

use super::Inputs;
use crate::backend::dtype_tag;
use crate::backend::metal::{
    encode, metal_buffer, metal_buffer_of_view, metal_device, metal_source, new_output, output,
    pipeline, Binding, KernelSource,
};
use anyhow::Result;
use candle_core::Tensor;
use objc2_metal::MTLSize;

const SOURCE: KernelSource = metal_source!("gated_rms_norm.metal", "params/gated_rms_norm.h");

/// Simdgroups (rows) per threadgroup.
pub const ROWS_PER_THREADGROUP: usize = 4;

pub(crate) fn gated_rms_norm(inputs: &Inputs) -> Result<Tensor> {
    const OP: &str = "gated_rms_norm";
    let dev = &metal_device(inputs.y, OP)?;
    let dtype = inputs.y.dtype();
    let name = format!("gated_rms_norm_{}", dtype_tag(dtype, OP)?);
    let pipeline = pipeline(dev, &SOURCE, &name)?;
    let params = inputs.params()?;
    let len = inputs.y.elem_count();
    let out = new_output(dev, len, dtype, "gated_rms_norm_out")?;
    if len > 0 {
        let y = metal_buffer(inputs.y, OP)?;
        // z may be a view: its row layout was checked by the caller.
        let z = metal_buffer_of_view(inputs.z, OP)?;
        let weight = metal_buffer(inputs.weight, OP)?;
        let out_buf = (out.as_ref().clone(), 0);
        encode(
            dev,
            &pipeline,
            &[
                Binding::Read(&y),
                Binding::Read(&z),
                Binding::Read(&weight),
                Binding::Write(&out_buf),
            ],
            &params,
            MTLSize {
                width: 1,
                height: inputs.rows().div_ceil(ROWS_PER_THREADGROUP),
                depth: 1,
            },
            MTLSize {
                width: 32,
                height: ROWS_PER_THREADGROUP,
                depth: 1,
            },
            0,
        )?;
    }
    Ok(output(dev, out, inputs.y.dims(), dtype))
}
