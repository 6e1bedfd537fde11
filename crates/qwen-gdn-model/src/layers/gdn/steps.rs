//! The per-token states of a verify window (speculative decoding, `crate::speculative`).
//!
//! A GDN layer cannot be rewound the way a KV cache is truncated: its recurrent state and conv
//! window hold every token it has seen. While a `GdnCache` carries a `GdnSteps`, the layer
//! runs the recurrence of a multi-token call one token at a time and keeps a copy of the state
//! after each token, and keeps the conv input rows of the call; [`GdnSteps::rewind`] then gives
//! the state after any prefix of the call, bit for bit, with no recomputation.
//!
//! Cost: one recurrent state per token of the window but the last (`Hv·Dv·Dk` values in the
//! state dtype) and the window's `K − 1 + S` conv input rows, per GDN layer, held until the
//! window closes.

use crate::tensor::own_copy;
use anyhow::{ensure, Result};
use candle_core::Tensor;
use gdn_ops::launches::{candle_op, candle_ops};

/// What one GDN layer recorded over a verify window.
#[derive(Debug, Clone, Default)]
pub struct GdnSteps {
    /// `[B, K−1+S, C]`: the conv rows before the window, then the window's own.
    window: Option<Tensor>,
    /// The recurrent state after each token of the window: copies, but for the last token
    /// the live state itself (the tensor the layer advances in place), which is copied just
    /// before the next token advances it. So a window that keeps every token costs no copy
    /// of the last state, and a pass of T tokens T − 1 copies.
    states: Vec<Tensor>,
    /// Whether the last entry of `states` is the live state.
    last_is_live: bool,
}

impl GdnSteps {
    /// Keeps the conv input rows of a forward call inside the window (`padded`: the `K − 1`
    /// rows before the call, then its own). A window may span several calls (a draft model
    /// drafts one token a call): each call's own rows are appended to what the window holds,
    /// whose last `K − 1` rows are the ones the call started from.
    pub(super) fn record_window(&mut self, padded: &Tensor, before: usize) -> Result<()> {
        self.window = Some(match self.window.take() {
            None => padded.clone(),
            Some(held) => {
                let own = padded.narrow(1, before, padded.dim(1)? - before)?;
                candle_op(Tensor::cat(&[&held, &own], 1))?
            }
        });
        Ok(())
    }

    /// The recurrence over the window's tokens `[q, k, v, g, beta]` (`[B, S, …]`), one
    /// `step` per token (the layer's own call, as a decode step makes it), keeping a copy of
    /// `state` after each. Returns `y` `[B, S, Hv, Dv]`.
    ///
    /// The inputs may be any `N` tensors with the tokens on dim 1 (the fused verify pass adds
    /// the output gate `z` to the five): `step` gets each token's slices (views, no copies).
    pub(super) fn recurrence<const N: usize>(
        &mut self,
        inputs: [&Tensor; N],
        state: &Tensor,
        step: impl Fn([&Tensor; N], &Tensor) -> Result<Tensor>,
    ) -> Result<Tensor> {
        let s = inputs[0].dim(1)?;
        let mut ys = Vec::with_capacity(s);
        for t in 0..s {
            let at: Vec<Tensor> = (inputs.iter())
                .map(|x| x.narrow(1, t, 1))
                .collect::<candle_core::Result<_>>()?;
            if self.last_is_live {
                let last = self.states.last_mut().expect("a live entry");
                *last = own_copy(last)?;
            }
            ys.push(step(std::array::from_fn(|i| &at[i]), state)?);
            self.states.push(state.clone());
            self.last_is_live = true;
        }
        match ys.len() {
            1 => Ok(ys.remove(0)),
            _ => candle_ops(ys.len(), Tensor::cat(&ys, 1)),
        }
    }

    /// Tokens the window recorded.
    pub fn len(&self) -> usize {
        self.states.len()
    }

    pub fn is_empty(&self) -> bool {
        self.states.is_empty()
    }

    /// The layer's state after the first `kept` tokens of the window (1 ≤ kept ≤ the window's
    /// length): the conv window of the `K − 1` rows that end with that token, and the
    /// recurrent state after it (the live state itself when every token is kept).
    pub fn rewind(self, kept: usize) -> Result<(Tensor, Tensor)> {
        ensure!(
            (1..=self.states.len()).contains(&kept),
            "rewinding a GDN layer to {kept} of the {} tokens it recorded",
            self.states.len()
        );
        let window = self
            .window
            .ok_or_else(|| anyhow::anyhow!("the GDN layer recorded no conv window"))?;
        let rows = window.dim(1)? - self.states.len(); // K − 1
        let conv = candle_op(window.narrow(1, kept, rows)?.force_contiguous())?;
        let state = self.states.into_iter().nth(kept - 1).expect("kept ≤ len");
        Ok((conv, state))
    }
}
