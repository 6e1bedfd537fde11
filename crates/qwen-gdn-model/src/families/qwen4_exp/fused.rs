//! The `qwen4_exp` decode step's parts on the Qwen3-Next fused kernels (one token per
//! sequence): the GDN mixer (`gdn_conv_prep`, `gated_delta_update_norm` with the layer's own
//! output gate) and the MoE block (router, `moe_route`, the gathered gate/up SwiGLU and down
//! products, and their weighted sum by `moe_combine`), and the QSA mixer with its indexer's
//! selection on the device (`qsa_indexer/device.rs`: no read-back, where the composed step
//! reads the projection back to select on the host). The hyper-connections' norm, injection
//! and mixing run on the `hyper_connection` kernels (`HyperConnection::{normed, mix_normed,
//! inject_normed}`, called by `Qwen4ExpLayer::forward` with `fused_hc`). What stays composed in the
//! step, and why: the PLE gather and conv (no kernels for them yet; one PLE layer in the
//! release), and the QSA attention past the budget, under the selection's mask
//! (`attn_decode` takes no block list; inside the budget it runs on the fused kernels).
//! The composed layer is the reference it is tested against (tests/qwen4_exp.rs).

use super::indexed_attention::IndexedAttention;
use super::state;
use super::step_inputs::StepInputs;
use crate::cache::{GdnCache, KvCache};
use crate::layers::gdn::GatedDeltaNet;
use crate::layers::moe::SparseMoe;
use anyhow::{anyhow, Result};
use candle_core::Tensor;
use gdn_ops::ops::moe_combine::moe_weighted_sum;

/// The GDN mixer on one token: `x` `[1, H]` (the hyper-connection's mix) → `[1, H]`.
pub fn gdn_mixer(m: &GatedDeltaNet, x: &Tensor, cache: &mut GdnCache) -> Result<Tensor> {
    m.decode_fused(x, cache)
}

/// The MoE block on one token: `x` `[1, H]` → the weighted sum of its slots `[1, H]` (the
/// shared expert is one of the slots), without a residual: the hyper-connection injects it
/// into the streams.
pub fn moe_block(moe: &SparseMoe, x: &Tensor) -> Result<Tensor> {
    let (down, weights) = moe_slots(moe, x)?;
    moe_weighted_sum(&down, &weights)
}

/// The MoE block on one token before its weighted sum: every slot's down product `[1, K, H]`
/// and the f32 routing weights `[1, K]`, which the fused hyper-connections sum inside their
/// injection (`HyperConnection::inject_slots_normed`).
pub fn moe_slots(moe: &SparseMoe, x: &Tensor) -> Result<(Tensor, Tensor)> {
    moe.decode_fused(x)
}

/// The QSA mixer on one token at position `offset`: `x` `[1, H]` → `[1, H]`. The indexer
/// selects on the device. While every key is visible (the context fits the budget) the
/// attention runs on the fused kernels (`attn_prep`, `attn_decode`) where they cover the
/// layer; past the budget it runs composed under the selection's mask, since `attn_decode`
/// takes no block list yet (named once on stderr on a GPU).
///
/// The position-dependent inputs (the token's position, the indexer's rows and rotation)
/// come from `step`'s device tensors, so that inside the budget a CUDA graph replays it.
pub fn qsa_mixer(
    q: &IndexedAttention,
    x: &Tensor,
    cache: &mut KvCache,
    offset: usize,
    step: &StepInputs,
) -> Result<Tensor> {
    let keys =
        state::indexer_mut(cache).ok_or_else(|| anyhow!("cache lacks the QSA indexer state"))?;
    let inputs = step
        .indexer
        .as_ref()
        .ok_or_else(|| anyhow!("step inputs without the QSA indexer's"))?;
    let mask = q.indexer.select_on_device(x, keys, offset, inputs)?;
    match mask {
        None if q.attention.fused_decode_supported(x.dtype()) => {
            q.attention.decode_fused(x, cache, &step.pos)
        }
        mask => {
            if mask.is_some() && !x.device().is_cpu() {
                static ONCE: std::sync::Once = std::sync::Once::new();
                ONCE.call_once(|| {
                    eprintln!(
                        "note: QSA attention past the indexer's budget runs composed under \
                         the selection's mask (no block-list attention kernel yet)"
                    )
                });
            }
            Ok(q.attention
                .forward_masked(&x.unsqueeze(0)?, cache, offset, mask.as_ref())?
                .squeeze(0)?)
        }
    }
}

/// The tensor a cache field holds after a composed step that replaced `old` by `new`, for a
/// step that keeps its cache tensors (`StepInputs::in_place`): `old` with `new` written into
/// it where both exist alike (one copy), else `new` (the first step makes the tensor).
pub fn kept_in_place(old: Option<Tensor>, new: Option<Tensor>) -> Result<Option<Tensor>> {
    match (old, new) {
        // Advanced in place already (the GDN state).
        (Some(old), Some(new)) if old.id() == new.id() => Ok(Some(old)),
        (Some(old), Some(new))
            if old.dims() == new.dims()
                && old.dtype() == new.dtype()
                && old.device().same_device(new.device())
                && old.is_contiguous() =>
        {
            crate::candle_ops::write_at(&old, &new, 0, 0)?;
            Ok(Some(old))
        }
        (_, new) => Ok(new),
    }
}
