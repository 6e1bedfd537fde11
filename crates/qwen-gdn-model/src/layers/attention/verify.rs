//! The attention mixer in a speculative verify pass on the fused kernels: the T = k + 1
//! tokens of one sequence at positions `p .. p + T` (the step's token and its drafts). The
//! q/k/v product and the o-projection run once over the T rows; the prep (norms, RoPE, KV
//! append) once for the T rows through the slot kernel (`attn_prep_slots`: every row writes
//! its own position of the same KV buffers); then the attention of all T rows in one launch of
//! the batched step's slot kernel (`attn_decode_slots`, every row's table entry naming the same
//! buffers), row `t` attending to positions `0 ..= p + t`: the causal rule inside the window is
//! the decode kernel's own length, and each row is bit for bit the decode step's at that
//! position (the slot kernel runs, for each row, the body its own launch runs). Where the device
//! has no slot kernel (Metal) the rows run [`Attention::decode_attend_fused`] one after the
//! other. A rejected draft's keys stay in the buffers, past the length the window keeps
//! (`KvCache::truncate`), and are written over by the next pass.

use super::Attention;
use crate::cache::KvCache;
use crate::candle_ops::cat;
use anyhow::{ensure, Context, Result};
use candle_core::Tensor;
use gdn_ops::ops::{attn_decode, attn_decode_slots, attn_prep_slots};

impl Attention {
    /// The T tokens of one sequence, `x` `[T, H]` (input-normed), `positions[t]` the `[1]`
    /// u32 device position of row `t` (the cache's length plus `t`) → the mixer's output
    /// `[T, H]`, the T keys and values appended.
    pub(crate) fn verify_fused(
        &self,
        x: &Tensor,
        cache: &mut KvCache,
        positions: &[Tensor],
    ) -> Result<Tensor> {
        let qkv = self.decode_qkv(x)?; // [T, ·]
        let tokens = qkv.dim(0)?;
        ensure!(
            positions.len() == tokens,
            "{} positions for {tokens} verify rows",
            positions.len()
        );
        if !gdn_ops::slot_tables::supports_device(qkv.device()) {
            let mut outs = Vec::with_capacity(tokens);
            for (row, pos) in positions.iter().enumerate() {
                outs.push(self.decode_attend_fused(&qkv.narrow(0, row, 1)?, cache, pos)?);
            }
            return self.decode_o_proj(&cat(&outs, 0)?);
        }
        let (nq, nkv, dh) = (self.heads, self.kv_heads, self.head_dim);
        let (keys, values) = cache.buffers_for(tokens, (1, nkv, dh), &qkv)?;
        let inv_freq = self
            .rope_inv_freq
            .as_ref()
            .context("fused attention verify needs the device plan")?;
        // Every row's table entry names the same buffers, at its own position.
        let (q, gate) = attn_prep_slots::attn_prep_slots(
            &qkv,
            &self.q_norm.weight,
            &self.k_norm.weight,
            self.q_norm.eps,
            inv_freq,
            positions,
            &vec![keys.clone(); tokens],
            &vec![values.clone(); tokens],
        )?;
        cache.advance(tokens);
        let o = match tokens {
            1 => attn_decode::attn_decode(&q, &gate, &keys, &values, &positions[0])?,
            _ => attn_decode_slots::attn_decode_slots(
                &q,
                &gate,
                &vec![keys.clone(); tokens],
                &vec![values.clone(); tokens],
                positions,
            )?,
        };
        self.decode_o_proj(&o.reshape((tokens, nq * dh))?)
    }
}
