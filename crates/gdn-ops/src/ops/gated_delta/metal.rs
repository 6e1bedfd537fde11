//! Metal host side of the fused gated-delta kernel (`kernels/gated_delta.metal`).
//!
//! A call binds any number of tensors (beyond candle's
//! three-input custom-op limit), declares every buffer it reads or writes to candle's
//! encoder so that hazards are tracked, and advances the state buffer in place.

use super::{kernel_name, GdnDims, GdnParams, Inputs, Prepared};
use crate::backend::metal::{
    encode, from_start, metal_buffer, metal_buffer_or, metal_buffers, metal_device, metal_source,
    new_output, output, pipeline, size, Binding, KernelSource,
};
use anyhow::{ensure, Result};
use candle_core::Tensor;
use candle_metal_kernels::metal::Buffer;

const SOURCE: KernelSource = metal_source!("gated_delta.metal", "params/gated_delta.h");

/// Simdgroups (state rows) per threadgroup, as in mlx-lm's launch.
const ROWS_PER_THREADGROUP: usize = 4;
/// Each lane keeps `Dk / 32` state values in registers; the kernel holds at most 8.
const MAX_KEY_DIM: usize = 256;

/// The buffers of a call's prepared inputs and state: what the recurrence kernel here, the
/// chunk kernels (`metal_chunked.rs`) and the fused norm (`gated_delta_norm`) bind.
pub(crate) struct InputBuffers {
    pub(crate) q: (Buffer, usize),
    pub(crate) k: (Buffer, usize),
    pub(crate) v: (Buffer, usize),
    pub(crate) g: (Buffer, usize),
    pub(crate) beta: (Buffer, usize),
    /// Read and written in place: bound as written, so that later readers wait for it.
    pub(crate) state: (Buffer, usize),
    /// Without a mask, g fills the slot: the kernels never read it then (has_mask = 0).
    pub(crate) mask: (Buffer, usize),
}

impl InputBuffers {
    pub(crate) fn new(inputs: &Prepared, state: &Tensor, op: &str) -> Result<Self> {
        let [q, k, v, g, beta] = metal_buffers(
            [&inputs.q, &inputs.k, &inputs.v, &inputs.g, &inputs.beta],
            op,
        )?;
        let state = metal_buffer(state, op)?;
        let mask = metal_buffer_or(inputs.mask.as_ref(), &g, op)?;
        Ok(Self {
            q,
            k,
            v,
            g,
            beta,
            state,
            mask,
        })
    }
}

impl InputBuffers {
    /// q, k, v, g and beta read, the state written (in place): the leading slots of the
    /// recurrence kernels (`gated_delta_step_*`, and `gated_delta_norm_*` of the fused norm).
    pub(crate) fn recurrence_bindings(&self) -> Vec<Binding<'_>> {
        vec![
            Binding::Read(&self.q),
            Binding::Read(&self.k),
            Binding::Read(&self.v),
            Binding::Read(&self.g),
            Binding::Read(&self.beta),
            Binding::Write(&self.state),
        ]
    }
}

pub(crate) fn gated_delta_update(dims: GdnDims, inputs: &Inputs, state: &Tensor) -> Result<Tensor> {
    const OP: &str = "gated_delta_update";
    let dev = &metal_device(state, OP)?;
    ensure!(
        dims.key_dim % 32 == 0 && dims.key_dim <= MAX_KEY_DIM,
        "gated_delta_update: the Metal kernel needs a key head dim that is a multiple of 32 up to {MAX_KEY_DIM} (got {})",
        dims.key_dim
    );
    ensure!(
        state.is_contiguous(),
        "gated_delta_update: the state must be contiguous to be updated in place"
    );
    let prepared = inputs.prepare()?;
    let in_dtype = prepared.q.dtype();
    let name = kernel_name(in_dtype, state.dtype())?;
    let pipeline = pipeline(dev, &SOURCE, &name)?;
    let y_len = dims.batch * dims.steps * dims.value_heads * dims.value_dim;
    let y_buffer = new_output(dev, y_len, in_dtype, "gated_delta_y")?;
    let params = GdnParams::new(&dims, prepared.mask.is_some());
    let b = InputBuffers::new(&prepared, state, OP)?;
    let y_buf = from_start(&y_buffer);
    let mut bindings = b.recurrence_bindings();
    bindings.extend([Binding::Write(&y_buf), Binding::Read(&b.mask)]);
    encode(
        dev,
        &pipeline,
        &bindings,
        &params,
        size(
            1,
            dims.value_dim.div_ceil(ROWS_PER_THREADGROUP),
            dims.batch * dims.value_heads,
        ),
        size(32, ROWS_PER_THREADGROUP, 1),
        0,
    )?;
    let shape = (dims.batch, dims.steps, dims.value_heads, dims.value_dim);
    Ok(output(dev, y_buffer, shape, in_dtype))
}
