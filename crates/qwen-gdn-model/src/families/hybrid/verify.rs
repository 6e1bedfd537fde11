//! Speculative decoding's verify pass on the fused kernels of the device plan (issue 28): the
//! T = k + 1 tokens of ONE sequence (the step's token and its k drafts) in one pass, shaped
//! like the batched decode step (`batch_decode.rs`) but with the rows in sequence:
//!
//! - every product (the mixers' projections, the MoE's router and gathered experts, the
//!   head) and every norm and residual add runs once over the T rows, each weight read once;
//! - the sequential parts stay sequential on the one state: the GDN conv front over the T
//!   tokens in one launch and the recurrence token by token, each token's state recorded for
//!   the verify window (`layers/gdn/verify.rs`); attention's T keys appended in one launch
//!   and each query row attending to the positions up to its own (`layers/attention/verify.rs`).
//!
//! Nothing is read back to the host: the positions are uploaded once for the pass, and the
//! logits are the pass's only read-back, the caller's. The composed verify (the prefill path
//! inside a window: `Model::forward_normed`) is the reference, chosen by
//! `RunOptions::fused_verify` (`QWEN_GDN_VERIFY=composed`); `tests/fused_verify.rs` holds the
//! two against T fused decode steps.

use super::{HybridDecoder, Mixer};
use crate::cache::{Cache, LayerCache};
use crate::tap::{each_layer, Tap};
use anyhow::{bail, Result};
use candle_core::Tensor;
use gdn_ops::ops::add_rms_norm::add_rms_norm;

impl HybridDecoder {
    /// The embedded tokens `[T, H]` of one sequence at the cache's offset (the caller
    /// advances it by T) → the final-normed hidden states `[T, H]`, the head's input.
    pub fn verify_fused(
        &self,
        embedded: &Tensor,
        cache: &mut Cache,
        tap: &mut dyn Tap,
    ) -> Result<Tensor> {
        let rows = embedded.dim(0)?;
        let device = embedded.device();
        let offset = cache.offset;
        // The pass's only upload: the rows' positions, for attention's kernels, one `[1]`
        // view of it a row (as the batched step's, `batch_decode.rs`).
        let values: Vec<u32> = (0..rows).map(|t| (offset + t) as u32).collect();
        gdn_ops::launches::upload(1);
        let all = Tensor::new(values.as_slice(), device)?;
        let positions = (0..rows)
            .map(|t| Ok(all.narrow(0, t, 1)?))
            .collect::<Result<Vec<_>>>()?;
        let first_norm = &self.layers[0].input_norm;
        let first = add_rms_norm(embedded, None, &first_norm.weight, first_norm.eps)?;
        let (_, x) = each_layer(
            &self.layers,
            &mut cache.layers,
            tap,
            first,
            |i, layer, layer_cache, (h, x), _| {
                let covered = self.coverage[i];
                let mixed = match (&layer.mixer, layer_cache) {
                    (Mixer::Gdn(m), LayerCache::Gdn(c)) if covered.mixer => {
                        m.verify_fused(&x, c)?
                    }
                    (Mixer::Attention(m), LayerCache::Attention(c)) if covered.mixer => {
                        m.verify_fused(&x, c, &positions)?
                    }
                    // Outside the kernels' coverage: the composed mixer over the T tokens
                    // (which records a window's GDN states itself).
                    (Mixer::Gdn(m), LayerCache::Gdn(c)) => {
                        m.forward(&x.unsqueeze(0)?, c)?.squeeze(0)?
                    }
                    (Mixer::Attention(m), LayerCache::Attention(c)) => {
                        m.forward(&x.unsqueeze(0)?, c, offset)?.squeeze(0)?
                    }
                    _ => bail!("cache does not belong to this model"),
                };
                self.rows_after_mixer(i, layer, &h, &mixed)
            },
        )?;
        Ok(x)
    }
}
