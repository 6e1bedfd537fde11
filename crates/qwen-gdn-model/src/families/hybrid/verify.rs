//! Speculative decoding's verify pass on the fused kernels of the device plan (issue 28): the
//! T = k + 1 tokens of ONE sequence (the step's token and its k drafts) in one pass, shaped
//! like the batched decode step (`batch_decode.rs`) but with the rows in sequence:
//!
//! - every product (the mixers' projections, the MoE's router and gathered experts, the
//!   head) and every norm and residual add runs once over the T rows, each weight read once;
//! - the sequential parts stay sequential on the one state: the GDN conv front over the T
//!   tokens in one launch and the recurrence over the T tokens in one launch that writes each
//!   token's state where the verify window keeps it (`layers/gdn/verify.rs`;
//!   `QWEN_GDN_VERIFY_WINDOW=per-token`: a launch and a state copy a token, the reference);
//!   attention's T keys appended in one launch and each query row attending to the positions
//!   up to its own (`layers/attention/verify.rs`).
//!
//! Nothing is read back to the host: the ids and positions are uploaded once for the pass
//! (or, replaying a CUDA graph, written into the graph's buffers: `verify_graph.rs`), and
//! the logits are the pass's only read-back, the caller's. The composed verify (the prefill path
//! inside a window: `Model::forward_normed`) is the reference, chosen by
//! `RunOptions::fused_verify` (`QWEN_GDN_VERIFY=composed`); `tests/fused_verify.rs` holds the
//! two against T fused decode steps.

use super::{HybridDecoder, Mixer};
use crate::cache::{Cache, LayerCache};
use crate::candle_ops::cat;
use crate::families::Ends;
use crate::tap::{each_layer, NoTap, Tap};
use crate::tensor::cast;
use anyhow::{bail, Result};
use candle_core::{DType, Tensor};
use gdn_ops::ops::add_rms_norm::add_rms_norm;
use gdn_ops::ops::affine::dense_rows;
use gdn_ops::profile::{self, labelled};

pub use super::verify_replays::graph_replays;

impl HybridDecoder {
    /// The T tokens of one sequence at the cache's offset through the embedding, the
    /// layers and the head, advancing the cache by T → the f32 logits `[T, vocab]` and the
    /// final-normed hidden states `[T, H]`. Without a tap, on CUDA, a captured graph of the
    /// pass is replayed (`verify_graph.rs`); otherwise it runs eagerly.
    pub fn verify_pass(
        &self,
        ends: &Ends,
        tokens: &[u32],
        cache: &mut Cache,
        tap: Option<&mut dyn Tap>,
    ) -> Result<(Tensor, Tensor)> {
        let Some(tap) = tap else {
            #[cfg(feature = "cuda")]
            if let Some(out) = super::verify_graph::pass(self, ends, tokens, cache)? {
                return Ok(out);
            }
            return self.verify_pass(ends, tokens, cache, Some(&mut NoTap));
        };
        // The pass's only uploads: the ids and the rows' positions.
        let values: Vec<u32> = (0..tokens.len())
            .map(|t| (cache.offset + t) as u32)
            .collect();
        gdn_ops::launches::upload(1);
        let positions = Tensor::new(values.as_slice(), ends.device)?;
        let ids = Tensor::new(tokens, ends.device)?;
        self.verify_pass_on(ends, &ids, &positions, cache, tap)
    }

    /// [`HybridDecoder::verify_pass`] for the ids and positions held in `[T]` u32 device
    /// tensors (what a captured graph reads on replay).
    pub(crate) fn verify_pass_on(
        &self,
        ends: &Ends,
        ids: &Tensor,
        positions: &Tensor,
        cache: &mut Cache,
        tap: &mut dyn Tap,
    ) -> Result<(Tensor, Tensor)> {
        // Past the rows the quantized products run row by row (8 under `auto`: one pass over
        // the weights, each row's bits as alone) they take another path (a dequantized copy,
        // a GEMM): longer windows run as passes of at most that many rows, one after the
        // other on the same window.
        let (mut logits, mut normed) = (vec![], vec![]);
        let rows = ids.dim(0)?;
        let per_pass = dense_rows().row_products_max();
        for start in (0..rows).step_by(per_pass) {
            let n = per_pass.min(rows - start);
            let part = ids.narrow(0, start, n)?;
            let embedded = labelled("embed", || ends.embed.forward_ids(&part, ends.dtype))?;
            let x = self.verify_fused(&embedded, &positions.narrow(0, start, n)?, cache, tap)?;
            cache.offset += n;
            logits.push(labelled("lm_head", || ends.head.forward(&x))?);
            normed.push(x);
        }
        let (logits, normed) = match logits.len() {
            1 => (logits.remove(0), normed.remove(0)),
            _ => (cat(&logits, 0)?, cat(&normed, 0)?),
        };
        Ok((cast(&logits, DType::F32)?, normed))
    }

    /// The embedded tokens `[T, H]` of one sequence at the cache's offset (the caller
    /// advances it by T), `positions` their `[T]` u32 device positions → the final-normed
    /// hidden states `[T, H]`, the head's input.
    pub fn verify_fused(
        &self,
        embedded: &Tensor,
        positions: &Tensor,
        cache: &mut Cache,
        tap: &mut dyn Tap,
    ) -> Result<Tensor> {
        let rows = embedded.dim(0)?;
        let offset = cache.offset;
        // One `[1]` view of the positions a row (as the batched step's, `batch_decode.rs`).
        let positions = (0..rows)
            .map(|t| Ok(positions.narrow(0, t, 1)?))
            .collect::<Result<Vec<_>>>()?;
        let first_norm = &self.layers[0].input_norm;
        let first = add_rms_norm(embedded, None, &first_norm.weight, first_norm.eps)?;
        let (_, x) = each_layer(
            &self.layers,
            &mut cache.layers,
            tap,
            first,
            |i, layer, layer_cache, (h, x), _| {
                // The profile's rows of this layer (`bench --profile-verify`).
                let _profiled = profile::layer(i, layer.mixer.profile_kind());
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
                // Gathered: a verify row's MoE as its decode step runs it.
                self.rows_after_mixer(i, layer, &h, &mixed, true)
            },
        )?;
        Ok(x)
    }
}
