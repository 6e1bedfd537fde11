//! Metal host side of the fused gated-delta kernel (`kernels/gated_delta.metal`).
//!
//! A call binds any number of tensors (beyond candle's
//! three-input custom-op limit), declares every buffer it reads or writes to candle's
//! encoder so that hazards are tracked, and advances the state buffer in place.

use super::{GdnDims, Inputs, Prepared};
use crate::backend::dtype_tag;
use crate::backend::metal::{
    encode, metal_buffer, metal_device, metal_source, new_output, output, pipeline, Binding,
    KernelSource,
};
use anyhow::{ensure, Result};
use candle_core::{DType, Tensor};
use objc2_metal::MTLSize;

const SOURCE: KernelSource = metal_source!("gated_delta.metal", "params/gated_delta.h");

/// `GdnParams` of kernels/params/gated_delta.h, field for field.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct GdnParams {
    batch: u32,
    steps: u32,
    key_heads: u32,
    value_heads: u32,
    key_dim: u32,
    value_dim: u32,
    has_mask: u32,
}

/// Simdgroups (state rows) per threadgroup, as in mlx-lm's launch.
const ROWS_PER_THREADGROUP: usize = 4;
/// Each lane keeps `Dk / 32` state values in registers; the kernel holds at most 8.
const MAX_KEY_DIM: usize = 256;

/// The kernel instantiation for activations of `input` and a state of `state` dtype.
pub fn kernel_name(input: DType, state: DType) -> Result<String> {
    ensure!(
        matches!(state, DType::F32 | DType::BF16),
        "gated_delta_update: the state must be f32 or bf16"
    );
    Ok(format!(
        "gated_delta_step_{}_{}",
        dtype_tag(input, "gated_delta_update")?,
        dtype_tag(state, "gated_delta_update")?
    ))
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
    let Prepared {
        q,
        k,
        v,
        g,
        beta,
        mask,
    } = inputs.prepare()?;
    let in_dtype = q.dtype();
    let name = kernel_name(in_dtype, state.dtype())?;
    let pipeline = pipeline(dev, &SOURCE, &name)?;
    let y_len = dims.batch * dims.steps * dims.value_heads * dims.value_dim;
    let y_buffer = new_output(dev, y_len, in_dtype, "gated_delta_y")?;
    let params = GdnParams {
        batch: dims.batch as u32,
        steps: dims.steps as u32,
        key_heads: dims.key_heads as u32,
        value_heads: dims.value_heads as u32,
        key_dim: dims.key_dim as u32,
        value_dim: dims.value_dim as u32,
        has_mask: mask.is_some() as u32,
    };
    let [qb, kb, vb, gb, bb] = [&q, &k, &v, &g, &beta].map(|t| metal_buffer(t, OP));
    let (qb, kb, vb, gb, bb) = (qb?, kb?, vb?, gb?, bb?);
    let state_buf = metal_buffer(state, OP)?;
    let y_buf = (y_buffer.as_ref().clone(), 0);
    // Without a mask the kernel never reads buffer 7; bind g so the slot is valid.
    let mask_buf = match &mask {
        Some(m) => metal_buffer(m, OP)?,
        None => gb.clone(),
    };
    encode(
        dev,
        &pipeline,
        &[
            Binding::Read(&qb),
            Binding::Read(&kb),
            Binding::Read(&vb),
            Binding::Read(&gb),
            Binding::Read(&bb),
            // Read and written in place: declared as written so later readers wait for it.
            Binding::Write(&state_buf),
            Binding::Write(&y_buf),
            Binding::Read(&mask_buf),
        ],
        &params,
        MTLSize {
            width: 1,
            height: dims.value_dim.div_ceil(ROWS_PER_THREADGROUP),
            depth: dims.batch * dims.value_heads,
        },
        MTLSize {
            width: 32,
            height: ROWS_PER_THREADGROUP,
            depth: 1,
        },
        0,
    )?;
    let shape = (dims.batch, dims.steps, dims.value_heads, dims.value_dim);
    Ok(output(dev, y_buffer, shape, in_dtype))
}
