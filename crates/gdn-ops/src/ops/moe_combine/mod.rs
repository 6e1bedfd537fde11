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
//! Kernels: `kernels/moe_combine.metal` and `kernels/moe_combine.cu` (`moe_combine_<in>`);
//! [`cpu`] is the twin both must match.

pub(crate) mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(any(feature = "metal", target_os = "macos"))]
pub mod metal;

use crate::launches;
use anyhow::{bail, ensure, Result};
use candle_core::{DType, Device, Tensor};

/// `MoeCombineParams` of kernels/params/moe_combine.h, field for field.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MoeCombineParams {
    pub tokens: u32,
    pub slots: u32,
    pub hidden: u32,
    pub has_norm: u32,
    pub eps: f32,
}

/// The read-only inputs of one call, as the backends receive them (contiguous).
pub(crate) struct Inputs {
    down: Tensor,
    weights: Tensor,
    residual: Tensor,
    norm_weight: Option<Tensor>,
}

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
    let (tokens, slots, hidden) = down
        .dims3()
        .map_err(|_| anyhow::anyhow!("moe_combine: down {:?} must be [N, S, H]", down.dims()))?;
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
    for t in [weights, residual].into_iter().chain(norm.map(|n| n.0)) {
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
    };
    let inputs = Inputs {
        down: down.contiguous()?,
        weights: weights.contiguous()?,
        residual: residual.contiguous()?,
        norm_weight: norm.map(|n| n.0.contiguous()).transpose()?,
    };
    let (sum, normed) = match down.device() {
        Device::Cpu => launches::cpu_twin(|| cpu::moe_combine(&inputs, &p))?,
        #[cfg(any(feature = "metal", target_os = "macos"))]
        Device::Metal(_) => metal::moe_combine(&inputs, &p)?,
        #[cfg(feature = "cuda")]
        Device::Cuda(_) => cuda::moe_combine(&inputs, &p)?,
        other => bail!("moe_combine: no kernel for {other:?} yet"),
    };
    Ok((
        sum.reshape(residual.dims())?,
        normed.map(|t| t.reshape(residual.dims())).transpose()?,
    ))
}
