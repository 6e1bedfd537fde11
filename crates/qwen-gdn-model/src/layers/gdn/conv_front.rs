//! The GDN conv front of a chunk (conv with its state, SiLU, q/k L2 norms, decay and β) in
//! one `gdn_conv_prep` launch, and the choice between it and the composed candle ops of
//! [`GatedDeltaNet::forward`] (about 30 launches per layer call, the reference).
//!
//! The device plan picks it at load: on CUDA and Metal wherever the kernels cover the
//! layer's dims ([`gdn_conv_prep::supports`]), on the CPU never (the composed ops are the CPU
//! reference). `RunOptions::conv_front` (`QWEN_GDN_CONV_FRONT=composed|fused`) overrides that;
//! `fused` on the CPU runs the kernels' CPU twin, which is how the model tests exercise this
//! path without a GPU.

use super::GatedDeltaNet;
use crate::cache::GdnCache;
use crate::candle_ops::zeros;
use anyhow::Result;
use candle_core::{DType, Device, Tensor};
use gdn_ops::ops::gdn_conv_prep;

/// How [`GatedDeltaNet::forward`] computes a chunk's conv front.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConvFront {
    /// Composed candle ops: the reference.
    Composed,
    /// One `gdn_conv_prep` launch (the CPU twin on the CPU).
    Fused,
}

impl ConvFront {
    /// The default on `device`: fused on the GPUs, composed on the CPU.
    pub fn default_for(device: &Device) -> Self {
        match device {
            Device::Cpu => Self::Composed,
            _ => Self::Fused,
        }
    }

    /// `wanted` (the device's default when `None`), fused only where the kernels cover `dims`
    /// in `dtype`.
    pub(crate) fn for_layer(
        wanted: Option<Self>,
        device: &Device,
        dims: &gdn_conv_prep::ConvPrepDims,
        dtype: DType,
    ) -> Self {
        match wanted.unwrap_or_else(|| Self::default_for(device)) {
            Self::Fused if gdn_conv_prep::supports(dims, dtype) => Self::Fused,
            _ => Self::Composed,
        }
    }
}

/// q, k, v, β and g of a chunk: what the recurrence takes.
pub(super) type Prepared = (Tensor, Tensor, Tensor, Tensor, Tensor);

impl GatedDeltaNet {
    /// The conv front of a chunk in one launch: `qkv` `[B, S, C]`, `b` and `a` `[B, S, Hv]`
    /// (slices of the merged projection, read in place). The conv state after the chunk
    /// replaces the cache's (the kernel advances it in place for one token, and writes a new
    /// one for more: its token blocks all read the old state).
    pub(super) fn conv_front_fused(
        &self,
        qkv: &Tensor,
        b: &Tensor,
        a: &Tensor,
        cache: &mut GdnCache,
    ) -> Result<Prepared> {
        let (batch, _, channels) = qkv.dims3()?;
        let conv_state = self.conv_state_for(cache, batch, channels, qkv)?;
        let out = self.conv_prep(qkv, b, a, &conv_state)?;
        cache.conv = Some(out.conv_state);
        Ok((out.q, out.k, out.v, out.beta, out.g))
    }

    /// The conv state `[B, K−1, C]` the kernel reads (and, for one token, advances in place):
    /// the cache's, or zeros on the first call, kept in the cache. `like` gives the dtype and
    /// device.
    pub(super) fn conv_state_for(
        &self,
        cache: &mut GdnCache,
        batch: usize,
        channels: usize,
        like: &Tensor,
    ) -> Result<Tensor> {
        if let Some(c) = &cache.conv {
            return Ok(c.clone());
        }
        let empty = zeros(
            (batch, self.kernel - 1, channels),
            like.dtype(),
            like.device(),
        )?;
        cache.conv = Some(empty.clone());
        Ok(empty)
    }
}
