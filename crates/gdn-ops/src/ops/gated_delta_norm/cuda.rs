//! CUDA host side of `kernels/gated_delta_norm.cu`: binding and launch geometry, with the
//! state advanced in place on candle's stream.

use super::{supports, GdnNormParams, Inputs, MAX_SIMDGROUPS};
use crate::backend::cuda::{
    config, cuda_device, cuda_source, launch, tensor, with_input_and_state_types, Element, Held,
    Kernel, KernelSource,
};
use crate::ops::gated_delta::cuda::HeldInputs;
use anyhow::{ensure, Result};
use candle_core::cuda_backend::cudarc::driver::{CudaView, DeviceRepr, LaunchArgs, PushKernelArg};
use candle_core::{CudaDevice, DType, Tensor};

const OP: &str = "gated_delta_update_norm";
const SOURCE: KernelSource = cuda_source!("gated_delta_norm");
/// The window's entries: a module of their own (kernels/gated_delta_norm_window.cu), JIT-compiled
/// only by a process that verifies drafts.
const WINDOW_SOURCE: KernelSource = cuda_source!("gated_delta_norm_window");

// SAFETY: `GdnNormParams` is `repr(C)` of eight u32, one f32 and one u32, as the kernel's
// struct.
unsafe impl DeviceRepr for GdnNormParams {}

pub(crate) fn gated_delta_update_norm(inputs: &Inputs) -> Result<Tensor> {
    launch_entry(inputs, None, OP)
}

/// A launch of `gated_delta_norm_*` (cluster or not), or, given `after` (`[T − 1, B, Hv, Dv,
/// Dk]`, checked by the caller), of the same entry's window twin
/// `gated_delta_norm_window_*` with it after the output (`ops/gated_delta_norm_window`): the
/// same split, so that every token's sums run as the one-token launch runs them.
pub(crate) fn launch_entry(inputs: &Inputs, after: Option<&Tensor>, op: &str) -> Result<Tensor> {
    let (dev, dtype, st) = checked_device(inputs, op)?;
    with_input_and_state_types!(dtype, st, op, |I, S| launch_as::<I, S>(
        inputs, after, &dev, op
    ))
}

fn launch_as<I, S>(
    inputs: &Inputs,
    after: Option<&Tensor>,
    dev: &CudaDevice,
    op: &str,
) -> Result<Tensor>
where
    I: Element,
    S: Element,
{
    let d = inputs.dims;
    let plan = Split::of(inputs, d.batch * d.value_heads)?;
    let (source, name) = match after {
        Some(_) => (
            &WINDOW_SOURCE,
            format!(
                "gated_delta_norm_window{}",
                &plan.kernel["gated_delta_norm".len()..]
            ),
        ),
        None => (&SOURCE, plan.kernel.to_string()),
    };
    let kernel = Kernel::typed(dev, source, &name, &[I::DTYPE, S::DTYPE], op)?;
    let warps = plan.warps;
    let params = inputs.params()?;
    // Contiguous copies where needed; the dtypes were checked (no conversion) and there is no
    // mask.
    let prepared = inputs.recurrence.prepare()?;
    let len = d.batch * d.steps * d.value_heads * d.value_dim;
    // SAFETY: the kernel writes every element of out.
    let out = unsafe { dev.alloc::<I>(len)? };
    if len > 0 {
        let held = HeldInputs::new(&prepared, inputs.state);
        let views = held.views::<I, S>(op)?;
        let norm = HeldNorm::new(inputs);
        let norm = norm.views::<I>(inputs, op)?;
        // The window's states are written through this view, as the state is: each row by
        // the warp that owns it.
        let after = after.map(Held::new);
        let after = after.as_ref().map(|a| a.view::<S>(op)).transpose()?;
        let mut args = kernel.args();
        views.push_recurrence(&mut args);
        norm.push(&mut args);
        args.arg(&out);
        if let Some(after) = &after {
            args.arg(after);
        }
        args.arg(&params);
        let blocks = (d.batch * d.value_heads * plan.blocks_per_head) as u32;
        let geometry = config((blocks, 1, 1), (32, warps as u32, 1), 0);
        // SAFETY: arguments in the order and types of `gated_delta_norm_*` (with `after`:
        // `gated_delta_norm_window_*`) in kernels/gated_delta_norm.cu; every view covers the
        // elements the kernel indexes (after: [T − 1, B, Hv, Dv, Dk], checked by the caller).
        unsafe { launch(args, geometry) }?;
    }
    Ok(tensor(
        out,
        dev,
        (d.batch, d.steps, d.value_heads, d.value_dim),
    ))
}

/// The gated norm's inputs of both launches (the per-sequence and the slot kernel): z and
/// the norm's weight, read-locked while their views are bound.
pub(crate) struct HeldNorm<'a> {
    z: Held<'a>,
    weight: Held<'a>,
}

/// The device views of [`HeldNorm`].
pub(crate) struct NormViews<'a, I> {
    z: CudaView<'a, I>,
    weight: CudaView<'a, I>,
}

impl<'a> HeldNorm<'a> {
    pub(crate) fn new(inputs: &Inputs<'a>) -> Self {
        Self {
            z: Held::new(inputs.z),
            weight: Held::new(inputs.weight),
        }
    }

    /// z may be a view: its row layout (in `inputs`) was checked by the caller.
    pub(crate) fn views<I: Element>(&self, inputs: &Inputs, op: &str) -> Result<NormViews<'_, I>> {
        Ok(NormViews {
            z: self.z.rows(&inputs.z_rows, op)?,
            weight: self.weight.view(op)?,
        })
    }
}

impl<'a, I: Element> NormViews<'a, I> {
    /// z, weight: the arguments after the recurrence's (the output follows).
    pub(crate) fn push(&'a self, args: &mut LaunchArgs<'a>) {
        args.arg(&self.z).arg(&self.weight);
    }
}

/// The device and dtypes of a call, checked against the kernels' coverage: both launchers'
/// entry.
pub(crate) fn checked_device(inputs: &Inputs, op: &str) -> Result<(CudaDevice, DType, DType)> {
    let dev = cuda_device(inputs.state, op)?;
    let (dtype, st) = (inputs.recurrence.q.dtype(), inputs.state.dtype());
    ensure!(
        supports(&inputs.dims, dtype, st),
        "{op}: no CUDA kernel for {:?} with {dtype:?} activations and a {st:?} state",
        inputs.dims
    );
    Ok((dev, dtype, st))
}

/// The blocks that share a value head's rows: four of a thread-block cluster
/// (`gated_delta_norm_cluster_*`, a quarter of the rows each, two a warp) wherever the rows
/// split evenly and the heads are fewer than the GPU's SMs, else one block for the head
/// (`gated_delta_norm_*`). Why: at Qwen3-Next's 32 value heads one block a head leaves 100 of
/// the H100's 132 SMs idle, and each block's step is a chain of dependent latencies.
/// Measured alone (scripts/gpu/gdn_norm_cuda.py, H200, docs/perf-notes-gpu.md): 11.9 → 6.1 µs
/// at B = 1, 23.6 → 14.6 µs for 4 tokens; even at B = 4 (128 heads); two rows a warp beat one
/// (9.9 µs) and 2 or 8 blocks a head (8.6, 8.3 µs).
pub(crate) struct Split {
    pub(crate) kernel: &'static str,
    pub(crate) blocks_per_head: usize,
    pub(crate) warps: usize,
}

/// `kClusterBlocks` and the cluster entry's most rows a warp, in kernels/gated_delta_norm.cu.
const CLUSTER_BLOCKS: usize = 4;
const CLUSTER_MAX_ROWS_PER_WARP: usize = 2;
/// Past this many heads (batch × value heads) one block a head fills the GPU already.
const CLUSTER_MAX_HEADS: usize = 128;

impl Split {
    /// The split for a launch over `heads` (batch × value heads) heads. The slot launch
    /// (`gated_delta_norm_slots`) passes one sequence's heads, so that each sequence runs the
    /// entry its own launch would, with the same sums in the same order.
    pub(crate) fn of(inputs: &Inputs, heads: usize) -> Result<Self> {
        let d = inputs.dims;
        let span = d.value_dim / CLUSTER_BLOCKS;
        let warps = span.div_ceil(CLUSTER_MAX_ROWS_PER_WARP).min(MAX_SIMDGROUPS);
        if d.value_dim.is_multiple_of(CLUSTER_BLOCKS)
            && span > 0
            && span.div_ceil(warps) <= CLUSTER_MAX_ROWS_PER_WARP
            && heads <= CLUSTER_MAX_HEADS
        {
            return Ok(Split {
                kernel: "gated_delta_norm_cluster",
                blocks_per_head: CLUSTER_BLOCKS,
                warps,
            });
        }
        Ok(Split {
            kernel: "gated_delta_norm",
            blocks_per_head: 1,
            warps: inputs.simdgroups(32 * MAX_SIMDGROUPS)?,
        })
    }
}
