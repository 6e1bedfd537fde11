//! The front of a Gated DeltaNet decode step in one kernel: everything between the merged
//! in-projection and the recurrence ([`crate::gated_delta_update`]).
//!
//! One token per sequence. With `C = 2·Hk·Dk + Hv·Dv` channels (all q, then all k, then all
//! v), `K` taps, activation dtype `InT` ∈ {f32, f16, bf16}, per batch row:
//!
//! ```text
//! window[c] = [conv_state[0..K−1, c], qkv[c]]
//! conv[c]   = Σ_m window[m]·taps[m, c]                      (f32)
//! act[c]    = InT(silu(conv[c]))                            (the one rounding of the conv)
//! conv_state[.., c] ← window[1..K]                          (in place, newest last)
//! q = InT(act·rsqrt(mean(act²) + 1e−6)·(1/Dk))              per key head (Dk channels)
//! k = InT(act·rsqrt(mean(act²) + 1e−6)·(1/√Dk))             per key head
//! v = act                                                   per value head (Dv channels)
//! g[hv]    = exp(neg_a_exp[hv]·softplus(a[hv] + dt_bias[hv]))   softplus(x) = max(x, 0) + log1p(e^−|x|)
//! beta[hv] = sigmoid(b[hv])                                 (f32)
//! ```
//!
//! The q/k norm is the model's `ScaledRms` (an unweighted RMSNorm with eps 1e−6 times a
//! constant: the L2 norm with the attention scale folded into q), here with the scales in
//! f32 rather than rounded to `InT` first. The composed path rounds the conv to `InT` before
//! the SiLU as well; this op rounds once, after it.
//!
//! Inputs (dtype `InT` unless stated):
//! - `qkv` `[B, C]` or `[B, 1, C]`: each row contiguous, the rows at any stride, so a slice of
//!   the merged projection's output is read in place (no copy);
//! - `b`, `a` `[B, Hv]` or `[B, 1, Hv]`: likewise;
//! - `conv_state` `[B, K−1, C]`, contiguous, advanced in place;
//! - `taps` `[K, C]`, contiguous (tap `m` of channel `c` at `taps[m, c]`);
//! - `dt_bias`, `neg_a_exp` (= −exp(A_log)) `[Hv]` f32, contiguous.
//!
//! Outputs: `q`, `k` `[B, 1, Hk, Dk]` and `v` `[B, 1, Hv, Dv]` in `InT`, `g` and `beta`
//! `[B, 1, Hv]` f32, contiguous: what [`crate::gated_delta_update`] takes.

pub(crate) mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(any(feature = "metal", target_os = "macos"))]
pub mod metal;

use crate::backend::{ensure_same_device, row_layout, RowLayout};
use crate::launches;
use anyhow::{bail, ensure, Result};
use candle_core::{DType, Device, Tensor};

/// The head geometry of a GDN layer and its conv kernel size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvPrepDims {
    pub key_heads: usize,
    pub key_dim: usize,
    pub value_heads: usize,
    pub value_dim: usize,
    /// `K`, the conv's taps per channel (4 in every release).
    pub kernel_size: usize,
}

impl ConvPrepDims {
    /// `C = 2·Hk·Dk + Hv·Dv`.
    pub fn channels(&self) -> usize {
        2 * self.key_heads * self.key_dim + self.value_heads * self.value_dim
    }

    /// Head slots of the kernels (one simdgroup or warp each): Hk q heads, Hk k heads, Hv
    /// v heads.
    pub fn slots(&self) -> usize {
        2 * self.key_heads + self.value_heads
    }
}

/// What [`gdn_conv_prep`] returns: the recurrence's inputs.
#[derive(Debug, Clone)]
pub struct ConvPrepOut {
    /// `[B, 1, Hk, Dk]`, `InT`.
    pub q: Tensor,
    /// `[B, 1, Hk, Dk]`, `InT`.
    pub k: Tensor,
    /// `[B, 1, Hv, Dv]`, `InT`.
    pub v: Tensor,
    /// `[B, 1, Hv]` f32, in (0, 1].
    pub g: Tensor,
    /// `[B, 1, Hv]` f32.
    pub beta: Tensor,
}

/// `ConvPrepParams` of kernels/params/gdn_conv_prep.h, field for field: the launch parameters
/// shared by the Metal and CUDA kernels.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ConvPrepParams {
    pub batch: u32,
    pub key_heads: u32,
    pub key_dim: u32,
    pub value_heads: u32,
    pub value_dim: u32,
    pub kernel_size: u32,
    pub qkv_row_stride: u32,
    pub b_row_stride: u32,
    pub a_row_stride: u32,
    pub q_scale: f32,
    pub k_scale: f32,
    pub norm_eps: f32,
}

/// The epsilon inside the q and k norms (mlx-lm's, for GDN queries and keys).
pub const NORM_EPS: f32 = 1e-6;
/// Channels per lane the kernels keep in registers: head dims up to 32 of them.
pub const MAX_HEAD_DIM: usize = 256;
/// Conv kernel sizes the kernels are tested for.
pub const KERNEL_SIZES: std::ops::RangeInclusive<usize> = 2..=8;

/// `1/Dk` and `1/√Dk`: the scales of q and k after their L2 norms, in f32.
pub fn qk_scales(key_dim: usize) -> (f32, f32) {
    (1.0 / key_dim as f32, (key_dim as f64).powf(-0.5) as f32)
}

/// Whether the device kernels cover these dims and this activation dtype: head dims that are
/// multiples of 32 up to 256, 2 to 8 taps, value heads a multiple of key heads, f32, f16 or
/// bf16. The model falls back to the composed path otherwise. (The CPU twin takes any dims.)
pub fn supports(dims: &ConvPrepDims, dtype: DType) -> bool {
    let head_dim_ok = |d: usize| d > 0 && d.is_multiple_of(32) && d <= MAX_HEAD_DIM;
    matches!(dtype, DType::F32 | DType::F16 | DType::BF16)
        && head_dim_ok(dims.key_dim)
        && head_dim_ok(dims.value_dim)
        && KERNEL_SIZES.contains(&dims.kernel_size)
        && dims.key_heads > 0
        && dims.value_heads.is_multiple_of(dims.key_heads)
}

/// The inputs of one call after the checks, as the backends receive them.
#[cfg_attr(
    not(any(feature = "metal", target_os = "macos", feature = "cuda")),
    allow(dead_code)
)]
pub(crate) struct Inputs<'a> {
    pub dims: ConvPrepDims,
    pub batch: usize,
    pub qkv: &'a Tensor,
    pub b: &'a Tensor,
    pub a: &'a Tensor,
    pub conv_state: &'a Tensor,
    pub taps: &'a Tensor,
    pub dt_bias: &'a Tensor,
    pub neg_a_exp: &'a Tensor,
    /// Where the rows of `qkv`, `b` and `a` are (views are read in place).
    pub qkv_rows: RowLayout,
    pub b_rows: RowLayout,
    pub a_rows: RowLayout,
}

// What only the device backends use.
#[cfg_attr(
    not(any(feature = "metal", target_os = "macos", feature = "cuda")),
    allow(dead_code)
)]
impl Inputs<'_> {
    pub(crate) fn params(&self) -> Result<ConvPrepParams> {
        let d = self.dims;
        let u = |n: usize, what: &str| -> Result<u32> {
            u32::try_from(n).map_err(|_| anyhow::anyhow!("gdn_conv_prep: {what} {n} exceeds u32"))
        };
        let (q_scale, k_scale) = qk_scales(d.key_dim);
        Ok(ConvPrepParams {
            batch: u(self.batch, "batch")?,
            key_heads: u(d.key_heads, "key heads")?,
            key_dim: u(d.key_dim, "key dim")?,
            value_heads: u(d.value_heads, "value heads")?,
            value_dim: u(d.value_dim, "value dim")?,
            kernel_size: u(d.kernel_size, "kernel size")?,
            qkv_row_stride: u(self.qkv_rows.strides[0], "qkv row stride")?,
            b_row_stride: u(self.b_rows.strides[0], "b row stride")?,
            a_row_stride: u(self.a_rows.strides[0], "a row stride")?,
            q_scale,
            k_scale,
            norm_eps: NORM_EPS,
        })
    }
}

/// One decode step's conv, SiLU, q/k norms, decay and beta; advances `conv_state` in place.
/// See the module documentation for the maths, shapes and dtypes.
#[allow(clippy::too_many_arguments)]
pub fn gdn_conv_prep(
    qkv: &Tensor,
    b: &Tensor,
    a: &Tensor,
    conv_state: &Tensor,
    taps: &Tensor,
    dt_bias: &Tensor,
    neg_a_exp: &Tensor,
    dims: ConvPrepDims,
) -> Result<ConvPrepOut> {
    const OP: &str = "gdn_conv_prep";
    let d = dims;
    ensure!(
        d.key_heads > 0 && d.key_dim > 0 && d.value_dim > 0,
        "{OP}: head counts and dims must be positive ({d:?})"
    );
    ensure!(
        d.value_heads.is_multiple_of(d.key_heads),
        "{OP}: {} value heads not a multiple of {} key heads",
        d.value_heads,
        d.key_heads
    );
    ensure!(
        d.kernel_size >= 2,
        "{OP}: the conv needs at least 2 taps (got {})",
        d.kernel_size
    );
    let dtype = qkv.dtype();
    ensure!(
        matches!(dtype, DType::F32 | DType::F16 | DType::BF16),
        "{OP}: activations must be f32, f16 or bf16 (got {dtype:?})"
    );
    let (c, hv, kk) = (d.channels(), d.value_heads, d.kernel_size);
    let (batch, history, state_c) = conv_state.dims3().map_err(|_| {
        anyhow::anyhow!(
            "{OP}: conv_state {:?} must be [B, K-1, C]",
            conv_state.dims()
        )
    })?;
    ensure!(
        (history, state_c) == (kk - 1, c),
        "{OP}: conv_state {:?}, expected [B, {}, {c}]",
        conv_state.dims(),
        kk - 1
    );
    ensure!(
        conv_state.is_contiguous(),
        "{OP}: conv_state must be contiguous to be updated in place"
    );
    ensure!(
        taps.dims() == [kk, c] && taps.is_contiguous(),
        "{OP}: taps {:?} must be a contiguous [{kk}, {c}]",
        taps.dims()
    );
    for (name, t) in [
        ("b", b),
        ("a", a),
        ("conv_state", conv_state),
        ("taps", taps),
    ] {
        ensure!(
            t.dtype() == dtype,
            "{OP}: {name} is {:?}, qkv {dtype:?}: they must match",
            t.dtype()
        );
    }
    for (name, t) in [("dt_bias", dt_bias), ("neg_a_exp", neg_a_exp)] {
        ensure!(
            t.dims() == [hv] && t.dtype() == DType::F32 && t.is_contiguous(),
            "{OP}: {name} must be a contiguous f32 [{hv}] (got {:?} {:?})",
            t.dtype(),
            t.dims()
        );
    }
    ensure_same_device(
        OP,
        conv_state,
        "conv_state",
        &[
            ("qkv", qkv),
            ("b", b),
            ("a", a),
            ("taps", taps),
            ("dt_bias", dt_bias),
            ("neg_a_exp", neg_a_exp),
        ],
    )?;
    let inputs = Inputs {
        dims,
        batch,
        qkv,
        b,
        a,
        conv_state,
        taps,
        dt_bias,
        neg_a_exp,
        qkv_rows: row_layout(qkv, &[batch], c, "gdn_conv_prep: qkv")?,
        b_rows: row_layout(b, &[batch], hv, "gdn_conv_prep: b")?,
        a_rows: row_layout(a, &[batch], hv, "gdn_conv_prep: a")?,
    };
    match conv_state.device() {
        Device::Cpu => launches::cpu_twin(|| cpu::gdn_conv_prep(&inputs)),
        #[cfg(any(feature = "metal", target_os = "macos"))]
        Device::Metal(_) => metal::gdn_conv_prep(&inputs),
        #[cfg(feature = "cuda")]
        Device::Cuda(_) => cuda::gdn_conv_prep(&inputs),
        #[allow(unreachable_patterns)]
        other => bail!("{OP}: no kernel for device {other:?}"),
    }
}
