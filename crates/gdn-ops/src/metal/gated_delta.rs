//! Metal host side of the fused gated-delta kernel (`kernels/gated_delta.metal`).
//!
//! A call binds any number of tensors (beyond candle's
//! three-input custom-op limit), declares every buffer it reads or writes to candle's
//! encoder so that hazards are tracked, and advances the state buffer in place.

use super::{metal_buffer, metal_device, pipeline, KernelSource};
use crate::{GdnDims, Inputs};
use anyhow::{bail, ensure, Context, Result};
use candle_core::op::BackpropOp;
use candle_core::{DType, MetalStorage, Storage, Tensor};
use objc2_metal::MTLSize;

/// Must match `GdnParams` in the kernel source field for field.
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

fn dtype_tag(dtype: DType) -> Result<&'static str> {
    Ok(match dtype {
        DType::F32 => "f32",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        other => bail!("gated_delta_update: no Metal kernel for {other:?}"),
    })
}

/// The kernel instantiation for activations of `input` and a state of `state` dtype.
pub fn kernel_name(input: DType, state: DType) -> Result<String> {
    ensure!(
        matches!(state, DType::F32 | DType::BF16),
        "gated_delta_update: the state must be f32 or bf16"
    );
    Ok(format!(
        "gated_delta_step_{}_{}",
        dtype_tag(input)?,
        dtype_tag(state)?
    ))
}

pub(crate) fn gated_delta_update(dims: GdnDims, inputs: &Inputs, state: &Tensor) -> Result<Tensor> {
    let Inputs {
        q,
        k,
        v,
        g,
        beta,
        mask,
    } = *inputs;
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
    let in_dtype = q.dtype();
    let name = kernel_name(in_dtype, state.dtype())?;
    let pipeline = pipeline(dev, KernelSource::GatedDelta, &name)?;
    // Inputs in the kernel's layouts and dtypes. Done before taking the encoder: candle ops
    // lock the same command state.
    let (q, k, v) = (
        q.contiguous()?,
        k.to_dtype(in_dtype)?.contiguous()?,
        v.to_dtype(in_dtype)?.contiguous()?,
    );
    let (g, beta) = (
        g.to_dtype(DType::F32)?.contiguous()?,
        beta.to_dtype(DType::F32)?.contiguous()?,
    );
    let mask = match mask {
        Some(m) => Some(m.to_dtype(DType::F32)?.contiguous()?),
        None => None,
    };
    let y_len = dims.batch * dims.steps * dims.value_heads * dims.value_dim;
    let y_buffer = dev
        .new_buffer(y_len, in_dtype, "gated_delta_y")
        .context("allocating y")?;
    let params = GdnParams {
        batch: dims.batch as u32,
        steps: dims.steps as u32,
        key_heads: dims.key_heads as u32,
        value_heads: dims.value_heads as u32,
        key_dim: dims.key_dim as u32,
        value_dim: dims.value_dim as u32,
        has_mask: mask.is_some() as u32,
    };
    let inputs = [
        metal_buffer(&q, OP)?,
        metal_buffer(&k, OP)?,
        metal_buffer(&v, OP)?,
        metal_buffer(&g, OP)?,
        metal_buffer(&beta, OP)?,
    ];
    let state_buf = metal_buffer(state, OP)?;
    // Without a mask the kernel never reads buffer 7; bind g so the slot is valid.
    let mask_buf = match &mask {
        Some(m) => metal_buffer(m, OP)?,
        None => inputs[3].clone(),
    };
    {
        let guard = dev.command_encoder()?;
        let encoder: &candle_metal_kernels::metal::ComputeCommandEncoder = guard.as_ref();
        encoder.set_compute_pipeline_state(&pipeline);
        for (slot, (buf, offset)) in inputs.iter().enumerate() {
            encoder.set_input_buffer(slot, Some(buf), *offset);
        }
        // Read and written in place: declared as an output so later readers wait for it.
        encoder.set_output_buffer(5, Some(&state_buf.0), state_buf.1);
        encoder.set_output_buffer(6, Some(&y_buffer), 0);
        encoder.set_input_buffer(7, Some(&mask_buf.0), mask_buf.1);
        encoder.set_bytes(8, &params);
        let groups = MTLSize {
            width: 1,
            height: dims.value_dim.div_ceil(ROWS_PER_THREADGROUP),
            depth: dims.batch * dims.value_heads,
        };
        let threads = MTLSize {
            width: 32,
            height: ROWS_PER_THREADGROUP,
            depth: 1,
        };
        encoder.dispatch_thread_groups(groups, threads);
    }
    let storage = MetalStorage::new(y_buffer, dev.clone(), y_len, in_dtype);
    let shape = (dims.batch, dims.steps, dims.value_heads, dims.value_dim);
    Ok(Tensor::from_storage(
        Storage::Metal(storage),
        shape,
        BackpropOp::none(),
        false,
    ))
}
