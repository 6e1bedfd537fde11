//! Metal host side of `gated_delta_norm_window_*` (kernels/gated_delta_norm.metal): the plain
//! op's geometry (`ops/gated_delta_norm/metal.rs`) with the window's states at buffer 9. The
//! geometry here is what `kernels/emu/gated_delta_norm_window_harness.cpp` emulates; change
//! both together.

use super::WindowInputs;
use crate::backend::kernel_instance;
use crate::backend::metal::{
    encode, from_start, metal_buffer, metal_buffer_of_view, metal_device, metal_source, new_output,
    output, pipeline, size, Binding, KernelSource,
};
use crate::ops::gated_delta::metal::InputBuffers;
use crate::ops::gated_delta_norm::supports;
use anyhow::{ensure, Result};
use candle_core::Tensor;

const SOURCE: KernelSource = metal_source!("gated_delta_norm.metal", "params/gated_delta_norm.h");

pub(crate) fn gated_delta_update_norm_window(window: &WindowInputs) -> Result<Tensor> {
    const OP: &str = "gated_delta_update_norm_window";
    let inputs = &window.inputs;
    let d = inputs.dims;
    let dev = &metal_device(inputs.state, OP)?;
    let dtype = inputs.recurrence.q.dtype();
    ensure!(
        supports(&d, dtype, inputs.state.dtype()),
        "{OP}: no Metal kernel for {d:?} with {dtype:?} activations and a {:?} state",
        inputs.state.dtype()
    );
    let name = kernel_instance(
        "gated_delta_norm_window",
        &[dtype, inputs.state.dtype()],
        OP,
    )?;
    let pipeline = pipeline(dev, &SOURCE, &name)?;
    let simdgroups = inputs.simdgroups(pipeline.max_total_threads_per_threadgroup())?;
    let params = inputs.params()?;
    let prepared = inputs.recurrence.prepare()?;
    let len = d.batch * d.steps * d.value_heads * d.value_dim;
    let out = new_output(dev, len, dtype, "gated_delta_norm_window_out")?;
    if len > 0 {
        let b = InputBuffers::new(&prepared, inputs.state, OP)?;
        let z = metal_buffer_of_view(inputs.z, OP)?;
        let weight = metal_buffer(inputs.weight, OP)?;
        let after = metal_buffer(window.after, OP)?;
        let out_buf = from_start(&out);
        let mut bindings = b.recurrence_bindings();
        bindings.extend([
            Binding::Read(&z),
            Binding::Read(&weight),
            Binding::Write(&out_buf),
            Binding::Write(&after),
        ]);
        encode(
            dev,
            &pipeline,
            &bindings,
            &params,
            size(d.batch * d.value_heads, 1, 1),
            size(32, simdgroups, 1),
            (2 * simdgroups * std::mem::size_of::<f32>()).next_multiple_of(16),
        )?;
    }
    let shape = (d.batch, d.steps, d.value_heads, d.value_dim);
    Ok(output(dev, out, shape, dtype))
}
