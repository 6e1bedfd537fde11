//! Speculative decoding's verify pass: the T = k + 1 tokens of one sequence (the step's
//! token and its drafts) through the model and the output head, every row's logits at once.
//! On the device plan with fused decode on it runs the fused kernels
//! (`families/hybrid/verify.rs`: products over the T rows, the states token by token, no
//! host read-back before the logits); otherwise, or with `RunOptions::fused_verify` off, the
//! composed prefill path (the reference).

use super::Model;
use crate::cache::Cache;
use crate::families::Decoder;
use crate::tap::Tap;
use crate::weights::row_exact;
use crate::BatchProducts;
use anyhow::{ensure, Result};
use candle_core::Tensor;

impl Model {
    /// Verify passes on the fused kernels (`on`, where the fused decode step runs) or on the
    /// composed prefill path, the reference.
    pub fn set_fused_verify(&mut self, on: bool) {
        self.fused_verify = on;
    }

    /// Whether [`Model::verify`] runs the fused kernels: asked for, and the fused decode
    /// step of a hybrid model on.
    pub fn fused_verify(&self) -> bool {
        self.fused_verify && matches!(&self.decoder, Decoder::Hybrid(d) if d.fused_decode())
    }

    /// Runs `tokens` (one sequence) after what `cache` holds, updating it in place (inside a
    /// verify window, each GDN layer records its state after every token). Returns the f32
    /// logits of every position `[S, vocab]` and the normed hidden states `[1, S, H]` they
    /// came from (the MTP head's input): what [`Model::forward_normed`] and
    /// [`Model::head_logits`] give, on the fused kernels when [`Model::fused_verify`].
    pub fn verify(&self, tokens: &[u32], cache: &mut Cache) -> Result<(Tensor, Tensor)> {
        self.verify_tapped(tokens, cache, None)
    }

    /// [`Model::verify`] always eager, never a CUDA graph's replay (a tap is watching it):
    /// `bench --profile-verify` times its kernels one by one through it.
    pub fn verify_eager(&self, tokens: &[u32], cache: &mut Cache) -> Result<(Tensor, Tensor)> {
        self.verify_tapped(tokens, cache, Some(&mut crate::tap::NoTap))
    }

    /// [`Model::verify`] watched by `tap` (the fused pass's layers; the composed one runs
    /// unwatched). Without a tap, on CUDA, the fused pass replays a captured graph
    /// (`families/hybrid/verify_graph.rs`).
    pub(super) fn verify_tapped(
        &self,
        tokens: &[u32],
        cache: &mut Cache,
        tap: Option<&mut dyn Tap>,
    ) -> Result<(Tensor, Tensor)> {
        let Decoder::Hybrid(d) = &self.decoder else {
            return self.verify_composed(tokens, cache);
        };
        if !self.fused_verify() {
            return self.verify_composed(tokens, cache);
        }
        ensure!(!tokens.is_empty(), "a verify pass needs at least one token");
        self.check_cache(cache)?;
        self.check_token_ids(tokens)?;
        self.on_host_workers(|| {
            // The rows' products as the batched step runs them: each row alone (bit for bit
            // the decode step's) or one product over the rows (the GPU's default).
            let _rows = row_exact::scope(self.batch_products == BatchProducts::EachRowAlone);
            let ends = self.ends()?;
            let (logits, normed) = d.verify_pass(&ends, tokens, cache, tap)?;
            crate::device_memory::sample(&self.device);
            Ok((logits, normed.unsqueeze(0)?))
        })
    }

    /// The composed verify pass: the prefill path, then the head over every row.
    fn verify_composed(&self, tokens: &[u32], cache: &mut Cache) -> Result<(Tensor, Tensor)> {
        let normed = self.forward_normed(tokens, cache)?;
        Ok((self.head_logits(&normed)?, normed))
    }
}
