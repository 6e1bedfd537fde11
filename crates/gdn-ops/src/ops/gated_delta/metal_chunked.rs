//! Metal host side of the chunked gated-delta kernel (`kernels/gated_delta_chunk.metal`,
//! simdgroup matrices): the prefill form of the recurrence in `metal.rs`, 64 tokens per chunk,
//! with the tail run by the recurrence kernel (`chunked.rs`).

use super::chunked::{split_update, GdnChunkParams, CHUNK};
use super::{GdnDims, Inputs, Prepared};
use crate::backend::dtype_tag;
use crate::backend::metal::{
    encode, metal_buffer, metal_device, new_output, output, pipeline, Binding, KernelSource,
};
use anyhow::{ensure, Result};
use candle_core::{DType, Tensor};
use objc2_metal::MTLSize;

const OP: &str = "gated_delta_chunked";
const SOURCE: KernelSource = KernelSource {
    file: "kernels/gated_delta_chunk.metal",
    text: include_str!("../../../../../kernels/gated_delta_chunk.metal"),
    headers: &[(
        "params/gated_delta_chunk.h",
        include_str!("../../../../../kernels/params/gated_delta_chunk.h"),
    )],
};

/// Value columns per threadgroup (`kBlockV`), one 8-column tile per simdgroup.
const BLOCK_V: usize = 32;
/// Threads per threadgroup (`kThreads`): 4 simdgroups.
const THREADS: usize = 128;
/// Threadgroup memory (`kScratchFloats` floats): gates, 8 diagonal tiles, a 64x64 and a
/// 64x32 float matrix; under Metal's 32 KB.
const SCRATCH_BYTES: usize = (3 * CHUNK + 8 * 64 + CHUNK * CHUNK + CHUNK * BLOCK_V) * 4;
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

/// The kernel instantiation for activations of `input` and a state of `state` dtype.
pub fn kernel_name(input: DType, state: DType) -> Result<String> {
    ensure!(
        matches!(state, DType::F32 | DType::BF16),
        "{OP}: the state must be f32 or bf16"
    );
    Ok(format!(
        "gated_delta_chunk_{}_{}",
        dtype_tag(input, OP)?,
        dtype_tag(state, OP)?
    ))
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

/// One launch over `chunks` full chunks; y is written for those tokens only.
fn launch(dims: GdnDims, inputs: &Inputs, state: &Tensor, chunks: usize) -> Result<Tensor> {
    let dev = &metal_device(state, OP)?;
    ensure!(
        state.is_contiguous(),
        "{OP}: the state must be contiguous to be updated in place"
    );
    ensure!(
        chunks * CHUNK <= dims.steps,
        "{OP}: {chunks} chunks of {CHUNK} exceed {} tokens",
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
    let name = kernel_name(in_dtype, state.dtype())?;
    let pipeline = pipeline(dev, &SOURCE, &name)?;
    let y_len = dims.batch * dims.steps * dims.value_heads * dims.value_dim;
    let y_buffer = new_output(dev, y_len, in_dtype, "gated_delta_chunk_y")?;
    let params = GdnChunkParams::new(&dims, chunks, mask.is_some());
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
            width: dims.value_dim / BLOCK_V,
            height: 1,
            depth: dims.batch * dims.value_heads,
        },
        MTLSize {
            width: THREADS,
            height: 1,
            depth: 1,
        },
        SCRATCH_BYTES,
    )?;
    let shape = (dims.batch, dims.steps, dims.value_heads, dims.value_dim);
    Ok(output(dev, y_buffer, shape, in_dtype))
}
