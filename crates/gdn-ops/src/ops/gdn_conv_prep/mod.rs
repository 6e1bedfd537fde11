//! The front of a Gated DeltaNet layer in one kernel: everything between the merged
//! in-projection and the recurrence ([`crate::gated_delta_update`]), for a decode step
//! (S = 1) or a whole prefill chunk (S tokens per sequence).
//!
//! With `C = 2·Hk·Dk + Hv·Dv` channels (all q, then all k, then all v), `K` taps, activation
//! dtype `InT` ∈ {f32, f16, bf16}, per batch row and token `t` of the chunk, with
//! `padded = [conv_state; qkv]` (`K − 1 + S` rows):
//!
//! ```text
//! window[c] = padded[t .. t+K, c]                           (rows t−K+1..t of the sequence)
//! conv[c]   = Σ_m window[m]·taps[m, c]                      (f32, oldest row first)
//! act[c]    = InT(silu(conv[c]))                            (the one rounding of the conv)
//! q = InT(act·rsqrt(mean(act²) + 1e−6)·(1/Dk))              per key head (Dk channels)
//! k = InT(act·rsqrt(mean(act²) + 1e−6)·(1/√Dk))             per key head
//! v = act                                                   per value head (Dv channels)
//! g[hv]    = exp(neg_a_exp[hv]·softplus(a[hv] + dt_bias[hv]))   softplus(x) = max(x, 0) + log1p(e^−|x|)
//! beta[hv] = sigmoid(b[hv])                                 (f32)
//! conv_state after the chunk = padded[S .. S+K−1]           (the last K − 1 rows)
//! ```
//!
//! Every token's arithmetic is the decode step's, in the same order, so prefilling a prompt
//! and decoding it token by token give the same q, k, v, g and beta, bit for bit.
//!
//! The q/k norm is the model's `ScaledRms` (an unweighted RMSNorm with eps 1e−6 times a
//! constant: the L2 norm with the attention scale folded into q), here with the scales in
//! f32 rather than rounded to `InT` first. The composed path rounds the conv to `InT` before
//! the SiLU as well; this op rounds once, after it.
//!
//! The conv state: for S = 1 it is advanced in place (each element is read and written by
//! one thread), as the decode step always did; for S > 1 the tokens' blocks all read the old
//! state, so the new one goes to a fresh tensor, written by the last token's blocks. Either
//! way [`ConvPrepOut::conv_state`] is the state after the chunk. S = 0 launches nothing and
//! returns the state unchanged.
//!
//! Inputs (dtype `InT` unless stated):
//! - `qkv` `[B, S, C]` (or `[B, C]` for one token): each row contiguous, the rows at any
//!   strides, so a slice of the merged projection's output is read in place (no copy);
//! - `b`, `a` `[B, S, Hv]` (or `[B, Hv]`): likewise;
//! - `conv_state` `[B, K−1, C]`, contiguous: the K − 1 rows before the chunk;
//! - `taps` `[K, C]`, contiguous (tap `m` of channel `c` at `taps[m, c]`);
//! - `dt_bias`, `neg_a_exp` (= −exp(A_log)) `[Hv]` f32, contiguous.
//!
//! Outputs: `q`, `k` `[B, S, Hk, Dk]` and `v` `[B, S, Hv, Dv]` in `InT`, `g` and `beta`
//! `[B, S, Hv]` f32, contiguous: what [`crate::gated_delta_update`] takes; and the conv state
//! after the chunk `[B, K−1, C]`.

pub(crate) mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(any(feature = "metal", target_os = "macos"))]
pub mod metal;

use crate::backend::on_device;
use crate::backend::{ensure_same_device, row_layout, RowLayout};
use crate::profile::{self, tensor_bytes, Traffic};
use anyhow::{bail, ensure, Result};
use candle_core::{DType, Tensor};

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

/// What [`gdn_conv_prep`] returns: the recurrence's inputs and the conv state after them.
#[derive(Debug, Clone)]
pub struct ConvPrepOut {
    /// `[B, S, Hk, Dk]`, `InT`.
    pub q: Tensor,
    /// `[B, S, Hk, Dk]`, `InT`.
    pub k: Tensor,
    /// `[B, S, Hv, Dv]`, `InT`.
    pub v: Tensor,
    /// `[B, S, Hv]` f32, in (0, 1].
    pub g: Tensor,
    /// `[B, S, Hv]` f32.
    pub beta: Tensor,
    /// `[B, K−1, C]`, `InT`: the state after the chunk. For S ≤ 1 the input tensor itself
    /// (advanced in place for S = 1); for S > 1 a new tensor, the input left unchanged.
    pub conv_state: Tensor,
}

/// `ConvPrepParams` of kernels/params/gdn_conv_prep.h, field for field: the launch parameters
/// shared by the Metal and CUDA kernels.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ConvPrepParams {
    pub batch: u32,
    pub tokens: u32,
    pub key_heads: u32,
    pub key_dim: u32,
    pub value_heads: u32,
    pub value_dim: u32,
    pub kernel_size: u32,
    pub qkv_batch_stride: u32,
    pub qkv_token_stride: u32,
    pub b_batch_stride: u32,
    pub b_token_stride: u32,
    pub a_batch_stride: u32,
    pub a_token_stride: u32,
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
    /// S, at least 1 (an empty chunk never reaches a backend).
    pub tokens: usize,
    pub qkv: &'a Tensor,
    pub b: &'a Tensor,
    pub a: &'a Tensor,
    pub conv_state: &'a Tensor,
    pub taps: &'a Tensor,
    pub dt_bias: &'a Tensor,
    pub neg_a_exp: &'a Tensor,
    /// Where the rows of `qkv`, `b` and `a` are (views are read in place): strides of the
    /// batch and token dims.
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
        let u = |n: usize, what: &str| super::param_u32("gdn_conv_prep", what, n);
        let (q_scale, k_scale) = qk_scales(d.key_dim);
        Ok(ConvPrepParams {
            batch: u(self.batch, "batch")?,
            tokens: u(self.tokens, "tokens")?,
            key_heads: u(d.key_heads, "key heads")?,
            key_dim: u(d.key_dim, "key dim")?,
            value_heads: u(d.value_heads, "value heads")?,
            value_dim: u(d.value_dim, "value dim")?,
            kernel_size: u(d.kernel_size, "kernel size")?,
            qkv_batch_stride: u(self.qkv_rows.strides[0], "qkv batch stride")?,
            qkv_token_stride: u(self.qkv_rows.strides[1], "qkv token stride")?,
            b_batch_stride: u(self.b_rows.strides[0], "b batch stride")?,
            b_token_stride: u(self.b_rows.strides[1], "b token stride")?,
            a_batch_stride: u(self.a_rows.strides[0], "a batch stride")?,
            a_token_stride: u(self.a_rows.strides[1], "a token stride")?,
            q_scale,
            k_scale,
            norm_eps: NORM_EPS,
        })
    }
}

/// A chunk's conv, SiLU, q/k norms, decay and beta, and the conv state after it (in place
/// for one token). See the module documentation for the maths, shapes and dtypes.
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
    // One token may come as [B, C] rows: the same as [B, 1, C].
    let (qkv, b, a) = match qkv.rank() {
        2 => (qkv.unsqueeze(1)?, b.unsqueeze(1)?, a.unsqueeze(1)?),
        _ => (qkv.clone(), b.clone(), a.clone()),
    };
    let inputs = Inputs::checked(&qkv, &b, &a, conv_state, taps, dt_bias, neg_a_exp, dims)?;
    if inputs.tokens == 0 || inputs.batch == 0 {
        return empty(&inputs);
    }
    let device = conv_state.device();
    profile::kernel(
        OP,
        device,
        || Ok(traffic(&inputs)),
        || on_device!(device, OP, gdn_conv_prep(&inputs)),
    )
}

const OP: &str = "gdn_conv_prep";

impl<'a> Inputs<'a> {
    /// The checks of one call with `qkv`, `b`, `a` as `[B, S, ·]`: the inputs as the backends
    /// receive them, or a one-line error.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn checked(
        qkv: &'a Tensor,
        b: &'a Tensor,
        a: &'a Tensor,
        conv_state: &'a Tensor,
        taps: &'a Tensor,
        dt_bias: &'a Tensor,
        neg_a_exp: &'a Tensor,
        dims: ConvPrepDims,
    ) -> Result<Self> {
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
        let tokens = match qkv.dims() {
            &[qb, s, _] if qb == batch => s,
            other => bail!("{OP}: qkv {other:?}, expected [{batch}, S, {c}] or [{batch}, {c}]"),
        };
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
        let lead = [batch, tokens];
        Ok(Inputs {
            dims,
            batch,
            tokens,
            qkv,
            b,
            a,
            conv_state,
            taps,
            dt_bias,
            neg_a_exp,
            qkv_rows: row_layout(qkv, &lead, c, "gdn_conv_prep: qkv")?,
            b_rows: row_layout(b, &lead, hv, "gdn_conv_prep: b")?,
            a_rows: row_layout(a, &lead, hv, "gdn_conv_prep: a")?,
        })
    }
}

/// Bytes moved (the decode profile): the chunk's qkv, b and a rows (the views' elements, not
/// the wider projection they sit in), the conv state, the taps, dt_bias and neg_a_exp read;
/// q, k, v (`C` values per token), g and beta (f32) and the conv state written.
pub(crate) fn traffic(inputs: &Inputs) -> Traffic {
    let tokens = inputs.batch * inputs.tokens;
    let hv = inputs.dims.value_heads;
    let state = tensor_bytes(inputs.conv_state);
    Traffic::new()
        .read_all(inputs.qkv)
        .read_all(inputs.b)
        .read_all(inputs.a)
        .read(state)
        .read_all(inputs.taps)
        .read_all(inputs.dt_bias)
        .read_all(inputs.neg_a_exp)
        .write(tensor_bytes(inputs.qkv) + 2 * tokens * hv * 4 + state)
}

/// An empty chunk (or batch): empty outputs, the state as it was, nothing launched.
fn empty(inputs: &Inputs) -> Result<ConvPrepOut> {
    let d = inputs.dims;
    let (bn, s) = (inputs.batch, inputs.tokens);
    let (dtype, dev) = (inputs.qkv.dtype(), inputs.conv_state.device());
    let zeros = |shape: &[usize], dtype: DType| Tensor::zeros(shape, dtype, dev);
    Ok(ConvPrepOut {
        q: zeros(&[bn, s, d.key_heads, d.key_dim], dtype)?,
        k: zeros(&[bn, s, d.key_heads, d.key_dim], dtype)?,
        v: zeros(&[bn, s, d.value_heads, d.value_dim], dtype)?,
        g: zeros(&[bn, s, d.value_heads], DType::F32)?,
        beta: zeros(&[bn, s, d.value_heads], DType::F32)?,
        conv_state: inputs.conv_state.clone(),
    })
}
