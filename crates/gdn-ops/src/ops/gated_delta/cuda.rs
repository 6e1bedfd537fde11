//! CUDA host side of the fused gated-delta kernel (`kernels/gated_delta.cu`): the same call
//! as the Metal one, with the state advanced in place on candle's stream.

use super::{GdnDims, Inputs, Prepared};
use crate::backend::cuda::{cuda_device, function, launch, tensor, view, KernelSource};
use crate::backend::dtype_tag;
use anyhow::{bail, ensure, Result};
use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, LaunchConfig, PushKernelArg};
use candle_core::cuda_backend::CudaDType;
use candle_core::{DType, Tensor, WithDType};
use half::{bf16, f16};

const OP: &str = "gated_delta_update";
const SOURCE: KernelSource = KernelSource {
    module: "qwen_gdn_gated_delta",
    ptx: include_str!(concat!(env!("OUT_DIR"), "/gated_delta.ptx")),
};
/// Warps per block (`W` in the kernel's launch comment; measured in docs/perf-notes-gpu.md).
const WARPS_PER_BLOCK: u32 = 4;
/// State rows per warp: the kernel's compile-time `GDN_ROWS_PER_WARP` (2 by default).
const ROWS_PER_WARP: u32 = 2;

/// The kernel instantiation for activations of `input` and a state of `state` dtype.
pub fn kernel_name(input: DType, state: DType) -> Result<String> {
    ensure!(
        matches!(state, DType::F32 | DType::BF16),
        "{OP}: the state must be f32 or bf16"
    );
    Ok(format!(
        "gated_delta_step_{}_{}",
        dtype_tag(input, OP)?,
        dtype_tag(state, OP)?
    ))
}

/// A contiguous tensor the kernel reads with 16-byte vector loads, starting on a 16-byte
/// boundary (a copy if its view starts mid-vector).
fn aligned(t: Tensor) -> Result<Tensor> {
    if (t.layout().start_offset() * t.dtype().size_in_bytes()).is_multiple_of(16) {
        Ok(t)
    } else {
        Ok(t.copy()?)
    }
}

/// Whether the kernel covers these shapes: a key head dim that is a multiple of 32 from 32
/// to 256.
pub(crate) fn supports(dims: &GdnDims) -> bool {
    dims.key_dim.is_multiple_of(32) && (32..=256).contains(&dims.key_dim)
}

pub(crate) fn gated_delta_update(dims: GdnDims, inputs: &Inputs, state: &Tensor) -> Result<Tensor> {
    let dev = cuda_device(state, OP)?;
    ensure!(
        supports(&dims),
        "{OP}: the CUDA kernel needs a key head dim that is a multiple of 32 from 32 to 256 (got {})",
        dims.key_dim
    );
    ensure!(
        dims.batch * dims.value_heads <= 65535,
        "{OP}: batch × value heads must be at most 65535"
    );
    ensure!(
        state.is_contiguous()
            && (state.layout().start_offset() * state.dtype().size_in_bytes()).is_multiple_of(16),
        "{OP}: the state must be contiguous and 16-byte aligned to be updated in place"
    );
    let in_dtype = inputs.q.dtype();
    match (in_dtype, state.dtype()) {
        (DType::F32, DType::F32) => launch_as::<f32, f32>(dims, inputs, state, &dev),
        (DType::F32, DType::BF16) => launch_as::<f32, bf16>(dims, inputs, state, &dev),
        (DType::F16, DType::F32) => launch_as::<f16, f32>(dims, inputs, state, &dev),
        (DType::F16, DType::BF16) => launch_as::<f16, bf16>(dims, inputs, state, &dev),
        (DType::BF16, DType::F32) => launch_as::<bf16, f32>(dims, inputs, state, &dev),
        (DType::BF16, DType::BF16) => launch_as::<bf16, bf16>(dims, inputs, state, &dev),
        (i, s) => bail!("{OP}: no CUDA kernel for activations {i:?} with a {s:?} state"),
    }
}

fn launch_as<I, S>(
    dims: GdnDims,
    inputs: &Inputs,
    state: &Tensor,
    dev: &candle_core::CudaDevice,
) -> Result<Tensor>
where
    I: CudaDType + DeviceRepr + WithDType,
    S: CudaDType + DeviceRepr + WithDType,
{
    let func = function(dev, &SOURCE, &kernel_name(I::DTYPE, S::DTYPE)?)?;
    let Prepared {
        q,
        k,
        v,
        g,
        beta,
        mask,
    } = inputs.prepare()?;
    let (q, k, v) = (aligned(q)?, aligned(k)?, aligned(v)?);
    let y_len = dims.batch * dims.steps * dims.value_heads * dims.value_dim;
    // SAFETY: the kernel writes every element of y.
    let y = unsafe { dev.alloc::<I>(y_len)? };
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
        // Written in place through this view: the kernel reads each state row once and
        // writes it once, and candle's single stream orders it after earlier readers.
        let state_view = view::<S>(&ss, sl, OP)?;
        let mask_guard = mask.as_ref().map(|m| m.storage_and_layout());
        let mask_view = match &mask_guard {
            Some((ms, ml)) => view::<f32>(ms, ml, OP)?,
            // Never read without a mask (has_mask = 0); any valid pointer fills the slot.
            None => view::<f32>(&gs, gl, OP)?,
        };
        let u = |n: usize| n as u32;
        let (batch, steps, key_heads, value_heads) = (
            u(dims.batch),
            u(dims.steps),
            u(dims.key_heads),
            u(dims.value_heads),
        );
        let (key_dim, value_dim, has_mask) = (
            u(dims.key_dim),
            u(dims.value_dim),
            u(mask.is_some() as usize),
        );
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
            .arg(&batch)
            .arg(&steps)
            .arg(&key_heads)
            .arg(&value_heads)
            .arg(&key_dim)
            .arg(&value_dim)
            .arg(&has_mask);
        let config = LaunchConfig {
            grid_dim: (
                value_dim.div_ceil(WARPS_PER_BLOCK * ROWS_PER_WARP),
                batch * value_heads,
                1,
            ),
            block_dim: (32, WARPS_PER_BLOCK, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the arguments match the kernel's signature in kernels/gated_delta.cu, in
        // order and type, and every view covers the elements the kernel indexes.
        unsafe { launch(args, config) }?;
    }
    Ok(tensor(
        y,
        dev,
        (dims.batch, dims.steps, dims.value_heads, dims.value_dim),
    ))
}
