//! What speculative decoding asks of the model (`crate::speculative`): its multi-token-
//! prediction head, the normed hidden states a forward pass ends with, and the output head
//! over them.

use super::Model;
use crate::cache::{Cache, KvCache};
use crate::families::hybrid::MtpHead;
use crate::families::qwen4_exp::mtp::Qwen4ExpMtpHead;
use crate::families::{Decoder, FamilyMtpHead};
use crate::tap::NoTap;
use crate::tensor::cast;
use crate::weights::Checkpoint;
use crate::Plan;
use anyhow::{bail, Context, Result};
use candle_core::{DType, Tensor};
use gdn_ops::profile::labelled;
use std::path::Path;

/// How the head's float matrices are kept (`--mtp-from` an unquantized checkpoint for a
/// quantized main model).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum MtpPrecision {
    /// As the checkpoint stores them (bf16 for the original checkpoints).
    AsStored,
    /// Quantized on load to the main checkpoint's bits and group size (when it is quantized),
    /// unless the head is a drafter quantized by its maker (then as stored).
    MainBits,
}

impl Model {
    /// Loads the MTP head of the checkpoint in `dir` (its `mtp.*` tensors): `false` when it
    /// has none. The hybrid families' head, or `qwen4_exp`'s own (fc's over the streams, its
    /// own mixer). Shapes that disagree with the config are errors.
    pub fn load_mtp(&mut self, dir: &Path) -> Result<bool> {
        self.load_mtp_with(dir, MtpPrecision::AsStored)
    }

    /// [`Model::load_mtp`], with the head's float matrices quantized to the main checkpoint's
    /// bits when `precision` says so and the main checkpoint is quantized.
    pub fn load_mtp_with(&mut self, dir: &Path, precision: MtpPrecision) -> Result<bool> {
        let Some(mut ckpt) = Checkpoint::open_mtp(dir, &self.config)? else {
            return Ok(false);
        };
        if precision == MtpPrecision::MainBits && !ckpt.declares_its_own_quantization() {
            ckpt.quantize_floats_to(self.config.quantization);
        }
        let head = match self.decoder {
            Decoder::Hybrid(_) => {
                MtpHead::load(&ckpt, &self.config).map(|h| FamilyMtpHead::Hybrid(Box::new(h)))
            }
            Decoder::Qwen4Exp(_) => Qwen4ExpMtpHead::load(&ckpt, &self.config)
                .map(|h| FamilyMtpHead::Qwen4Exp(Box::new(h))),
        }
        .with_context(|| format!("{}: the MTP head", dir.display()))?;
        self.mtp = Some(match self.plan {
            Plan::Reference => head,
            Plan::Device => head.into_device(&self.device, self.dtype)?,
        });
        // The main checkpoint's load warned that it skipped them.
        for warning in &mut self.warnings {
            let Some((what, kinds)) = warning.split_once(": ignoring tensors ") else {
                continue;
            };
            let (intro, list) = kinds.split_once(": ").unwrap_or(("", kinds));
            let rest: Vec<&str> = list
                .split(", ")
                .filter(|k| !k.ends_with("(mtp.*)"))
                .collect();
            *warning = match rest.is_empty() {
                true => String::new(),
                false => format!("{what}: ignoring tensors {intro}: {}", rest.join(", ")),
            };
        }
        self.warnings.retain(|w| !w.is_empty());
        Ok(true)
    }

    /// The MTP head, once loaded.
    pub fn mtp_head(&self) -> Option<&FamilyMtpHead> {
        self.mtp.as_ref()
    }

    /// Runs `tokens` after what `cache` holds (updating it in place) and returns the last
    /// hidden states the MTP head reads: after the final norm, `[1, S, H]` (the lm_head's
    /// input), or for `qwen4_exp` the streams before the final mixer, `[1, S, streams·H]`
    /// ([`Model::head_logits`] takes either).
    pub fn forward_normed(&self, tokens: &[u32], cache: &mut Cache) -> Result<Tensor> {
        let h = self.run_layers(tokens, cache, &mut NoTap)?;
        self.on_host_workers(|| self.decoder.drafter_hidden(&h))
    }

    /// The output head over [`Model::forward_normed`]'s hidden states (for `qwen4_exp`
    /// after the final mixer): f32 logits `[S, vocab]`, the same numbers [`Model::forward`]
    /// gives for those positions.
    pub fn head_logits(&self, normed: &Tensor) -> Result<Tensor> {
        self.on_host_workers(|| {
            let input = self.decoder.head_input(normed)?;
            let logits = labelled("lm_head", || self.head()?.forward(&input))?;
            cast(&logits.squeeze(0)?, DType::F32)
        })
    }

    /// The drafts' logits `[S, vocab]` from [`Model::mtp_forward`]'s output: the main
    /// model's lm_head, after the head's own mixer for `qwen4_exp`.
    pub fn mtp_logits(&self, out: &Tensor) -> Result<Tensor> {
        let Some(head) = &self.mtp else {
            bail!("the model has no MTP head loaded");
        };
        self.on_host_workers(|| {
            let input = head.logits_input(out)?;
            let logits = labelled("lm_head", || self.head()?.forward(&input))?;
            cast(&logits.squeeze(0)?, DType::F32)
        })
    }

    /// The MTP head on the pairs (`hidden[i]`, `next[i]`): `hidden` what
    /// [`Model::forward_normed`] gives (or the head's own output, for a chained draft),
    /// `next` the S tokens that follow them. Returns the head's output, the hidden state a
    /// chained draft pairs with: normed `[1, S, H]`, or `qwen4_exp`'s streams
    /// ([`Model::mtp_logits`] turns it into the drafts' logits).
    pub fn mtp_forward(
        &self,
        hidden: &Tensor,
        next: &[u32],
        cache: &mut KvCache,
    ) -> Result<Tensor> {
        let Some(head) = &self.mtp else {
            bail!("the model has no MTP head loaded");
        };
        self.check_token_ids(next)?;
        self.on_host_workers(|| {
            let embedded = self.embed(next)?;
            labelled("mtp", || head.forward(&embedded, hidden, next, cache))
        })
    }
}
