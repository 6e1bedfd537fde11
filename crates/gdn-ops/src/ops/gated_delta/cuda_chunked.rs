//! CUDA host side of the chunked gated-delta kernels (`kernels/gated_delta_chunk.cu`, TF32
//! tensor cores): the prefill form of the recurrence in `cuda.rs`, 64 tokens per chunk as three
//! launches (every chunk's local part in parallel, the state pass over the chunks in sequence,
//! y in parallel), with the tail run by the recurrence kernel (`chunked.rs`).

use super::chunked::{kernel_names, split_update, GdnChunkParams, CHUNK};
use super::cuda::HeldInputs;
use super::{GdnDims, Inputs, Prepared};
use crate::backend::cuda::{
    config, cuda_device, cuda_source, launch, tensor, with_input_and_state_types, Element, Kernel,
    KernelSource,
};
use anyhow::{ensure, Result};
use candle_core::cuda_backend::cudarc::driver::{CudaSlice, DeviceRepr, PushKernelArg};
use candle_core::{CudaDevice, Tensor};

const OP: &str = "gated_delta_chunked";
const SOURCE: KernelSource = cuda_source!("gated_delta_chunk");

// SAFETY: `GdnChunkParams` is `repr(C)` of eight u32, as the kernel's struct.
unsafe impl DeviceRepr for GdnChunkParams {}

/// Value columns per block of the state pass (`kBlockV`).
const BLOCK_V: usize = 32;
/// Threads per block of every pass (`kThreads`): 8 warps.
const THREADS: u32 = 256;
/// The largest key and value head dims the passes' shared memory holds.
const MAX_DIM: usize = 256;

/// Floats per staged row of `d` values (`ld_rows`): 8 of padding.
const fn ld_rows(d: usize) -> usize {
    d + 8
}

/// Dynamic shared memory of each pass in bytes: `prep_smem_floats`, `state_smem_floats` and
/// `out_smem_floats` of the kernel (K and V of a chunk, two 64x72 matrices, a 16x24 tile per
/// diagonal block and the gates; the 32-column state block, w, K, v_new, u and the gates, the
/// copies of the next chunk double-buffered up to Dk = 128; Q, K or the h and v_new slabs, P,
/// y staging and the gates).
fn prep_shared_bytes(key_dim: usize, value_dim: usize) -> usize {
    4 * (CHUNK * ld_rows(key_dim)
        + CHUNK * ld_rows(value_dim)
        + 2 * CHUNK * 72
        + 4 * 16 * 24
        + 3 * CHUNK)
}
/// The state pass double-buffers its copies of the next chunk up to this key dim (`state_buffers`).
const STATE_DOUBLE_BUFFER_MAX_KEY_DIM: usize = 128;
fn state_shared_bytes(key_dim: usize, input_bytes: usize) -> usize {
    let buffers = if key_dim <= STATE_DOUBLE_BUFFER_MAX_KEY_DIM {
        2
    } else {
        1
    };
    let rows = CHUNK * ld_rows(key_dim);
    // f32 K lands in the rows the products read; 16-bit K in raw rows, widened into one copy.
    let k_part = if input_bytes == 4 {
        buffers * rows
    } else {
        rows + buffers * CHUNK * key_dim * input_bytes / 4
    };
    4 * (key_dim * 40 + buffers * rows + k_part + CHUNK * 40 + buffers * (CHUNK * BLOCK_V + CHUNK))
}
fn out_shared_bytes(key_dim: usize) -> usize {
    let slabs = (CHUNK * ld_rows(key_dim)).max((key_dim + CHUNK) * 40);
    4 * (CHUNK * ld_rows(key_dim) + slabs + CHUNK * 72 + CHUNK * 40 + 2 * CHUNK)
}

/// Whether the kernels take these dims (else the caller runs the recurrence).
pub fn supports(dims: &GdnDims) -> bool {
    dims.key_dim.is_multiple_of(16)
        && (16..=MAX_DIM).contains(&dims.key_dim)
        && dims.value_dim.is_multiple_of(BLOCK_V)
        && (BLOCK_V..=MAX_DIM).contains(&dims.value_dim)
        && dims.key_heads > 0
        // An empty grid is no launch: the recurrence path handles empty calls.
        && dims.batch * dims.value_heads > 0
        && dims.batch * dims.value_heads <= 65535
}

pub(crate) fn gated_delta_update(dims: GdnDims, inputs: &Inputs, state: &Tensor) -> Result<Tensor> {
    ensure!(
        supports(&dims),
        "{OP}: the CUDA chunk kernels need a key head dim that is a multiple of 16 up to {MAX_DIM}, a value head dim that is a multiple of {BLOCK_V} up to {MAX_DIM} and batch × value heads ≤ 65535 (got {:?})",
        dims
    );
    split_update(dims, inputs, state, |inputs, state, chunks| {
        let dev = cuda_device(state, OP)?;
        ensure!(
            state.is_contiguous(),
            "{OP}: the state must be contiguous to be updated in place"
        );
        let prepared = inputs.prepare()?;
        with_input_and_state_types!(prepared.q.dtype(), state.dtype(), OP, |I, S| {
            launch_as::<I, S>(dims, &prepared, state, chunks, &dev)
        })
    })
}

/// f32 scratch of `len` elements that a pass writes in full before any pass reads it.
fn scratch(dev: &CudaDevice, len: usize) -> Result<CudaSlice<f32>> {
    // SAFETY: every element is written by one pass before a later one reads it (the kernel's
    // header lists who writes what).
    Ok(unsafe { dev.alloc::<f32>(len)? })
}

/// The three launches over `chunks` full chunks; y is written for those tokens only.
fn launch_as<I, S>(
    dims: GdnDims,
    inputs: &Prepared,
    state: &Tensor,
    chunks: usize,
    dev: &CudaDevice,
) -> Result<Tensor>
where
    I: Element,
    S: Element,
{
    ensure!(
        chunks >= 1 && chunks * CHUNK <= dims.steps,
        "{OP}: {chunks} chunks of {CHUNK} for {} tokens",
        dims.steps
    );
    let [prep_name, state_name, out_name] = kernel_names(I::DTYPE, S::DTYPE)?;
    let (dk, dv) = (dims.key_dim, dims.value_dim);
    let (prep_smem, state_smem, out_smem) = (
        prep_shared_bytes(dk, dv),
        state_shared_bytes(dk, std::mem::size_of::<I>()),
        out_shared_bytes(dk),
    );
    let prep = Kernel::load_with_shared(dev, &SOURCE, &prep_name, prep_smem)?;
    let state_pass = Kernel::load_with_shared(dev, &SOURCE, &state_name, state_smem)?;
    let out = Kernel::load_with_shared(dev, &SOURCE, &out_name, out_smem)?;

    let heads = dims.batch * dims.value_heads;
    let tokens = chunks * CHUNK;
    let gcum = scratch(dev, heads * tokens)?;
    let w = scratch(dev, heads * tokens * dk)?;
    let u = scratch(dev, heads * tokens * dv)?;
    let h = scratch(dev, heads * chunks * dk * dv)?;
    let y_len = dims.batch * dims.steps * dims.value_heads * dv;
    // SAFETY: the out pass writes y for the chunks' tokens; split_update writes the tail's.
    let y = unsafe { dev.alloc::<I>(y_len)? };
    let params = GdnChunkParams::new(&dims, chunks, inputs.mask.is_some());
    {
        let held = HeldInputs::new(inputs, state);
        let views = held.views::<I, S>(OP)?;
        let geometry = |grid_x: usize, smem: usize| {
            config((grid_x as u32, heads as u32, 1), (THREADS, 1, 1), smem)
        };

        let mut args = prep.args();
        args.arg(&views.k)
            .arg(&views.v)
            .arg(&views.g)
            .arg(&views.beta)
            .arg(&views.mask)
            .arg(&gcum)
            .arg(&w)
            .arg(&u)
            .arg(&params);
        // SAFETY: the arguments match gated_delta_chunk_prep_<in> in kernels/gated_delta_chunk.cu,
        // in order and type; the inputs cover every (b, t < chunks * 64) the grid indexes and the
        // scratch has the sizes of the kernel's header.
        unsafe { launch(args, geometry(chunks, prep_smem)) }?;

        let mut args = state_pass.args();
        args.arg(&views.k)
            .arg(&gcum)
            .arg(&w)
            .arg(&u)
            .arg(&h)
            .arg(&views.state)
            .arg(&params);
        // SAFETY: as above, for gated_delta_chunk_state_<in>_<st>; the state is [B, Hv, Dv, Dk].
        unsafe { launch(args, geometry(dv / BLOCK_V, state_smem)) }?;

        let mut args = out.args();
        args.arg(&views.q)
            .arg(&views.k)
            .arg(&gcum)
            .arg(&h)
            .arg(&u)
            .arg(&views.mask)
            .arg(&y)
            .arg(&params);
        // SAFETY: as above, for gated_delta_chunk_out_<in>; y is [B, T, Hv, Dv].
        unsafe { launch(args, geometry(chunks, out_smem)) }?;
    }
    Ok(tensor(
        y,
        dev,
        (dims.batch, dims.steps, dims.value_heads, dv),
    ))
}
