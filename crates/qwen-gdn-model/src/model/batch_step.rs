//! One decode step of several sequences at once (issue 29): each sequence at its own
//! position, with its own [`Cache`]; the products of every layer and of the output head run
//! once for all the sequences' rows, so each weight is read once per step instead of once per
//! sequence. The mixers run per sequence on their own state (GDN recurrence and conv window;
//! attention over that sequence's keys, whatever its length).
//!
//! With [`BatchProducts::EachRowAlone`] (the reference plan's default) every row is computed
//! as it is alone ([`row_exact`]): a sequence's logits are the same bits in any batch as from
//! its composed single-token step. With the decoder's fused decode on (the device plan), the
//! step runs the fused kernels (`families/hybrid/batch_decode.rs`).

use super::Model;
use crate::cache::Cache;
use crate::families::hybrid::HybridDecoder;
use crate::families::Decoder;
use crate::tap::{LaunchCounter, NoTap, Tap};
use crate::tensor::cast;
use crate::weights::row_exact;
use crate::{BatchMoe, BatchProducts};
use anyhow::{ensure, Result};
use candle_core::{DType, Tensor};

/// How a batched step runs its layers: the device plan's fused kernels (the decoder's fused
/// decode on), or the composed ops (the reference plan, fused decode off, other families).
enum BatchDecoding<'a> {
    Fused(&'a HybridDecoder),
    Composed,
}

impl Model {
    fn batch_decoding(&self) -> BatchDecoding<'_> {
        match &self.decoder {
            Decoder::Hybrid(d) if d.fused_decode() => BatchDecoding::Fused(d),
            _ => BatchDecoding::Composed,
        }
    }

    /// How batched steps run their products from now on.
    pub fn set_batch_products(&mut self, mode: BatchProducts) {
        self.batch_products = mode;
    }

    pub fn batch_products(&self) -> BatchProducts {
        self.batch_products
    }

    /// How fused batched steps run their MoE blocks' expert products from now on.
    pub fn set_batch_moe(&mut self, mode: BatchMoe) {
        self.batch_moe = mode;
    }

    pub fn batch_moe(&self) -> BatchMoe {
        self.batch_moe
    }

    /// Runs `tokens[i]` after what `caches[i]` holds, for every `i`, in one step, updating
    /// each cache in place. Returns f32 logits `[B, vocab_size]`, row `i` for sequence `i`.
    pub fn decode_batch(&self, tokens: &[u32], caches: &mut [&mut Cache]) -> Result<Tensor> {
        Ok(self.decode_batch_normed(tokens, caches)?.0)
    }

    /// [`Model::decode_batch`], also returning the normed hidden states `[1, B, H]` the logits
    /// came from (what [`Model::forward_normed`] gives for one sequence): the MTP head's input
    /// for a sequence that decodes speculatively when it runs alone.
    pub fn decode_batch_normed(
        &self,
        tokens: &[u32],
        caches: &mut [&mut Cache],
    ) -> Result<(Tensor, Tensor)> {
        self.decode_batch_tapped(tokens, caches, None)
    }

    /// [`Model::decode_batch`], also returning the kernel launches of each layer (the
    /// `batch_budget` example's count).
    pub fn decode_batch_with_launches(
        &self,
        tokens: &[u32],
        caches: &mut [&mut Cache],
    ) -> Result<(Tensor, Vec<usize>)> {
        let (logits, counter) = self.decode_batch_counted(tokens, caches)?;
        Ok((logits, counter.per_layer))
    }

    /// [`Model::decode_batch`], also returning each layer's kernel launches and host uploads.
    pub fn decode_batch_counted(
        &self,
        tokens: &[u32],
        caches: &mut [&mut Cache],
    ) -> Result<(Tensor, LaunchCounter)> {
        let mut counter = LaunchCounter::default();
        let (logits, _) = self.decode_batch_tapped(tokens, caches, Some(&mut counter))?;
        Ok((logits, counter))
    }

    fn decode_batch_tapped(
        &self,
        tokens: &[u32],
        caches: &mut [&mut Cache],
        tap: Option<&mut dyn Tap>,
    ) -> Result<(Tensor, Tensor)> {
        ensure!(
            !tokens.is_empty(),
            "a batched step needs at least one sequence"
        );
        ensure!(
            tokens.len() == caches.len(),
            "{} tokens for {} sequences",
            tokens.len(),
            caches.len()
        );
        self.check_token_ids(tokens)?;
        for cache in caches.iter() {
            self.check_cache(cache)?;
        }
        self.on_host_workers(|| {
            let _rows = row_exact::scope(self.batch_products == BatchProducts::EachRowAlone);
            // Without a tap, on CUDA: the step replayed from its batch size's graph.
            #[cfg(feature = "cuda")]
            if let (None, BatchDecoding::Fused(d)) = (&tap, self.batch_decoding()) {
                use crate::families::hybrid::batch_graph;
                if batch_graph::applies(d, &self.device, self.batch_moe) {
                    let ends = self.ends()?;
                    let out = batch_graph::step(d, &ends, tokens, caches, self.batch_moe)?;
                    crate::device_memory::sample(&self.device);
                    return Ok(out);
                }
            }
            let mut no_tap = NoTap;
            let tap: &mut dyn Tap = match tap {
                Some(tap) => tap,
                None => &mut no_tap,
            };
            let h = self.embed(tokens)?;
            // `normed`: what the MTP head reads ([`Model::forward_normed`]).
            let normed = match self.batch_decoding() {
                BatchDecoding::Fused(d) => d
                    .decode_batch_fused(&h.squeeze(0)?, caches, self.batch_moe, tap)?
                    .unsqueeze(0)?,
                BatchDecoding::Composed => {
                    let h = self.decoder.forward_batch(h, tokens, caches, tap)?;
                    self.decoder.drafter_hidden(&h)?
                }
            };
            for cache in caches.iter_mut() {
                cache.offset += 1;
            }
            let logits = self.head()?.forward(&self.decoder.head_input(&normed)?)?;
            crate::device_memory::sample(&self.device);
            Ok((cast(&logits.squeeze(0)?, DType::F32)?, normed))
        })
    }
}
