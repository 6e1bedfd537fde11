//! The GDN mixer in a speculative verify pass on the fused kernels: the T = k + 1 tokens of
//! one sequence (the step's token and its drafts) after the decode step's kernels, with the
//! products over the T rows at once (each weight read once) and the state kept sequential:
//!
//! - the merged in-projection and the out-projection: one product each over T rows;
//! - the conv front: one `gdn_conv_prep` launch over the T tokens (every token's arithmetic
//!   is the decode step's, bit for bit: the op's contract);
//! - the recurrence with its gated norm: while a verify window records, one
//!   `gated_delta_update_norm_window` launch for the T tokens that also writes the state after
//!   each token but the last where the window keeps it (`GdnSteps::recurrence_in_one_launch`,
//!   bit for bit T one-token launches); with `QWEN_GDN_VERIFY_WINDOW=per-token`
//!   (`VerifyWindow::PerToken`, the reference) one launch per token with the state copied
//!   after each (`GdnSteps::recurrence`); one plain launch for all T tokens outside a window.
//!
//! So a GDN layer costs, in a window, its two products, the conv front, one recurrence launch
//! and, for a one-token pass, a copy of the conv rows before it (per token: a recurrence per
//! token, a state copy per token but the last and the outputs joined); T decode steps cost
//! four launches each. [`GatedDeltaNet::forward`] with a window open (the composed verify) is the
//! reference it is tested against (`tests/fused_verify.rs`).

use super::GatedDeltaNet;
use crate::cache::GdnCache;
use crate::tensor::own_copy;
use anyhow::Result;
use candle_core::Tensor;
use gdn_ops::launches::candle_op;
use gdn_ops::ops::gated_delta_norm;
use gdn_ops::ops::gated_delta_norm_window::gated_delta_update_norm_window;

/// How the fused verify pass runs the recurrence of a window of T > 1 tokens
/// (`QWEN_GDN_VERIFY_WINDOW`, `RunOptions::verify_window`): the same states and outputs, bit
/// for bit, either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VerifyWindow {
    /// One `gated_delta_update_norm_window` launch a layer, the states written in place.
    OneLaunch,
    /// A launch a token and a copy of the state after each: the reference.
    PerToken,
}

impl GatedDeltaNet {
    /// The T tokens of one sequence, `x` `[T, H]` (input-normed) → the mixer's output
    /// `[T, H]`, the conv and recurrent states advanced over the T tokens (and each token's
    /// recorded, when `cache` has a verify window open).
    pub(crate) fn verify_fused(&self, x: &Tensor, cache: &mut GdnCache) -> Result<Tensor> {
        let [qkv, z, beta_in, a] = self.decode_in_proj(x)?; // [T, ·] each, views of one product
        let tokens = qkv.dim(0)?;
        let (hv, dv) = (self.value_heads, self.value_dim);
        let channels = qkv.dim(1)?;
        // One sequence of T tokens: `[1, T, ·]` views, the rows read in place by the kernels.
        let (qkv, z, beta_in, a) = (
            qkv.unsqueeze(0)?,
            z.unsqueeze(0)?,
            beta_in.unsqueeze(0)?,
            a.unsqueeze(0)?,
        );
        let conv_state = self.conv_state_for(cache, 1, channels, &qkv)?;
        let in_place = cache.steps.as_ref().is_some_and(|s| s.in_place());
        if let Some(steps) = &mut cache.steps {
            // The conv rows before the window (copied for one token, which the conv front
            // advances in place, and when the window copies into its own buffers; for more
            // it writes a new state and leaves these as they are), then this pass's own: a
            // view of the in-projection.
            if steps.needs_before() {
                steps.record_before(match tokens == 1 && !in_place {
                    true => own_copy(&conv_state)?,
                    false => conv_state.clone(),
                })?;
            }
            steps.record_rows(qkv.clone())?;
        }
        let prepared = self.conv_prep(&qkv, &beta_in, &a, &conv_state)?;
        match in_place && tokens > 1 {
            // A CUDA graph's pass keeps the conv window the tensor it was captured with.
            true => candle_op(conv_state.slice_set(&prepared.conv_state, 0, 0))?,
            false => cache.conv = Some(prepared.conv_state.clone()),
        }
        let state = self.state_for(cache, 1, qkv.device())?;
        let (weight, eps, gate) = (&self.norm.norm.weight, self.norm.norm.eps, self.norm.gate);
        let step = |[q, k, v, g, beta, z]: [&Tensor; 6], state: &Tensor| {
            gated_delta_norm::gated_delta_update_norm(q, k, v, g, beta, state, z, weight, eps, gate)
        };
        let window_step = |[q, k, v, g, beta, z]: [&Tensor; 6], state: &Tensor, after: &Tensor| {
            gated_delta_update_norm_window(q, k, v, g, beta, state, z, weight, eps, gate, after)
        };
        let p = &prepared;
        let inputs = [&p.q, &p.k, &p.v, &p.g, &p.beta, &z];
        let out = match &mut cache.steps {
            Some(steps) if tokens > 1 && self.verify_window == VerifyWindow::OneLaunch => {
                steps.recurrence_in_one_launch(inputs, &state, window_step)?
            }
            Some(steps) => steps.recurrence(inputs, &state, step)?,
            None => step(inputs, &state)?,
        }; // [1, T, Hv, Dv]
        self.decode_out_proj(&out.reshape((tokens, hv * dv))?)
    }
}
