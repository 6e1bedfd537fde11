//! The gated-delta recurrence with the gated RMSNorm folded into its output: one kernel for
//! what [`crate::gated_delta_update`] followed by
//! [`crate::ops::gated_rms_norm::gated_rms_norm`] compute in two, saving a launch per GDN
//! layer.
//!
//! Per token, per state row `S[b, hv, dv, :]` (mlx-lm's order): `S ← g·S`; `kv = S·k`;
//! `δ = (v − kv)·β`; `S ← S + δ⊗k`; `y[dv] = InT(S·q)`. Then per `(b, t, hv)` over its `Dv`
//! outputs: `n = InT(y·rsqrt(mean(y²) + eps)·weight)`, `out = InT(gate(z)·n)`, the gate
//! `silu` (Qwen3-Next, Qwen3.5) or `sigmoid` (`qwen4_exp`'s `output_gate_type`). Arithmetic is
//! f32; y is rounded to `InT` before the norm exactly as the two-op path stores it in
//! between; the state is read once and written once per call in its own dtype (f32, or bf16
//! when opted in), never rounded to `InT`.
//!
//! Inputs: `q`, `k` `[B, T, Hk, Dk]`, `v` `[B, T, Hv, Dv]` in `InT` ∈ {f32, f16, bf16}; `g`,
//! `beta` `[B, T, Hv]` f32; `state` `[B, Hv, Dv, Dk]` f32 or bf16, contiguous, advanced in
//! place; `z` `[B, T, Hv, Dv]` or `[B, T, Hv·Dv]` in `InT`, each token's values contiguous,
//! the tokens at any stride (a slice of the merged projection is read in place); `weight`
//! `[Dv]` in `InT`, contiguous. Output `[B, T, Hv, Dv]` in `InT`. No padding mask.

pub(crate) mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(any(feature = "metal", target_os = "macos"))]
pub mod metal;

use crate::backend::on_device;
use crate::backend::{ensure_same_device, row_layout, RowLayout};
use crate::ops::gated_delta::{self, GdnDims};
use crate::profile;
use anyhow::{ensure, Result};
use candle_core::{DType, Tensor};

/// `GdnNormParams` of kernels/params/gated_delta_norm.h, field for field: the launch
/// parameters shared by the Metal and CUDA kernels.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GdnNormParams {
    pub batch: u32,
    pub steps: u32,
    pub key_heads: u32,
    pub value_heads: u32,
    pub key_dim: u32,
    pub value_dim: u32,
    pub z_batch_stride: u32,
    pub z_token_stride: u32,
    pub eps: f32,
    /// 1: the gate is `sigmoid(z)`; 0: `silu(z)`.
    pub sigmoid_gate: u32,
}

/// The gate on the normed output: `silu(z)`, or `sigmoid(z)` (a family's choice:
/// `qwen4_exp`'s `output_gate_type: sigmoid`). One kernel takes both: `silu(z)` is
/// `z·sigmoid(z)`, so the kernels' gate is `(sigmoid ? 1 : z) / (1 + exp(−z))`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    Silu,
    Sigmoid,
}

/// State rows one simdgroup (warp) keeps in registers.
pub const MAX_ROWS_PER_SIMDGROUP: usize = 8;
/// Simdgroups (warps) per threadgroup at most: 1024 threads.
pub const MAX_SIMDGROUPS: usize = 32;

/// Whether the device kernels cover these dims and dtypes: a key head dim that is a multiple
/// of 32 up to 256, a value head dim up to 256 (8 rows for each of 32 simdgroups), value heads
/// a multiple of key heads, activations f32, f16 or bf16, the state f32 or bf16. The model
/// falls back to the two ops otherwise. (The CPU twin takes any dims.) On Metal a pipeline
/// that allows fewer than 1024 threads per threadgroup lowers the largest value head dim.
pub fn supports(dims: &GdnDims, dtype: DType, state: DType) -> bool {
    matches!(dtype, DType::F32 | DType::F16 | DType::BF16)
        && matches!(state, DType::F32 | DType::BF16)
        && dims.key_dim.is_multiple_of(32)
        && (32..=256).contains(&dims.key_dim)
        && (1..=MAX_ROWS_PER_SIMDGROUP * MAX_SIMDGROUPS).contains(&dims.value_dim)
        && dims.key_heads > 0
        && dims.value_heads.is_multiple_of(dims.key_heads)
}

/// The inputs of one call after the checks, as the backends receive them.
#[cfg_attr(
    not(any(feature = "metal", target_os = "macos", feature = "cuda")),
    allow(dead_code)
)]
pub(crate) struct Inputs<'a> {
    pub recurrence: gated_delta::Inputs<'a>,
    pub dims: GdnDims,
    pub state: &'a Tensor,
    pub z: &'a Tensor,
    pub weight: &'a Tensor,
    pub eps: f32,
    pub gate: Gate,
    /// Where z's tokens are (a view is read in place).
    pub z_rows: RowLayout,
}

// What only the device backends use.
#[cfg_attr(
    not(any(feature = "metal", target_os = "macos", feature = "cuda")),
    allow(dead_code)
)]
impl Inputs<'_> {
    pub(crate) fn params(&self) -> Result<GdnNormParams> {
        let d = self.dims;
        let u = |n: usize, what: &str| super::param_u32("gated_delta_update_norm", what, n);
        Ok(GdnNormParams {
            batch: u(d.batch, "batch")?,
            steps: u(d.steps, "steps")?,
            key_heads: u(d.key_heads, "key heads")?,
            value_heads: u(d.value_heads, "value heads")?,
            key_dim: u(d.key_dim, "key dim")?,
            value_dim: u(d.value_dim, "value dim")?,
            z_batch_stride: u(self.z_rows.strides[0], "z batch stride")?,
            z_token_stride: u(self.z_rows.strides[1], "z token stride")?,
            eps: self.eps,
            sigmoid_gate: u32::from(self.gate == Gate::Sigmoid),
        })
    }

    /// Simdgroups per threadgroup for a launch that allows `max_threads` threads per
    /// threadgroup: as many as allowed (32 at most), and no more than the rows.
    pub(crate) fn simdgroups(&self, max_threads: usize) -> Result<usize> {
        let s = (max_threads / 32)
            .min(MAX_SIMDGROUPS)
            .min(self.dims.value_dim)
            .max(1);
        ensure!(
            self.dims.value_dim.div_ceil(s) <= MAX_ROWS_PER_SIMDGROUP,
            "gated_delta_update_norm: {} value rows need more than {s} simdgroups of {MAX_ROWS_PER_SIMDGROUP}",
            self.dims.value_dim
        );
        Ok(s)
    }
}

/// Advances `state` in place over `T` tokens and returns the gated RMSNorm of the
/// recurrence's output with `gate`, `[B, T, Hv, Dv]` in q's dtype; see the module
/// documentation.
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_update_norm(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    g: &Tensor,
    beta: &Tensor,
    state: &Tensor,
    z: &Tensor,
    weight: &Tensor,
    eps: f32,
    gate: Gate,
) -> Result<Tensor> {
    let inputs = Inputs::checked(q, k, v, g, beta, state, z, weight, eps, gate)?;
    let dims = inputs.dims;
    // Bytes moved (the decode profile): the recurrence's (`gated_delta::traffic`: its inputs,
    // the state read and written once, the output written), plus z and the norm weight read.
    let traffic = || {
        Ok(gated_delta::traffic(&inputs.recurrence, dims, state)
            .read_all(z)
            .read_all(weight))
    };
    let device = state.device();
    profile::kernel("gated_delta_norm", device, traffic, || {
        on_device!(device, OP, gated_delta_update_norm(&inputs))
    })
}

const OP: &str = "gated_delta_update_norm";

impl<'a> Inputs<'a> {
    /// The checks of one call (shapes, dtypes, devices, the state contiguous): the inputs as
    /// the backends receive them, or a one-line error.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn checked(
        q: &'a Tensor,
        k: &'a Tensor,
        v: &'a Tensor,
        g: &'a Tensor,
        beta: &'a Tensor,
        state: &'a Tensor,
        z: &'a Tensor,
        weight: &'a Tensor,
        eps: f32,
        gate: Gate,
    ) -> Result<Self> {
        let recurrence = gated_delta::Inputs::new(q, k, v, g, beta, None);
        let dims = GdnDims::of(&recurrence, state)?;
        let dtype = q.dtype();
        ensure!(
            matches!(dtype, DType::F32 | DType::F16 | DType::BF16),
            "{OP}: activations must be f32, f16 or bf16 (got {dtype:?})"
        );
        for (name, t) in [("k", k), ("v", v), ("z", z), ("weight", weight)] {
            ensure!(
                t.dtype() == dtype,
                "{OP}: {name} is {:?}, q {dtype:?}: they must match",
                t.dtype()
            );
        }
        for (name, t) in [("g", g), ("beta", beta)] {
            ensure!(
                t.dtype() == DType::F32,
                "{OP}: {name} must be f32 (got {:?})",
                t.dtype()
            );
        }
        ensure!(
            matches!(state.dtype(), DType::F32 | DType::BF16),
            "{OP}: the state must be f32 or bf16 (got {:?})",
            state.dtype()
        );
        ensure!(
            state.is_contiguous(),
            "{OP}: the state must be contiguous to be updated in place"
        );
        ensure!(
            weight.dims() == [dims.value_dim] && weight.is_contiguous(),
            "{OP}: weight {:?} must be a contiguous [{}]",
            weight.dims(),
            dims.value_dim
        );
        ensure!(
            eps.is_finite() && eps >= 0.0,
            "{OP}: eps must be finite and non-negative (got {eps})"
        );
        ensure_same_device(
            OP,
            state,
            "the state",
            &[
                ("q", q),
                ("k", k),
                ("v", v),
                ("g", g),
                ("beta", beta),
                ("z", z),
                ("weight", weight),
            ],
        )?;
        Ok(Inputs {
            recurrence,
            dims,
            state,
            z,
            weight,
            eps,
            gate,
            z_rows: row_layout(
                z,
                &[dims.batch, dims.steps],
                dims.value_heads * dims.value_dim,
                "gated_delta_update_norm: z",
            )?,
        })
    }
}
