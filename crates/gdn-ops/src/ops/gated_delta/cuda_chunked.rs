//! CUDA host side of the chunked gated-delta kernel (`kernels/gated_delta_chunk.cu`, TF32
//! tensor cores): the prefill form of the recurrence in `cuda.rs`, 64 tokens per chunk, with
//! the tail run by the recurrence kernel (`chunked.rs`).

use super::chunked::{split_update, GdnChunkParams, CHUNK};
use super::{GdnDims, Inputs};
use crate::backend::cuda::{cuda_device, function, launch, tensor, view, KernelSource};
use crate::backend::dtype_tag;
use anyhow::{bail, ensure, Result};
use candle_core::cuda_backend::cudarc::driver::sys::CUfunction_attribute;
use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::CudaDType;
use candle_core::{DType, Tensor, WithDType};
use half::{bf16, f16};

const OP: &str = "gated_delta_chunked";
const SOURCE: KernelSource = KernelSource {
    module: "qwen_gdn_gated_delta_chunk",
    ptx: include_str!(concat!(env!("OUT_DIR"), "/gated_delta_chunk.ptx")),
};

// SAFETY: `GdnChunkParams` is `repr(C)` of eight u32, as the kernel's struct.
unsafe impl DeviceRepr for GdnChunkParams {}

/// Value columns per block (`kBlockV`).
const BLOCK_V: usize = 32;
/// Threads per block (`kThreads`): 4 warps.
const THREADS: u32 = 128;
/// The key dims the kernel's shared memory holds (K and Q of a chunk in f32).
const MAX_KEY_DIM: usize = 256;

/// Dynamic shared memory of a launch: `gdn_chunk_smem_floats(Dk)` of the kernel, in bytes
/// (K and Q [64, Dk + 8], S^T [Dk, 40], R/V' and y [64, 40], the 64x72 matrix, the gates).
fn shared_bytes(key_dim: usize) -> usize {
    let floats = 2 * CHUNK * (key_dim + 8) + key_dim * 40 + 2 * CHUNK * 40 + CHUNK * 72 + 3 * CHUNK;
    floats * 4
}

/// Whether the kernel takes these dims (else the caller runs the recurrence).
pub fn supports(dims: &GdnDims) -> bool {
    dims.key_dim.is_multiple_of(16)
        && (16..=MAX_KEY_DIM).contains(&dims.key_dim)
        && dims.value_dim.is_multiple_of(BLOCK_V)
        && dims.value_dim > 0
        && dims.key_heads > 0
        // An empty grid is no launch: the recurrence path handles empty calls.
        && dims.batch * dims.value_heads > 0
        && dims.batch * dims.value_heads <= 65535
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
        "{OP}: the CUDA chunk kernel needs a key head dim that is a multiple of 16 up to {MAX_KEY_DIM}, a value head dim that is a multiple of {BLOCK_V} and batch × value heads ≤ 65535 (got {:?})",
        dims
    );
    split_update(dims, inputs, state, |inputs, state, chunks| {
        let dev = cuda_device(state, OP)?;
        ensure!(
            state.is_contiguous(),
            "{OP}: the state must be contiguous to be updated in place"
        );
        match (inputs.q.dtype(), state.dtype()) {
            (DType::F32, DType::F32) => launch_as::<f32, f32>(dims, inputs, state, chunks, &dev),
            (DType::F32, DType::BF16) => launch_as::<f32, bf16>(dims, inputs, state, chunks, &dev),
            (DType::F16, DType::F32) => launch_as::<f16, f32>(dims, inputs, state, chunks, &dev),
            (DType::F16, DType::BF16) => launch_as::<f16, bf16>(dims, inputs, state, chunks, &dev),
            (DType::BF16, DType::F32) => launch_as::<bf16, f32>(dims, inputs, state, chunks, &dev),
            (DType::BF16, DType::BF16) => {
                launch_as::<bf16, bf16>(dims, inputs, state, chunks, &dev)
            }
            (i, s) => bail!("{OP}: no CUDA kernel for activations {i:?} with a {s:?} state"),
        }
    })
}

/// One launch over `chunks` full chunks; y is written for those tokens only.
fn launch_as<I, S>(
    dims: GdnDims,
    inputs: &Inputs,
    state: &Tensor,
    chunks: usize,
    dev: &candle_core::CudaDevice,
) -> Result<Tensor>
where
    I: CudaDType + DeviceRepr + WithDType,
    S: CudaDType + DeviceRepr + WithDType,
{
    ensure!(
        chunks * CHUNK <= dims.steps,
        "{OP}: {chunks} chunks of {CHUNK} exceed {} tokens",
        dims.steps
    );
    let in_dtype = I::DTYPE;
    let func = function(dev, &SOURCE, &kernel_name(in_dtype, S::DTYPE)?)?;
    let smem = shared_bytes(dims.key_dim);
    // Over the default 48 KB: the function must be allowed its dynamic shared memory.
    func.set_attribute(
        CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        smem as i32,
    )?;
    let (q, k, v) = (
        inputs.q.contiguous()?,
        inputs.k.to_dtype(in_dtype)?.contiguous()?,
        inputs.v.to_dtype(in_dtype)?.contiguous()?,
    );
    let (g, beta) = (
        inputs.g.to_dtype(DType::F32)?.contiguous()?,
        inputs.beta.to_dtype(DType::F32)?.contiguous()?,
    );
    let mask = inputs
        .mask
        .map(|m| m.to_dtype(DType::F32)?.contiguous())
        .transpose()?;
    let y_len = dims.batch * dims.steps * dims.value_heads * dims.value_dim;
    // SAFETY: the kernel writes y for the chunks' tokens; split_update writes the tail's.
    let y = unsafe { dev.alloc::<I>(y_len)? };
    let params = GdnChunkParams::new(&dims, chunks, mask.is_some());
    {
        let (qs, ql) = q.storage_and_layout();
        let (ks, kl) = k.storage_and_layout();
        let (vs, vl) = v.storage_and_layout();
        let (gs, gl) = g.storage_and_layout();
        let (bs, bl) = beta.storage_and_layout();
        let (ss, sl) = state.storage_and_layout();
        let q_view = view::<I>(&qs, ql, OP)?;
        let k_view = view::<I>(&ks, kl, OP)?;
        let v_view = view::<I>(&vs, vl, OP)?;
        let g_view = view::<f32>(&gs, gl, OP)?;
        let beta_view = view::<f32>(&bs, bl, OP)?;
        // Written in place through this view; candle's single stream orders it.
        let state_view = view::<S>(&ss, sl, OP)?;
        let mask_guard = mask.as_ref().map(|m| m.storage_and_layout());
        let mask_view = match &mask_guard {
            Some((ms, ml)) => view::<f32>(ms, ml, OP)?,
            // Never read without a mask (has_mask = 0); any valid pointer fills the slot.
            None => view::<f32>(&gs, gl, OP)?,
        };
        let stream = dev.cuda_stream();
        let mut args = stream.launch_builder(&func);
        args.arg(&q_view)
            .arg(&k_view)
            .arg(&v_view)
            .arg(&g_view)
            .arg(&beta_view)
            .arg(&state_view)
            .arg(&y)
            .arg(&mask_view)
            .arg(&params);
        let config = LaunchConfig {
            grid_dim: (
                (dims.value_dim / BLOCK_V) as u32,
                (dims.batch * dims.value_heads) as u32,
                1,
            ),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        // SAFETY: the arguments match the kernel's signature in kernels/gated_delta_chunk.cu,
        // in order and type, and every view covers the elements the kernel indexes.
        unsafe { launch(args, config) }?;
    }
    Ok(tensor(
        y,
        dev,
        (dims.batch, dims.steps, dims.value_heads, dims.value_dim),
    ))
}
