//! The host's split of a chunked gated-delta call on a GPU, shared by the Metal and CUDA
//! chunk kernels (`metal_chunked.rs`, `cuda_chunked.rs`): the first `floor(T / 64)` chunks of
//! 64 tokens through the chunk kernel, the tail (`T % 64` tokens) through the recurrence
//! kernel, on the same state.
//!
//! The state is rounded to its dtype once per call, as with the recurrence alone: a bf16 state
//! that goes through both kernels is widened to an f32 copy for them and rounded back once.

use super::{ensure_state_dtype, gated_delta_update_in, GdnDims, GdnForm, Inputs};
use crate::backend::kernel_instance;
use anyhow::Result;
use candle_core::{DType, Tensor};

/// Tokens per chunk of every chunk kernel (fla's chunk size).
pub const CHUNK: usize = 64;

/// `GdnChunkParams` of kernels/params/gated_delta_chunk.h, field for field.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct GdnChunkParams {
    pub(crate) batch: u32,
    pub(crate) steps: u32,
    pub(crate) chunks: u32,
    pub(crate) key_heads: u32,
    pub(crate) value_heads: u32,
    pub(crate) key_dim: u32,
    pub(crate) value_dim: u32,
    pub(crate) has_mask: u32,
}

impl GdnChunkParams {
    pub(crate) fn new(dims: &GdnDims, chunks: usize, has_mask: bool) -> Self {
        Self {
            batch: dims.batch as u32,
            steps: dims.steps as u32,
            chunks: chunks as u32,
            key_heads: dims.key_heads as u32,
            value_heads: dims.value_heads as u32,
            key_dim: dims.key_dim as u32,
            value_dim: dims.value_dim as u32,
            has_mask: has_mask as u32,
        }
    }
}

/// The three passes' instantiations (`kernels/gated_delta_chunk.{metal,cu}`) for activations
/// of `input` and a state of `state` dtype: prep, state and out.
pub(crate) fn kernel_names(input: DType, state: DType) -> Result<[String; 3]> {
    const OP: &str = "gated_delta_chunked";
    ensure_state_dtype(state, OP)?;
    Ok([
        kernel_instance("gated_delta_chunk_prep", &[input], OP)?,
        kernel_instance("gated_delta_chunk_state", &[input, state], OP)?,
        kernel_instance("gated_delta_chunk_out", &[input], OP)?,
    ])
}

/// Runs `run_chunks(inputs, state, chunks)` (the device's chunk kernel over `chunks` full
/// chunks from token 0, writing y for those tokens and advancing `state` in place) and the
/// recurrence over the tail; returns y `[B, T, Hv, Dv]` in q's dtype.
pub(crate) fn split_update(
    dims: GdnDims,
    inputs: &Inputs,
    state: &Tensor,
    run_chunks: impl Fn(&Inputs, &Tensor, usize) -> Result<Tensor>,
) -> Result<Tensor> {
    let chunks = dims.steps / CHUNK;
    let done = chunks * CHUNK;
    let tail = dims.steps - done;
    let Inputs {
        q,
        k,
        v,
        g,
        beta,
        mask,
    } = *inputs;
    if chunks == 0 {
        return gated_delta_update_in(GdnForm::Recurrent, q, k, v, g, beta, state, mask);
    }
    if tail == 0 {
        return run_chunks(inputs, state, chunks);
    }
    // One rounding of a bf16 state for the two kernels: both advance an f32 copy.
    let work = if state.dtype() == DType::F32 {
        state.clone()
    } else {
        state.to_dtype(DType::F32)?
    };
    let y = run_chunks(inputs, &work, chunks)?;
    let rest = |t: &Tensor| t.narrow(1, done, tail)?.contiguous();
    let mask_tail = mask.map(rest).transpose()?;
    let y_tail = gated_delta_update_in(
        GdnForm::Recurrent,
        &rest(q)?,
        &rest(k)?,
        &rest(v)?,
        &rest(g)?,
        &rest(beta)?,
        &work,
        mask_tail.as_ref(),
    )?;
    y.slice_set(&y_tail, 1, done)?;
    if state.dtype() != DType::F32 {
        state.slice_set(&work.to_dtype(state.dtype())?, 0, 0)?;
    }
    Ok(y)
}
