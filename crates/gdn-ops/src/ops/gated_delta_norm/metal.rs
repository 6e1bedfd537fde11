//! Metal host side of `kernels/gated_delta_norm.metal`: binding and launch geometry, of the
//! plain entries and of the window entries (`ops/gated_delta_norm_window`: the same geometry,
//! the window's states one more buffer). The geometry here is what
//! `kernels/emu/gated_delta_norm_harness.cpp` and `gated_delta_norm_window_harness.cpp`
//! emulate; change them together.

use super::{supports, Inputs};
use crate::backend::kernel_instance;
use crate::backend::metal::{
    encode, from_start, metal_buffer, metal_buffer_of_view, metal_device, metal_source, new_output,
    output, pipeline, size, Binding, KernelSource,
};
use crate::ops::gated_delta::metal::InputBuffers;
use anyhow::{ensure, Result};
use candle_core::Tensor;

const SOURCE: KernelSource = metal_source!("gated_delta_norm.metal", "params/gated_delta_norm.h");

pub(crate) fn gated_delta_update_norm(inputs: &Inputs) -> Result<Tensor> {
    launch_entry(inputs, None, "gated_delta_update_norm")
}

/// A launch of `gated_delta_norm_*`, or, given `after` (`[T − 1, B, Hv, Dv, Dk]`, checked by
/// the caller), of `gated_delta_norm_window_*` with it bound after the output (buffer 9).
pub(crate) fn launch_entry(inputs: &Inputs, after: Option<&Tensor>, op: &str) -> Result<Tensor> {
    let d = inputs.dims;
    let dev = &metal_device(inputs.state, op)?;
    let dtype = inputs.recurrence.q.dtype();
    ensure!(
        supports(&d, dtype, inputs.state.dtype()),
        "{op}: no Metal kernel for {d:?} with {dtype:?} activations and a {:?} state",
        inputs.state.dtype()
    );
    let kernel = match after {
        Some(_) => "gated_delta_norm_window",
        None => "gated_delta_norm",
    };
    let name = kernel_instance(kernel, &[dtype, inputs.state.dtype()], op)?;
    let pipeline = pipeline(dev, &SOURCE, &name)?;
    // As many simdgroups as this pipeline allows (its registers bound the threads).
    let simdgroups = inputs.simdgroups(pipeline.max_total_threads_per_threadgroup())?;
    let params = inputs.params()?;
    // Before the encoder is taken: candle ops lock the same command state. Contiguous copies
    // where needed; the dtypes were checked (no conversion) and there is no mask.
    let prepared = inputs.recurrence.prepare()?;
    let len = d.batch * d.steps * d.value_heads * d.value_dim;
    let out = new_output(dev, len, dtype, "gated_delta_norm_out")?;
    if len > 0 {
        let b = InputBuffers::new(&prepared, inputs.state, op)?;
        // z may be a view: its row layout was checked by the caller.
        let z = metal_buffer_of_view(inputs.z, op)?;
        let weight = metal_buffer(inputs.weight, op)?;
        let after = after.map(|a| metal_buffer(a, op)).transpose()?;
        let out_buf = from_start(&out);
        let mut bindings = b.recurrence_bindings();
        bindings.extend([
            Binding::Read(&z),
            Binding::Read(&weight),
            Binding::Write(&out_buf),
        ]);
        bindings.extend(after.as_ref().map(Binding::Write));
        encode(
            dev,
            &pipeline,
            &bindings,
            &params,
            size(d.batch * d.value_heads, 1, 1),
            size(32, simdgroups, 1),
            // Two halves of one partial sum per simdgroup, in 16-byte units.
            (2 * simdgroups * std::mem::size_of::<f32>()).next_multiple_of(16),
        )?;
    }
    let shape = (d.batch, d.steps, d.value_heads, d.value_dim);
    Ok(output(dev, out, shape, dtype))
}
