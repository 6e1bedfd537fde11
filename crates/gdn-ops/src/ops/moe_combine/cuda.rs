//! CUDA host side of `kernels/moe_combine.cu`: one block per token row, or, for the decode
//! form of a few tokens, a token's columns over a thread-block cluster ([`uses_cluster`]).

use super::{
    combine_threads, CombineKernel, Inputs, MoeCombineParams, COMBINE_MAX_THREADS, COMBINE_PER,
};
use crate::backend::cuda::{
    config, cuda_device, cuda_source, launch, tensor, view_or, with_float_type, Element, Held,
    Kernel, KernelSource,
};
use anyhow::{ensure, Result};
use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, PushKernelArg};
use candle_core::Tensor;

const SOURCE: KernelSource = cuda_source!("moe_combine");

// SAFETY: `MoeCombineParams` is `repr(C)` of u32 and f32 fields, as the kernel's struct.
unsafe impl DeviceRepr for MoeCombineParams {}

/// `kClusterBlocks` in kernels/moe_combine.cu: the blocks of a token's cluster.
pub const CLUSTER_BLOCKS: usize = 4;
/// Past this many tokens one block a token already spreads the call over the SMs.
pub const CLUSTER_MAX_TOKENS: usize = 16;

/// Whether a call of `tokens` rows of `hidden` columns runs `moe_combine_cluster_*` (a
/// token's columns over [`CLUSTER_BLOCKS`] blocks of a cluster, sm_90): the decode form
/// (`gathered` false) of at most [`CLUSTER_MAX_TOKENS`] tokens whose block's columns fit its
/// registers, unless `kernel` asks for one block. Why: one block a token keeps a decode
/// step's 45 KB of expert rows on one SM. Measured alone at Qwen3-Next's decode shape
/// (scripts/gpu/moe_combine_cuda.py, H200, rows in L2 as in the step): 4.83 µs a call on one
/// block, 3.32 on a cluster of 4, 3.30 of 8, 3.63 of 2 (docs/perf-notes-gpu.md, issue 25).
pub fn uses_cluster(tokens: usize, hidden: usize, gathered: bool, kernel: CombineKernel) -> bool {
    kernel == CombineKernel::Auto
        && !gathered
        && tokens <= CLUSTER_MAX_TOKENS
        && hidden.div_ceil(CLUSTER_BLOCKS) <= COMBINE_PER * COMBINE_MAX_THREADS
}

pub(crate) fn moe_combine(
    inputs: &Inputs,
    p: &MoeCombineParams,
    kernel: CombineKernel,
) -> Result<(Tensor, Option<Tensor>)> {
    with_float_type!(inputs.down.dtype(), "moe_combine", |T| moe_combine_as::<T>(
        inputs, p, kernel
    ))
}

fn moe_combine_as<T: Element>(
    inputs: &Inputs,
    p: &MoeCombineParams,
    asked: CombineKernel,
) -> Result<(Tensor, Option<Tensor>)> {
    const OP: &str = "moe_combine";
    let dev = cuda_device(&inputs.down, OP)?;
    let cluster = uses_cluster(p.tokens as usize, p.hidden as usize, p.gathered != 0, asked);
    let name = if cluster {
        "moe_combine_cluster"
    } else {
        "moe_combine"
    };
    let kernel = Kernel::typed(&dev, &SOURCE, name, &[T::DTYPE], OP)?;
    let (tokens, hidden) = (p.tokens as usize, p.hidden as usize);
    ensure!(
        p.tokens <= i32::MAX as u32,
        "{OP}: {tokens} tokens exceed the CUDA grid"
    );
    // SAFETY: the kernel writes every element of sum, and of normed when has_norm.
    let sum = unsafe { dev.alloc::<T>(tokens * hidden)? };
    let normed = match inputs.norm_weight {
        Some(_) => Some(unsafe { dev.alloc::<T>(tokens * hidden)? }),
        None => None,
    };
    if tokens > 0 {
        let [down_held, weights_held] = [&inputs.down, &inputs.weights].map(Held::new);
        let [rows_held, residual_held, norm_held] =
            [&inputs.rows, &inputs.residual, &inputs.norm_weight]
                .map(|t| t.as_ref().map(Held::new));
        let down = down_held.view::<T>(OP)?;
        let weights = weights_held.view::<f32>(OP)?;
        // The buffers a call does not use are never read: `down` stands in, and a null
        // pointer for the rows (no u32 buffer is at hand).
        let rows = rows_held
            .as_ref()
            .map(|held| held.view::<u32>(OP))
            .transpose()?;
        let no_rows: u64 = 0;
        let residual = view_or::<T>(&residual_held, &down_held, OP)?;
        let norm_weight = view_or::<T>(&norm_held, &down_held, OP)?;
        let mut args = kernel.args();
        args.arg(&down);
        match &rows {
            Some(r) => args.arg(r),
            None => args.arg(&no_rows),
        };
        args.arg(&weights)
            .arg(&residual)
            .arg(&norm_weight)
            .arg(&sum);
        // Never written without a norm (has_norm = 0).
        match &normed {
            Some(n) => args.arg(n),
            None => args.arg(&sum),
        };
        args.arg(p);
        // A cluster's block takes a CLUSTER_BLOCKS-th of the columns; the grid is whole
        // clusters (the kernel's __cluster_dims__).
        let (blocks, columns) = if cluster {
            (CLUSTER_BLOCKS, hidden.div_ceil(CLUSTER_BLOCKS))
        } else {
            (1, hidden)
        };
        let geometry = config(
            (p.tokens * blocks as u32, 1, 1),
            (combine_threads(columns) as u32, 1, 1),
            0,
        );
        // SAFETY: arguments in the order and types of `moe_combine_*` and
        // `moe_combine_cluster_*` in kernels/moe_combine.cu; the cluster kernel's block holds
        // its columns in registers (uses_cluster), and its grid is whole clusters; every
        // view covers the elements the kernel indexes: down
        // [N, S, H] (gathered: [down_rows, H], each row index checked against down_rows in
        // the kernel), rows [N, S] when gathered, weights [N, S], residual [N, H] when
        // has_residual, norm_weight [H] when has_norm.
        unsafe { launch(args, geometry) }?;
    }
    Ok((
        tensor(sum, &dev, (tokens, hidden)),
        normed.map(|n| tensor(n, &dev, (tokens, hidden))),
    ))
}
