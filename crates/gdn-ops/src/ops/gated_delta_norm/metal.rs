//! Metal host side of `kernels/gated_delta_norm.metal`: binding and launch geometry. The
//! geometry here is what `kernels/emu/gated_delta_norm_harness.cpp` emulates; change both
//! together.

use super::{supports, Inputs};
use crate::backend::dtype_tag;
use crate::backend::metal::{
    encode, metal_buffer, metal_buffer_of_view, metal_device, metal_source, new_output, output,
    pipeline, Binding, KernelSource,
};
use anyhow::{ensure, Result};
use candle_core::Tensor;
use objc2_metal::MTLSize;

const SOURCE: KernelSource = metal_source!("gated_delta_norm.metal", "params/gated_delta_norm.h");

pub(crate) fn gated_delta_update_norm(inputs: &Inputs) -> Result<Tensor> {
    const OP: &str = "gated_delta_update_norm";
    let r = &inputs.recurrence;
    let d = inputs.dims;
    let dev = &metal_device(inputs.state, OP)?;
    let dtype = r.q.dtype();
    ensure!(
        supports(&d, dtype, inputs.state.dtype()),
        "{OP}: no Metal kernel for {d:?} with {dtype:?} activations and a {:?} state",
        inputs.state.dtype()
    );
    let name = format!(
        "gated_delta_norm_{}_{}",
        dtype_tag(dtype, OP)?,
        dtype_tag(inputs.state.dtype(), OP)?
    );
    let pipeline = pipeline(dev, &SOURCE, &name)?;
    // As many simdgroups as this pipeline allows (its registers bound the threads).
    let simdgroups = inputs.simdgroups(pipeline.max_total_threads_per_threadgroup())?;
    let params = inputs.params()?;
    // Before the encoder is taken: candle ops lock the same command state.
    let (q, k, v, g, beta) = (
        r.q.contiguous()?,
        r.k.contiguous()?,
        r.v.contiguous()?,
        r.g.contiguous()?,
        r.beta.contiguous()?,
    );
    let len = d.batch * d.steps * d.value_heads * d.value_dim;
    let out = new_output(dev, len, dtype, "gated_delta_norm_out")?;
    if len > 0 {
        let [qb, kb, vb, gb, bb] = [&q, &k, &v, &g, &beta].map(|t| metal_buffer(t, OP));
        let (qb, kb, vb, gb, bb) = (qb?, kb?, vb?, gb?, bb?);
        let state = metal_buffer(inputs.state, OP)?;
        // z may be a view: its row layout was checked by the caller.
        let z = metal_buffer_of_view(inputs.z, OP)?;
        let weight = metal_buffer(inputs.weight, OP)?;
        let out_buf = (out.as_ref().clone(), 0);
        encode(
            dev,
            &pipeline,
            &[
                Binding::Read(&qb),
                Binding::Read(&kb),
                Binding::Read(&vb),
                Binding::Read(&gb),
                Binding::Read(&bb),
                // Read and written in place: declared as written so later readers wait.
                Binding::Write(&state),
                Binding::Read(&z),
                Binding::Read(&weight),
                Binding::Write(&out_buf),
            ],
            &params,
            MTLSize {
                width: d.batch * d.value_heads,
                height: 1,
                depth: 1,
            },
            MTLSize {
                width: 32,
                height: simdgroups,
                depth: 1,
            },
            // Two halves of one partial sum per simdgroup, in 16-byte units.
            (2 * simdgroups * std::mem::size_of::<f32>()).next_multiple_of(16),
        )?;
    }
    let shape = (d.batch, d.steps, d.value_heads, d.value_dim);
    Ok(output(dev, out, shape, dtype))
}
