//! The end of a decode step's MoE block in one kernel: the routing-weighted sum of the expert
//! outputs (the shared expert is one more slot), the residual add, and the RMSNorm that
//! follows it.
//!
//! Spec. `down` `[N, S, H]`, `residual` `[..., H]` (N rows) and `norm_weight` `[H]` in the
//! activation dtype InT (f32, f16 or bf16), `weights` `[N, S]` f32 → `sum` shaped as
//! `residual` in InT and, with a norm weight, `normed` likewise; per token n and column j, in
//! f32:
//! - `acc = Σ_s weights[n, s] · f32(down[n, s, j])` (slots in order);
//! - `sum = InT(f32(residual[n, j]) + f32(InT(acc)))`;
//! - `normed = InT(f32(sum) · rsqrt(mean_j f32(sum)² + eps) · f32(norm_weight[j]))`.
//!
//! [`moe_combine_rows`] is the prefill form: the expert outputs in the order the grouped
//! products computed them (`down` `[P, H]`) and `rows` `[N, S]` u32 naming each slot's row
//! (the scatter back to pair order folded into the sum), with no residual and no norm:
//! `sum = InT(acc)`. It replaces a gather of `[N·S, H]`, its f32 copy, the weighted product
//! and the reduction over slots (four passes over `N·S·H` values) by one read of them.
//!
//! Kernels: `kernels/moe_combine.metal` and `kernels/moe_combine.cu` (`moe_combine_<in>`, one
//! block a token; on CUDA the decode form of a few tokens takes `moe_combine_cluster_<in>`, a
//! token's columns over a thread-block cluster, unless [`CombineKernel::OneBlock`] is asked
//! for); [`cpu`] is the twin both must match.

pub(crate) mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(any(feature = "metal", target_os = "macos"))]
pub mod metal;

use crate::backend::on_device;
use crate::profile::{self, elems_bytes, tensor_bytes, Traffic};
use anyhow::{ensure, Result};
use candle_core::{DType, Tensor};

/// `MoeCombineParams` of kernels/params/moe_combine.h, field for field.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MoeCombineParams {
    pub tokens: u32,
    pub slots: u32,
    pub hidden: u32,
    pub has_norm: u32,
    pub eps: f32,
    pub has_residual: u32,
    pub gathered: u32,
    pub down_rows: u32,
}

/// The read-only inputs of one call, as the backends receive them (contiguous).
pub(crate) struct Inputs {
    down: Tensor,
    /// `[N, S]` u32 row of each slot in `down`, when gathered.
    rows: Option<Tensor>,
    weights: Tensor,
    residual: Option<Tensor>,
    norm_weight: Option<Tensor>,
}

/// Which kernel takes a decode-form call ([`moe_combine_with`]). Only CUDA has a choice; the
/// other backends run their one kernel whatever is asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CombineKernel {
    /// On CUDA, a token's columns over a cluster of blocks where the call is small enough
    /// (`cuda::uses_cluster`), else one block a token.
    #[default]
    Auto,
    /// One block a token always: the cluster kernel's reference, and the A/B switch.
    OneBlock,
}

/// Columns a thread keeps in registers (`kPer` in both kernels).
pub const COMBINE_PER: usize = 4;

/// Threads of a token's threadgroup (block): [`COMBINE_PER`] columns each, whole simdgroups,
/// at most [`COMBINE_MAX_THREADS`]; rows wider than `COMBINE_PER · 512` take their columns in
/// turns. A fixed 256 threads walking a decode step's row column after column spent ~24 µs per
/// call on the H100 waiting on loads (docs/perf-notes-gpu.md, issue 25).
pub fn combine_threads(hidden: usize) -> usize {
    (hidden.div_ceil(COMBINE_PER).div_ceil(32) * 32).clamp(32, COMBINE_MAX_THREADS)
}

/// The most threads a combine block takes: the CUDA kernel holds a tile of 12 slots × 4
/// columns in registers (84 a thread), and 1 024 such threads asked for more registers than
/// an SM has (CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES at 4 096 columns on the H100); 512 fit.
pub const COMBINE_MAX_THREADS: usize = 512;

/// Whether the kernels cover `slots` expert outputs per token of width `hidden` in `dtype`;
/// the model falls back to the composed path otherwise.
pub fn supports(slots: usize, hidden: usize, dtype: DType) -> bool {
    slots >= 1
        && hidden >= 1
        && (slots * hidden) <= u32::MAX as usize
        && matches!(dtype, DType::F32 | DType::F16 | DType::BF16)
}

/// `(sum, normed)`: the residual plus the weighted expert outputs, and, when `norm` =
/// `(weight, eps)` is given, its RMSNorm (see the module doc for the maths). Both are shaped
/// as `residual`.
pub fn moe_combine(
    down: &Tensor,
    weights: &Tensor,
    residual: &Tensor,
    norm: Option<(&Tensor, f32)>,
) -> Result<(Tensor, Option<Tensor>)> {
    moe_combine_with(down, weights, residual, norm, CombineKernel::Auto)
}

/// [`moe_combine`] on the kernel `kernel` asks for (CUDA; the same maths on every backend).
pub fn moe_combine_with(
    down: &Tensor,
    weights: &Tensor,
    residual: &Tensor,
    norm: Option<(&Tensor, f32)>,
    kernel: CombineKernel,
) -> Result<(Tensor, Option<Tensor>)> {
    let (tokens, slots, hidden) = down
        .dims3()
        .map_err(|_| anyhow::anyhow!("moe_combine: down {:?} must be [N, S, H]", down.dims()))?;
    let dtype = down.dtype();
    ensure!(
        residual.dims().last() == Some(&hidden) && residual.elem_count() == tokens * hidden,
        "moe_combine: residual {:?} must hold {tokens} rows of {hidden}",
        residual.dims()
    );
    ensure!(
        residual.dtype() == dtype,
        "moe_combine: residual {:?} differs from down {dtype:?}",
        residual.dtype()
    );
    if let Some((w, _)) = norm {
        ensure!(
            w.dims() == [hidden] && w.dtype() == dtype,
            "moe_combine: norm weight {:?} {:?} must be [{hidden}] {dtype:?}",
            w.dims(),
            w.dtype()
        );
    }
    let (sum, normed) = combine(
        down,
        None,
        weights,
        Some(residual),
        norm,
        (tokens, slots, hidden),
        kernel,
    )?;
    Ok((
        sum.reshape(residual.dims())?,
        normed.map(|t| t.reshape(residual.dims())).transpose()?,
    ))
}

/// The weighted expert outputs alone, without a residual or a norm: `down` `[N, S, H]`,
/// `weights` `[N, S]` f32 → `[N, H]`, `InT(Σ_s weights[n, s] · down[n, s])` (slots in order;
/// for a block whose output is added to the stream elsewhere, e.g. by a hyper-connection).
pub fn moe_weighted_sum(down: &Tensor, weights: &Tensor) -> Result<Tensor> {
    let (tokens, slots, hidden) = down.dims3().map_err(|_| {
        anyhow::anyhow!("moe_weighted_sum: down {:?} must be [N, S, H]", down.dims())
    })?;
    let (sum, _) = combine(
        down,
        None,
        weights,
        None,
        None,
        (tokens, slots, hidden),
        CombineKernel::Auto,
    )?;
    Ok(sum)
}

/// The weighted sum of expert outputs kept in grouped order: `down` `[P, H]`, `rows` `[N, S]`
/// u32 (slot `s` of token `n` is row `rows[n, s]` of `down`), `weights` `[N, S]` f32 →
/// `[N, H]` in `down`'s dtype, `InT(Σ_s weights[n, s] · down[rows[n, s]])` (slots in order).
/// Every row index must be below `P`.
pub fn moe_combine_rows(down: &Tensor, rows: &Tensor, weights: &Tensor) -> Result<Tensor> {
    let (down_rows, hidden) = down
        .dims2()
        .map_err(|_| anyhow::anyhow!("moe_combine_rows: down {:?} must be [P, H]", down.dims()))?;
    let (tokens, slots) = rows
        .dims2()
        .map_err(|_| anyhow::anyhow!("moe_combine_rows: rows {:?} must be [N, S]", rows.dims()))?;
    ensure!(
        rows.dtype() == DType::U32,
        "moe_combine_rows: rows {:?} must be u32",
        rows.dtype()
    );
    ensure!(
        u32::try_from(down_rows).is_ok(),
        "moe_combine_rows: {down_rows} rows of down exceed u32"
    );
    let (sum, _) = combine(
        down,
        Some(rows),
        weights,
        None,
        None,
        (tokens, slots, hidden),
        CombineKernel::OneBlock,
    )?;
    Ok(sum)
}

/// The checks both forms share, then the backend: `down` is `[N, S, H]`, or any rows of `H`
/// when `rows` is given.
fn combine(
    down: &Tensor,
    rows: Option<&Tensor>,
    weights: &Tensor,
    residual: Option<&Tensor>,
    norm: Option<(&Tensor, f32)>,
    (tokens, slots, hidden): (usize, usize, usize),
    kernel: CombineKernel,
) -> Result<(Tensor, Option<Tensor>)> {
    let dtype = down.dtype();
    ensure!(
        supports(slots, hidden, dtype),
        "moe_combine: no kernel for {slots} slots of {hidden} {dtype:?} values"
    );
    ensure!(
        weights.dims() == [tokens, slots] && weights.dtype() == DType::F32,
        "moe_combine: weights {:?} {:?} must be [{tokens}, {slots}] f32",
        weights.dims(),
        weights.dtype()
    );
    ensure!(
        u32::try_from(tokens).is_ok() && u32::try_from(tokens * slots).is_ok(),
        "moe_combine: {tokens} tokens of {slots} slots exceed u32"
    );
    for t in [Some(weights), rows, residual]
        .into_iter()
        .flatten()
        .chain(norm.map(|n| n.0))
    {
        ensure!(
            t.device().same_device(down.device()),
            "moe_combine: inputs on different devices"
        );
    }
    let p = MoeCombineParams {
        tokens: tokens as u32,
        slots: slots as u32,
        hidden: hidden as u32,
        has_norm: norm.is_some() as u32,
        eps: norm.map_or(0.0, |n| n.1),
        has_residual: residual.is_some() as u32,
        gathered: rows.is_some() as u32,
        down_rows: rows.map_or(0, |_| down.dim(0).unwrap_or(0) as u32),
    };
    let inputs = Inputs {
        down: down.contiguous()?,
        rows: rows.map(|r| r.contiguous()).transpose()?,
        weights: weights.contiguous()?,
        residual: residual.map(|r| r.contiguous()).transpose()?,
        norm_weight: norm.map(|n| n.0.contiguous()).transpose()?,
    };
    let device = down.device();
    let traffic = || Ok(traffic(&inputs, (tokens, slots, hidden)));
    profile::kernel("moe_combine", device, traffic, || {
        on_device!(device, "moe_combine", moe_combine(&inputs, &p, kernel))
    })
}

/// Bytes moved (the decode profile): the `N·S` expert rows of `H` values summed (in the
/// gathered form only the rows the slots name, not all of `down`), the weights, the row
/// indices, the residual and the norm weight read; the sum written, and the normed rows
/// with a norm.
fn traffic(inputs: &Inputs, (tokens, slots, hidden): (usize, usize, usize)) -> Traffic {
    let dtype = inputs.down.dtype();
    let row = elems_bytes(hidden, dtype);
    let optional = |t: &Option<Tensor>| t.as_ref().map_or(0, tensor_bytes);
    let normed = if inputs.norm_weight.is_some() {
        tokens * row
    } else {
        0
    };
    Traffic::new()
        .read(tokens * slots * row)
        .read_all(&inputs.weights)
        .read(optional(&inputs.rows) + optional(&inputs.residual))
        .read(optional(&inputs.norm_weight))
        .write(tokens * row + normed)
}
