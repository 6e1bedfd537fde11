//! The attention mixer's decode step on fused kernels: the merged q/k/v product, one kernel
//! for the q/k RMSNorms, the partial RoPE and the KV append at a position read on the device
//! (`attn_prep`), one for the attention with the sigmoid gate applied to its output
//! (`attn_decode`), and the o-projection. [`Attention::forward`] is the composed path these
//! kernels are tested against.

use super::Attention;
use crate::cache::KvCache;
use crate::candle_ops::cat;
use anyhow::{Context, Result};
use candle_core::{DType, Tensor, D};
use gdn_ops::ops::{attn_decode, attn_decode_slots, attn_prep, attn_prep_slots};
use gdn_ops::profile;

impl Attention {
    /// Whether the fused kernels cover this layer in `dtype`.
    pub(crate) fn fused_decode_supported(&self, dtype: DType) -> bool {
        self.rope_inv_freq.is_some()
            && attn_prep::supports(self.head_dim, self.rope.dims(), dtype)
            && attn_decode::supports(self.head_dim, self.heads, self.kv_heads, dtype)
    }

    /// One token per sequence at the position `pos` (`[1]` u32 on the device, equal to the
    /// cache's length): `x` `[B, H]` (input-normed) → the mixer's output `[B, H]`.
    pub(crate) fn decode_fused(
        &self,
        x: &Tensor,
        cache: &mut KvCache,
        pos: &Tensor,
    ) -> Result<Tensor> {
        let qkv = self.decode_qkv(x)?;
        let o = self.decode_attend_fused(&qkv, cache, pos)?;
        self.decode_o_proj(&o)
    }

    /// The merged q/k/v product of [`Attention::decode_fused`]: `x` `[B, H]` → `[B, ·]` (one
    /// product for every row of a batched step).
    pub(crate) fn decode_qkv(&self, x: &Tensor) -> Result<Tensor> {
        profile::labelled("attn.qkv", || match self.qkv.merged() {
            Some(linear) => linear.forward(x),
            None => {
                let parts = self.qkv.forward(x)?;
                cat(&parts, D::Minus1)
            }
        })
    }

    /// The o-projection of [`Attention::decode_fused`]: `[B, Nq·Dh]` → `[B, H]`.
    pub(crate) fn decode_o_proj(&self, o: &Tensor) -> Result<Tensor> {
        profile::labelled("attn.o_proj", || self.o_proj.forward(o))
    }

    /// The fused prep (norms, RoPE, KV append) and attention on the q/k/v product `qkv` of
    /// the sequences `cache` holds, at `pos`: the gated attention output `[B, Nq·Dh]`.
    pub(crate) fn decode_attend_fused(
        &self,
        qkv: &Tensor,
        cache: &mut KvCache,
        pos: &Tensor,
    ) -> Result<Tensor> {
        let b = qkv.dim(0)?;
        let (nq, nkv, dh) = (self.heads, self.kv_heads, self.head_dim);
        let (keys, values) = cache.buffers_for_next((b, nkv, dh), qkv)?;
        let inv_freq = self
            .rope_inv_freq
            .as_ref()
            .context("fused attention decode needs the device plan")?;
        let (q, gate) = attn_prep::attn_prep(
            qkv,
            &self.q_norm.weight,
            &self.k_norm.weight,
            self.q_norm.eps,
            inv_freq,
            pos,
            &keys,
            &values,
        )?;
        cache.advance(1);
        let o = attn_decode::attn_decode(&q, &gate, &keys, &values, pos)?;
        Ok(o.reshape((b, nq * dh))?)
    }

    /// The fused prep and attention of a batched step: row `r` of `qkv` belongs to the
    /// sequence `caches[r]` holds, at `positions[r]` (`[1]` u32 on the device, that cache's
    /// length). Where the device has the slot kernel (`attn_prep_slots`: the CPU twin, CUDA)
    /// the prep runs once for all rows, each writing its own KV buffers; `attn_decode` runs
    /// per sequence (each its own length). Elsewhere (Metal) [`Attention::decode_attend_fused`]
    /// runs per row. Either way each row is its single-sequence step's, bit for bit. Returns
    /// `[B, Nq·Dh]`.
    pub(crate) fn decode_attend_fused_rows(
        &self,
        qkv: &Tensor,
        caches: &mut [&mut KvCache],
        positions: &[Tensor],
    ) -> Result<Tensor> {
        let rows = caches.len();
        // Metal has no slot kernels: candle's Metal encoder declares residency and hazards
        // only for the buffers bound as arguments, and a buffer named only in a table of
        // addresses would be neither resident nor ordered. One launch per sequence there.
        if !gdn_ops::slot_tables::supports_device(qkv.device()) {
            let mut outs = Vec::with_capacity(rows);
            for (row, (cache, pos)) in caches.iter_mut().zip(positions).enumerate() {
                outs.push(self.decode_attend_fused(&qkv.narrow(0, row, 1)?, cache, pos)?);
            }
            return cat(&outs, 0);
        }
        let (nq, nkv, dh) = (self.heads, self.kv_heads, self.head_dim);
        let mut keys = Vec::with_capacity(rows);
        let mut values = Vec::with_capacity(rows);
        for cache in caches.iter_mut() {
            let (k, v) = cache.buffers_for_next((1, nkv, dh), qkv)?;
            keys.push(k);
            values.push(v);
        }
        let inv_freq = self
            .rope_inv_freq
            .as_ref()
            .context("fused attention decode needs the device plan")?;
        let (q, gate) = attn_prep_slots::attn_prep_slots(
            qkv,
            &self.q_norm.weight,
            &self.k_norm.weight,
            self.q_norm.eps,
            inv_freq,
            positions,
            &keys,
            &values,
        )?;
        for cache in caches.iter_mut() {
            cache.advance(1);
        }
        // Each sequence over its own length and buffers, in one launch (two where a context
        // is split): `attn_decode_slots` runs the body each sequence's own launch would.
        let o = attn_decode_slots::attn_decode_slots(&q, &gate, &keys, &values, positions)?;
        Ok(o.reshape((rows, nq * dh))?)
    }
}
