//! Metal host side of the chunked gated-delta kernels (`kernels/gated_delta_chunk.metal`,
//! simdgroup matrices): the prefill form of the recurrence in `metal.rs`, 64 tokens per chunk
//! as three dispatches (every chunk's local part in parallel, the state pass over the chunks in
//! sequence, y in parallel), with the tail run by the recurrence kernel (`chunked.rs`).

use super::chunked::{split_update, GdnChunkParams, CHUNK};
use super::{GdnDims, Inputs, Prepared};
use crate::backend::dtype_tag;
use crate::backend::metal::{
    encode, metal_buffer, metal_device, metal_source, new_output, output, pipeline, Binding,
    KernelSource,
};
use anyhow::{ensure, Result};
use candle_core::{DType, Tensor};
use candle_metal_kernels::metal::Buffer;
use objc2_metal::MTLSize;

const OP: &str = "gated_delta_chunked";
const SOURCE: KernelSource = metal_source!("gated_delta_chunk.metal", "params/gated_delta_chunk.h");

/// Value columns per threadgroup of the state pass (`kBlockV`), one 8-column tile per
/// simdgroup.
const BLOCK_V: usize = 32;
/// Threads per threadgroup of every pass (`kThreads`): 4 simdgroups.
const THREADS: usize = 128;
/// Threadgroup memory of each pass (`kPrepFloats`, `kStateFloats`, `kOutFloats` floats), all
/// under Metal's 32 KB: the gates, -L and a 64x8 right-hand side per simdgroup; the gates, V'
/// [64][32] and a 64x8 staging per simdgroup; the gates, the decay diagonals, P and the staging.
const PREP_BYTES: usize = (3 * CHUNK + CHUNK * CHUNK + 4 * 8 * CHUNK) * 4;
const STATE_BYTES: usize = (CHUNK + CHUNK * BLOCK_V + 4 * 8 * CHUNK) * 4;
const OUT_BYTES: usize = (2 * CHUNK + 8 * 64 + CHUNK * CHUNK + 4 * 8 * CHUNK) * 4;
/// The state tiles in registers: Dk / 8 of them, at most 32.
const MAX_KEY_DIM: usize = 256;

/// Whether the kernel takes these dims (else the caller runs the recurrence).
pub fn supports(dims: &GdnDims) -> bool {
    dims.key_dim.is_multiple_of(8)
        && (8..=MAX_KEY_DIM).contains(&dims.key_dim)
        && dims.value_dim.is_multiple_of(BLOCK_V)
        && dims.value_dim > 0
        && dims.key_heads > 0
        // An empty grid is no launch: the recurrence path handles empty calls.
        && dims.batch * dims.value_heads > 0
}

/// The three passes' instantiations for activations of `input` and a state of `state` dtype.
pub fn kernel_names(input: DType, state: DType) -> Result<[String; 3]> {
    ensure!(
        matches!(state, DType::F32 | DType::BF16),
        "{OP}: the state must be f32 or bf16"
    );
    let (i, s) = (dtype_tag(input, OP)?, dtype_tag(state, OP)?);
    Ok([
        format!("gated_delta_chunk_prep_{i}"),
        format!("gated_delta_chunk_state_{i}_{s}"),
        format!("gated_delta_chunk_out_{i}"),
    ])
}

pub(crate) fn gated_delta_update(dims: GdnDims, inputs: &Inputs, state: &Tensor) -> Result<Tensor> {
    ensure!(
        supports(&dims),
        "{OP}: the Metal chunk kernel needs a key head dim that is a multiple of 8 up to {MAX_KEY_DIM} and a value head dim that is a multiple of {BLOCK_V} (got {} and {})",
        dims.key_dim,
        dims.value_dim
    );
    split_update(dims, inputs, state, |inputs, state, chunks| {
        launch(dims, inputs, state, chunks)
    })
}

/// The three dispatches over `chunks` full chunks; y is written for those tokens only.
fn launch(dims: GdnDims, inputs: &Inputs, state: &Tensor, chunks: usize) -> Result<Tensor> {
    let dev = &metal_device(state, OP)?;
    ensure!(
        state.is_contiguous(),
        "{OP}: the state must be contiguous to be updated in place"
    );
    ensure!(
        chunks >= 1 && chunks * CHUNK <= dims.steps,
        "{OP}: {chunks} chunks of {CHUNK} for {} tokens",
        dims.steps
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
    let [prep_name, state_name, out_name] = kernel_names(in_dtype, state.dtype())?;
    let prep = pipeline(dev, &SOURCE, &prep_name)?;
    let state_pass = pipeline(dev, &SOURCE, &state_name)?;
    let out = pipeline(dev, &SOURCE, &out_name)?;
    let (dk, dv) = (dims.key_dim, dims.value_dim);
    let heads = dims.batch * dims.value_heads;
    let tokens = chunks * CHUNK;
    // Scratch in f32, each element written by one pass before a later one reads it.
    let scratch = |len: usize, label: &str| -> Result<(Buffer, usize)> {
        Ok((new_output(dev, len, DType::F32, label)?.as_ref().clone(), 0))
    };
    let gcum = scratch(heads * tokens, "gated_delta_chunk_gcum")?;
    let w = scratch(heads * tokens * dk, "gated_delta_chunk_w")?;
    let u = scratch(heads * tokens * dv, "gated_delta_chunk_u")?;
    let h = scratch(heads * chunks * dk * dv, "gated_delta_chunk_h")?;
    let y_len = dims.batch * dims.steps * dims.value_heads * dv;
    let y_buffer = new_output(dev, y_len, in_dtype, "gated_delta_chunk_y")?;
    let params = GdnChunkParams::new(&dims, chunks, mask.is_some());
    let [qb, kb, vb, gb, bb] = [&q, &k, &v, &g, &beta].map(|t| metal_buffer(t, OP));
    let (qb, kb, vb, gb, bb) = (qb?, kb?, vb?, gb?, bb?);
    let state_buf = metal_buffer(state, OP)?;
    let y_buf = (y_buffer.as_ref().clone(), 0);
    // Without a mask the kernels never read it; bind g so the slot is valid.
    let mask_buf = match &mask {
        Some(m) => metal_buffer(m, OP)?,
        None => gb.clone(),
    };
    let threads = MTLSize {
        width: THREADS,
        height: 1,
        depth: 1,
    };
    let grid = |width: usize| MTLSize {
        width,
        height: 1,
        depth: heads,
    };
    encode(
        dev,
        &prep,
        &[
            Binding::Read(&kb),
            Binding::Read(&vb),
            Binding::Read(&gb),
            Binding::Read(&bb),
            Binding::Read(&mask_buf),
            Binding::Write(&gcum),
            Binding::Write(&w),
            Binding::Write(&u),
        ],
        &params,
        grid(chunks),
        threads,
        PREP_BYTES,
    )?;
    encode(
        dev,
        &state_pass,
        &[
            Binding::Read(&kb),
            Binding::Read(&gcum),
            Binding::Read(&w),
            // U in, V' out; the state read and written in place: declared as written so that
            // later readers wait for them.
            Binding::Write(&u),
            Binding::Write(&h),
            Binding::Write(&state_buf),
        ],
        &params,
        grid(dv / BLOCK_V),
        threads,
        STATE_BYTES,
    )?;
    encode(
        dev,
        &out,
        &[
            Binding::Read(&qb),
            Binding::Read(&kb),
            Binding::Read(&gcum),
            Binding::Read(&h),
            Binding::Read(&u),
            Binding::Read(&mask_buf),
            Binding::Write(&y_buf),
        ],
        &params,
        grid(chunks),
        threads,
        OUT_BYTES,
    )?;
    let shape = (dims.batch, dims.steps, dims.value_heads, dv);
    Ok(output(dev, y_buffer, shape, in_dtype))
}
