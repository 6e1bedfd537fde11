//! CUDA host side of the fused gated-delta kernel (`kernels/gated_delta.cu`): the same call
//! as the Metal one, with the state advanced in place on candle's stream.

use super::{kernel_name, GdnDims, GdnParams, Inputs, Prepared};
use crate::backend::cuda::{
    config, cuda_device, cuda_source, launch, tensor, with_input_and_state_types, Element, Held,
    Kernel, KernelSource,
};
use anyhow::{ensure, Result};
use candle_core::cuda_backend::cudarc::driver::{CudaView, DeviceRepr, LaunchArgs, PushKernelArg};
use candle_core::cuda_backend::CudaDType;
use candle_core::{CudaDevice, Tensor};

const OP: &str = "gated_delta_update";
const SOURCE: KernelSource = cuda_source!("gated_delta");
/// Warps per block (`W` in the kernel's launch comment; measured in docs/perf-notes-gpu.md).
const WARPS_PER_BLOCK: u32 = 4;
/// State rows per warp: the kernel's compile-time `GDN_ROWS_PER_WARP` (2 by default).
const ROWS_PER_WARP: u32 = 2;

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
    with_input_and_state_types!(inputs.q.dtype(), state.dtype(), OP, |I, S| {
        launch_as::<I, S>(dims, inputs, state, &dev)
    })
}

/// The storages of a call's prepared inputs and state, held while their views are bound: what
/// the recurrence kernel here, the chunk kernels (`cuda_chunked.rs`) and the fused norm
/// (`gated_delta_norm`) read.
pub(crate) struct HeldInputs<'a> {
    q: Held<'a>,
    k: Held<'a>,
    v: Held<'a>,
    g: Held<'a>,
    beta: Held<'a>,
    state: Held<'a>,
    mask: Option<Held<'a>>,
}

/// The device views of [`HeldInputs`]: activations in `I`, gates in f32, the state in `S`.
pub(crate) struct InputViews<'a, I, S> {
    pub(crate) q: CudaView<'a, I>,
    pub(crate) k: CudaView<'a, I>,
    pub(crate) v: CudaView<'a, I>,
    pub(crate) g: CudaView<'a, f32>,
    pub(crate) beta: CudaView<'a, f32>,
    /// Written in place through this view: each state row is read and written by one warp,
    /// and candle's single stream orders the writes after earlier readers.
    pub(crate) state: CudaView<'a, S>,
    /// Without a mask, g's view fills the slot: the kernels never read it (has_mask = 0).
    pub(crate) mask: CudaView<'a, f32>,
}

impl<'a, I, S> InputViews<'a, I, S> {
    /// Pushes q, k, v, g, beta and the state: the leading arguments of the recurrence kernels
    /// (`gated_delta_step_*`, and `gated_delta_norm_*` of the fused norm).
    pub(crate) fn push_recurrence(&'a self, args: &mut LaunchArgs<'a>) {
        self.push_gates(args);
        args.arg(&self.state);
    }

    /// Pushes q, k, v, g and beta: the arguments before the state (the slot kernels take a
    /// table of the states' addresses in its place).
    pub(crate) fn push_gates(&'a self, args: &mut LaunchArgs<'a>) {
        args.arg(&self.q)
            .arg(&self.k)
            .arg(&self.v)
            .arg(&self.g)
            .arg(&self.beta);
    }
}

impl<'a> HeldInputs<'a> {
    pub(crate) fn new(inputs: &'a Prepared, state: &'a Tensor) -> Self {
        Self {
            q: Held::new(&inputs.q),
            k: Held::new(&inputs.k),
            v: Held::new(&inputs.v),
            g: Held::new(&inputs.g),
            beta: Held::new(&inputs.beta),
            state: Held::new(state),
            mask: inputs.mask.as_ref().map(Held::new),
        }
    }

    pub(crate) fn views<I, S>(&self, op: &str) -> Result<InputViews<'_, I, S>>
    where
        I: CudaDType + DeviceRepr,
        S: CudaDType + DeviceRepr,
    {
        Ok(InputViews {
            q: self.q.view(op)?,
            k: self.k.view(op)?,
            v: self.v.view(op)?,
            g: self.g.view(op)?,
            beta: self.beta.view(op)?,
            state: self.state.view(op)?,
            mask: self.mask.as_ref().unwrap_or(&self.g).view(op)?,
        })
    }
}

fn launch_as<I, S>(
    dims: GdnDims,
    inputs: &Inputs,
    state: &Tensor,
    dev: &CudaDevice,
) -> Result<Tensor>
where
    I: Element,
    S: Element,
{
    let kernel = Kernel::load(dev, &SOURCE, &kernel_name(I::DTYPE, S::DTYPE)?)?;
    let prepared = inputs.prepare()?;
    let prepared = Prepared {
        q: aligned(prepared.q)?,
        k: aligned(prepared.k)?,
        v: aligned(prepared.v)?,
        ..prepared
    };
    let y_len = dims.batch * dims.steps * dims.value_heads * dims.value_dim;
    // SAFETY: the kernel writes every element of y.
    let y = unsafe { dev.alloc::<I>(y_len)? };
    {
        let held = HeldInputs::new(&prepared, state);
        let views = held.views::<I, S>(OP)?;
        let p = GdnParams::new(&dims, prepared.mask.is_some());
        let mut args = kernel.args();
        views.push_recurrence(&mut args);
        args.arg(&y)
            .arg(&views.mask)
            .arg(&p.batch)
            .arg(&p.steps)
            .arg(&p.key_heads)
            .arg(&p.value_heads)
            .arg(&p.key_dim)
            .arg(&p.value_dim)
            .arg(&p.has_mask);
        let row_blocks = p.value_dim.div_ceil(WARPS_PER_BLOCK * ROWS_PER_WARP);
        let geometry = config(
            (row_blocks, p.batch * p.value_heads, 1),
            (32, WARPS_PER_BLOCK, 1),
            0,
        );
        // SAFETY: the arguments match the kernel's signature in kernels/gated_delta.cu, in
        // order and type, and every view covers the elements the kernel indexes.
        unsafe { launch(args, geometry) }?;
    }
    Ok(tensor(
        y,
        dev,
        (dims.batch, dims.steps, dims.value_heads, dims.value_dim),
    ))
}
