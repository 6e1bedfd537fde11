//! One decode step of several sequences on the fused kernels of the device plan (issue 29):
//! each product (the mixers' in/out-projections, the MoE's router and experts, the head)
//! runs once over the B rows, and so do the norms and residual adds (`add_rms_norm`,
//! `moe_combine`). The GDN mixers' state kernels (conv front, recurrence with its norm) run
//! once over the B sequences, each on its own states through a table of their addresses
//! (`gdn_conv_prep_slots`, `gated_delta_update_norm_slots`; per sequence where the device has
//! no slot kernel); attention's prep (`attn_prep_slots`) and its `attn_decode_slots`
//! once over the B sequences' KV buffers (each its own length), the single-token kernels'
//! bodies that [`HybridDecoder::decode_step`] launches. A layer outside the
//! kernels' coverage, or a MoE whose gathered SwiGLU does not take B rows, runs its
//! composed ops, as the single-sequence step does.

use super::{DecoderLayer, FeedForward, HybridDecoder, Mixer};
use crate::cache::{Cache, LayerCache};
use crate::candle_ops::cat;
use crate::tap::{each_layer, Tap};
use crate::BatchMoe;
use anyhow::{bail, Context, Result};
use candle_core::Tensor;
use gdn_ops::ops::add_rms_norm::add_rms_norm;
use gdn_ops::profile;

impl HybridDecoder {
    /// The embedded tokens `[B, H]` (row `i` the next token of the sequence `caches[i]`
    /// holds, at that cache's offset; the caller advances the offsets) → the final-normed
    /// last hidden states `[B, H]`, the head's input.
    pub fn decode_batch_fused(
        &self,
        embedded: &Tensor,
        caches: &mut [&mut Cache],
        moe: BatchMoe,
        tap: &mut dyn Tap,
    ) -> Result<Tensor> {
        let device = embedded.device();
        let offsets: Vec<usize> = caches.iter().map(|c| c.offset).collect();
        // Held for the step: the positions buffer is this step's until its kernels are queued.
        let mut held = self
            .batch_positions
            .lock()
            .map_err(|_| anyhow::anyhow!("a batched step panicked while holding its positions"))?;
        let positions = step_positions(&mut held, &offsets, device)?;
        self.decode_batch_fused_at(embedded, caches, moe, &positions, tap)
    }

    /// [`Self::decode_batch_fused`] with each sequence's position already in `positions`
    /// (`[1]` u32 device views, written before the step): what a CUDA graph of the batched
    /// step records (`batch_graph.rs`), since it uploads nothing itself.
    pub(super) fn decode_batch_fused_at(
        &self,
        embedded: &Tensor,
        caches: &mut [&mut Cache],
        moe: BatchMoe,
        positions: &[Tensor],
        tap: &mut dyn Tap,
    ) -> Result<Tensor> {
        let offsets: Vec<usize> = caches.iter().map(|c| c.offset).collect();
        let mut per_layer = super::per_layer(self.layers.len(), caches)?;
        let first_norm = &self.layers[0].input_norm;
        let first = add_rms_norm(embedded, None, &first_norm.weight, first_norm.eps)?;
        let (_, x) = each_layer(
            &self.layers,
            &mut per_layer,
            tap,
            first,
            |i, layer, layer_caches, (h, x), _| {
                // The batch profile's rows of this layer (`bench --profile-batch`).
                let _profiled = profile::layer(i, layer.mixer.profile_kind());
                let covered = self.coverage[i];
                let mixed = if covered.mixer {
                    self.mix_rows_fused(&layer.mixer, &x, layer_caches, positions)?
                } else {
                    mix_rows_composed(&layer.mixer, &x, layer_caches, &offsets)?
                };
                self.rows_after_mixer(i, layer, &h, &mixed, moe.gathers())
            },
        )?;
        Ok(x)
    }

    /// The rest of layer `i` over the rows of a fused step after its mixer (`mixed`, the
    /// residual stream `h`): the post-norm's residual add, then the feed-forward on the fused
    /// kernels where they cover it for these rows (the gathered SwiGLU takes up to
    /// `GATHER_MAX_TOKENS` rows, no routing read back: past that, or unless `gathered`, the
    /// MoE composes: its expert-grouped products). Returns the stream and the next norm of it.
    pub(super) fn rows_after_mixer(
        &self,
        i: usize,
        layer: &DecoderLayer,
        h: &Tensor,
        mixed: &Tensor,
        gathered: bool,
    ) -> Result<(Tensor, Tensor)> {
        let post = &layer.post_norm;
        let (h, x) = add_rms_norm(h, Some(mixed), &post.weight, post.eps)?;
        let next_norm = match self.layers.get(i + 1) {
            Some(next) => &next.input_norm,
            None => self.final_norm()?,
        };
        let rows = x.dim(0)?;
        let fused = gathered
            && self.coverage[i].feed_forward
            && matches!(&layer.feed_forward,
                FeedForward::Moe(m) if m.fused_decode_supports_rows(rows, x.dtype()));
        self.feed_forward_step(layer, fused, (h, x), next_norm)
    }

    /// A covered mixer over the rows of `x` `[B, H]` (input-normed): the projections once
    /// for all rows, the state kernels per sequence.
    fn mix_rows_fused(
        &self,
        mixer: &Mixer,
        x: &Tensor,
        caches: &mut [&mut LayerCache],
        positions: &[Tensor],
    ) -> Result<Tensor> {
        match mixer {
            Mixer::Gdn(m) => {
                let parts = m.decode_in_proj(x)?;
                let mut gdn_caches = caches
                    .iter_mut()
                    .map(|cache| match cache {
                        LayerCache::Gdn(c) => Ok(c),
                        _ => bail!("cache does not belong to this model"),
                    })
                    .collect::<Result<Vec<_>>>()?;
                m.decode_out_proj(&m.decode_mix_fused_rows(&parts, &mut gdn_caches)?)
            }
            Mixer::Attention(m) => {
                let qkv = m.decode_qkv(x)?;
                let mut kv_caches = caches
                    .iter_mut()
                    .map(|cache| match cache {
                        LayerCache::Attention(c) => Ok(c),
                        _ => bail!("cache does not belong to this model"),
                    })
                    .collect::<Result<Vec<_>>>()?;
                let o = m.decode_attend_fused_rows(&qkv, &mut kv_caches, positions)?;
                m.decode_o_proj(&o)
            }
        }
    }
}

/// Each sequence's position as a `[1]` u32 view of one `[B]` buffer on the device, which is
/// kept from step to step (`buffer`) and rewritten in place: one upload and one copy a step,
/// and the same addresses every step, so that the slot kernels' tables (which hold them) are
/// uploaded once per batch composition (`gdn_ops::slot_tables`). A new buffer when B changes.
fn step_positions(
    buffer: &mut Option<Tensor>,
    offsets: &[usize],
    device: &candle_core::Device,
) -> Result<Vec<Tensor>> {
    let values: Vec<u32> = offsets.iter().map(|&o| o as u32).collect();
    gdn_ops::launches::upload(1);
    let fresh = Tensor::new(values.as_slice(), device)?;
    match buffer {
        Some(b) if b.dim(0)? == values.len() && b.device().same_device(device) => {
            gdn_ops::launches::candle_op(b.slice_set(&fresh, 0, 0))?;
        }
        _ => *buffer = Some(fresh),
    }
    let b = buffer
        .as_ref()
        .context("the positions buffer was just set")?;
    (0..values.len()).map(|i| Ok(b.narrow(0, i, 1)?)).collect()
}

/// A mixer outside the kernels' coverage, row by row through its composed ops (as the
/// single-sequence fused step runs it).
fn mix_rows_composed(
    mixer: &Mixer,
    x: &Tensor,
    caches: &mut [&mut LayerCache],
    offsets: &[usize],
) -> Result<Tensor> {
    let mut outs = Vec::with_capacity(caches.len());
    for (row, (cache, &offset)) in caches.iter_mut().zip(offsets).enumerate() {
        let x = x.narrow(0, row, 1)?.unsqueeze(1)?;
        let out = match (mixer, &mut **cache) {
            (Mixer::Gdn(m), LayerCache::Gdn(c)) => m.forward(&x, c)?,
            (Mixer::Attention(m), LayerCache::Attention(c)) => m.forward(&x, c, offset)?,
            _ => bail!("cache does not belong to this model"),
        };
        outs.push(out.squeeze(1)?);
    }
    cat(&outs, 0)
}
