//! The decode-step preparation of gated attention, fused: from one token's merged q|k|v
//! projection per sequence to the normed and rotated query, the gate, and the new key and
//! value written into the KV buffers, in one kernel.
//!
//! Inputs (InT is the activation dtype: f32, f16 or bf16):
//! - `qkv` `[B, W]` (or `[B, 1, W]`), `W = 2·Nq·Dh + 2·Nkv·Dh`: per sequence the q
//!   projection viewed `[Nq, 2·Dh]` (per head `[query_h | gate_h]`), then k `[Nkv, Dh]`, then
//!   v `[Nkv, Dh]`;
//! - `q_norm`, `k_norm` `[Dh]` InT and `eps`: RMSNorm of each query and key head;
//! - `inv_freq` `[R/2]` f32: partial RoPE over the first `R` features of a head in the
//!   non-interleaved ("rotate half") layout; features `R..Dh` pass through;
//! - `pos` `[1]` u32 on the device: the token's position (the number of cached positions
//!   before it). Read by the kernel, so a captured launch replays for every position;
//! - `keys`, `values` `[B, Nkv, cap, Dh]` InT, contiguous: written in place at `pos`.
//!
//! Per head, in f32: `n = round_InT(x · rsqrt(mean(x²) + eps) · w)` (the composed path
//! stores the norm's output), then for `i < R/2`, `angle = f32(pos) · inv_freq[i]` (f32, as
//! MLX computes it), `out[i] = n[i]·cos − n[i+R/2]·sin`,
//! `out[i+R/2] = n[i+R/2]·cos + n[i]·sin`, `out[j] = n[j]` for `j ≥ R`, rounded once to InT.
//!
//! Outputs: `q` `[B, Nq, Dh]` (normed, rotated), `gate` `[B, Nq·Dh]` (the gate halves,
//! contiguous); `keys[b, h, pos] = rotate(norm(k_h))`, `values[b, h, pos] = v_h`.
//!
//! The host grows the KV buffers before the call: when `pos ≥ cap` the kernel writes no key
//! or value (it cannot report the error); `q` and `gate` are still written.
//!
//! Kernels: `kernels/attn_prep.{metal,cu}`, one simdgroup (warp) per head.

pub(crate) mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(any(feature = "metal", target_os = "macos"))]
pub mod metal;

use crate::backend::on_device;
use crate::profile::{self, elems_bytes, Traffic};
use anyhow::{ensure, Result};
use candle_core::{DType, Tensor, D};

/// Largest head dim the kernels take.
pub const MAX_HEAD_DIM: usize = 512;

/// `AttnPrepParams` of kernels/params/attn_prep.h, field for field.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnPrepParams {
    pub batch: u32,
    pub q_heads: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    pub rope_dims: u32,
    pub capacity: u32,
    pub eps: f32,
}

/// Shapes of one call, read off its inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttnPrepDims {
    pub batch: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub rope_dims: usize,
    pub capacity: usize,
}

impl AttnPrepDims {
    pub fn params(&self, eps: f32) -> AttnPrepParams {
        AttnPrepParams {
            batch: self.batch as u32,
            q_heads: self.q_heads as u32,
            kv_heads: self.kv_heads as u32,
            head_dim: self.head_dim as u32,
            rope_dims: self.rope_dims as u32,
            capacity: self.capacity as u32,
            eps,
        }
    }
}

/// Whether the kernels cover a head dim `head_dim` with `rope_dims` rotated features in
/// `dtype` (f32, f16 or bf16; `rope_dims` even and at most `head_dim ≤ MAX_HEAD_DIM`).
pub fn supports(head_dim: usize, rope_dims: usize, dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::F16 | DType::BF16)
        && (1..=MAX_HEAD_DIM).contains(&head_dim)
        && rope_dims.is_multiple_of(2)
        && rope_dims <= head_dim
}

/// Returns `(q [B, Nq, Dh], gate [B, Nq·Dh])` and writes the token's key and value into
/// `keys`, `values` at `pos`. See the module doc.
#[allow(clippy::too_many_arguments)]
pub fn attn_prep(
    qkv: &Tensor,
    q_norm: &Tensor,
    k_norm: &Tensor,
    eps: f32,
    inv_freq: &Tensor,
    pos: &Tensor,
    keys: &Tensor,
    values: &Tensor,
) -> Result<(Tensor, Tensor)> {
    let inputs = Inputs {
        qkv,
        q_norm,
        k_norm,
        eps,
        inv_freq,
        pos,
        keys,
        values,
    };
    let dims = inputs.check()?;
    // Bytes moved (the decode profile): the qkv rows, both norm weights, inv_freq and the
    // position read; q and gate (`B·Nq·Dh` values each) and one key and one value per KV head
    // (at `pos`, not the buffers) written.
    let traffic = || {
        let d = dims;
        let dtype = qkv.dtype();
        let q = elems_bytes(d.batch * d.q_heads * d.head_dim, dtype);
        let kv = elems_bytes(d.batch * d.kv_heads * d.head_dim, dtype);
        Ok(Traffic::new()
            .read_all(qkv)
            .read_all(q_norm)
            .read_all(k_norm)
            .read_all(inv_freq)
            .read_all(pos)
            .write(2 * q + 2 * kv))
    };
    let device = qkv.device();
    profile::kernel("attn_prep", device, traffic, || {
        on_device!(device, "attn_prep", attn_prep(dims, &inputs))
    })
}

/// The inputs of one call, as the backends receive them (with the dims [`Inputs::check`]
/// read off them).
#[derive(Clone, Copy)]
pub(crate) struct Inputs<'a> {
    pub qkv: &'a Tensor,
    pub q_norm: &'a Tensor,
    pub k_norm: &'a Tensor,
    pub eps: f32,
    pub inv_freq: &'a Tensor,
    pub pos: &'a Tensor,
    pub keys: &'a Tensor,
    pub values: &'a Tensor,
}

impl Inputs<'_> {
    /// Checks the tensors against each other (see the module doc) and reads the call's dims.
    pub(crate) fn check(&self) -> Result<AttnPrepDims> {
        let (qkv, keys, values) = (self.qkv, self.keys, self.values);
        let (q_norm, k_norm, inv_freq, pos) = (self.q_norm, self.k_norm, self.inv_freq, self.pos);
        let eps = self.eps;
        const OP: &str = "attn_prep";
        let (batch, kv_heads, capacity, head_dim) = keys.dims4().map_err(|_| {
            anyhow::anyhow!(
                "attn_prep: keys {:?}, expected [B, Nkv, cap, Dh]",
                keys.dims()
            )
        })?;
        ensure!(
            values.dims() == keys.dims(),
            "{OP}: values {:?} must match keys {:?}",
            values.dims(),
            keys.dims()
        );
        ensure!(
            keys.is_contiguous() && values.is_contiguous(),
            "{OP}: the KV buffers must be contiguous to be written in place"
        );
        ensure!(
            head_dim > 0 && kv_heads > 0,
            "{OP}: empty KV buffers {:?}",
            keys.dims()
        );
        let width = qkv.dim(D::Minus1)?;
        let dtype = qkv.dtype();
        let per_seq = width / head_dim;
        ensure!(
            width % head_dim == 0 && per_seq > 2 * kv_heads && (per_seq - 2 * kv_heads) % 2 == 0,
            "{OP}: qkv rows of {width} are not 2·Nq·{head_dim} + 2·{kv_heads}·{head_dim}"
        );
        let q_heads = (per_seq - 2 * kv_heads) / 2;
        ensure!(
            q_heads % kv_heads == 0,
            "{OP}: {q_heads} query heads not a multiple of {kv_heads} KV heads"
        );
        ensure!(
        qkv.elem_count() == batch * width && (qkv.rank() == 2 || qkv.dims()[1..] == [1, width]),
        "{OP}: qkv {:?}, expected [{batch}, {width}] or [{batch}, 1, {width}] (one token per sequence)",
        qkv.dims()
    );
        for (name, t) in [
            ("keys", keys),
            ("values", values),
            ("q_norm", q_norm),
            ("k_norm", k_norm),
        ] {
            ensure!(
                t.dtype() == dtype,
                "{OP}: {name} is {:?}, qkv {dtype:?}",
                t.dtype()
            );
        }
        for (name, t) in [("q_norm", q_norm), ("k_norm", k_norm)] {
            ensure!(
                t.dims() == [head_dim],
                "{OP}: {name} {:?}, expected [{head_dim}]",
                t.dims()
            );
        }
        ensure!(
            inv_freq.dtype() == DType::F32 && inv_freq.rank() == 1,
            "{OP}: inv_freq must be a [R/2] f32 tensor (got {:?} {:?})",
            inv_freq.dims(),
            inv_freq.dtype()
        );
        let rope_dims = 2 * inv_freq.dim(0)?;
        ensure!(
            supports(head_dim, rope_dims, dtype),
            "{OP}: no kernel for head dim {head_dim} with {rope_dims} rotated dims in {dtype:?}"
        );
        ensure!(
            pos.dtype() == DType::U32 && pos.dims() == [1],
            "{OP}: pos must be a [1] u32 tensor (got {:?} {:?})",
            pos.dims(),
            pos.dtype()
        );
        ensure!(
            eps.is_finite() && eps >= 0.0,
            "{OP}: eps must be finite and non-negative"
        );
        for t in [q_norm, k_norm, inv_freq, pos, keys, values] {
            ensure!(
                t.device().same_device(qkv.device()),
                "{OP}: all inputs must be on one device"
            );
        }
        Ok(AttnPrepDims {
            batch,
            q_heads,
            kv_heads,
            head_dim,
            rope_dims,
            capacity,
        })
    }
}
