//! Metal host side of the chunked gated-delta kernels (`kernels/gated_delta_chunk.metal`,
//! simdgroup matrices): the prefill form of the recurrence in `metal.rs`, 64 tokens per chunk
//! as three dispatches (every chunk's local part in parallel, the state pass over the chunks in
//! sequence, y in parallel), with the tail run by the recurrence kernel (`chunked.rs`).

use super::chunked::{kernel_names, split_update, GdnChunkParams, CHUNK};
use super::metal::InputBuffers;
use super::{GdnDims, Inputs};
use crate::backend::metal::{
    encode, from_start, metal_device, metal_source, new_output, output, pipeline,
    reads_then_writes, size, KernelSource,
};
use anyhow::{ensure, Result};
use candle_core::{DType, Tensor};
use candle_metal_kernels::metal::Buffer;

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
    let prepared = inputs.prepare()?;
    let in_dtype = prepared.q.dtype();
    let [prep_name, state_name, out_name] = kernel_names(in_dtype, state.dtype())?;
    let prep = pipeline(dev, &SOURCE, &prep_name)?;
    let state_pass = pipeline(dev, &SOURCE, &state_name)?;
    let out = pipeline(dev, &SOURCE, &out_name)?;
    let (dk, dv) = (dims.key_dim, dims.value_dim);
    let heads = dims.batch * dims.value_heads;
    let tokens = chunks * CHUNK;
    // Scratch in f32, each element written by one pass before a later one reads it.
    let scratch = |len: usize, label: &str| -> Result<(Buffer, usize)> {
        Ok(from_start(
            new_output(dev, len, DType::F32, label)?.as_ref(),
        ))
    };
    let gcum = scratch(heads * tokens, "gated_delta_chunk_gcum")?;
    let w = scratch(heads * tokens * dk, "gated_delta_chunk_w")?;
    let u = scratch(heads * tokens * dv, "gated_delta_chunk_u")?;
    let h = scratch(heads * chunks * dk * dv, "gated_delta_chunk_h")?;
    let y_len = dims.batch * dims.steps * dims.value_heads * dv;
    let y_buffer = new_output(dev, y_len, in_dtype, "gated_delta_chunk_y")?;
    let params = GdnChunkParams::new(&dims, chunks, prepared.mask.is_some());
    let b = InputBuffers::new(&prepared, state, OP)?;
    let y_buf = from_start(&y_buffer);
    let threads = size(THREADS, 1, 1);
    let grid = |width: usize| size(width, 1, heads);
    encode(
        dev,
        &prep,
        &reads_then_writes(&[&b.k, &b.v, &b.g, &b.beta, &b.mask], &[&gcum, &w, &u]),
        &params,
        grid(chunks),
        threads,
        PREP_BYTES,
    )?;
    // U in, V' out; the state read and written in place: declared as written so that later
    // readers wait for them.
    encode(
        dev,
        &state_pass,
        &reads_then_writes(&[&b.k, &gcum, &w], &[&u, &h, &b.state]),
        &params,
        grid(dv / BLOCK_V),
        threads,
        STATE_BYTES,
    )?;
    encode(
        dev,
        &out,
        &reads_then_writes(&[&b.q, &b.k, &gcum, &h, &u, &b.mask], &[&y_buf]),
        &params,
        grid(chunks),
        threads,
        OUT_BYTES,
    )?;
    let shape = (dims.batch, dims.steps, dims.value_heads, dv);
    Ok(output(dev, y_buffer, shape, in_dtype))
}
