//! The per-token states of a verify window (speculative decoding, `crate::speculative`).
//!
//! A GDN layer cannot be rewound the way a KV cache is truncated: its recurrent state and conv
//! window hold every token it has seen. While a `GdnCache` carries a `GdnSteps`, the layer
//! keeps the state after each token of a multi-token call (the composed path runs the
//! recurrence one token at a time and copies it; the fused verify pass's one launch writes
//! them into one `[T − 1, ·state]` tensor, [`GdnSteps::recurrence_in_one_launch`]), and keeps
//! the conv input rows of the call; [`GdnSteps::rewind`] then gives
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
    /// The conv input rows `[B, ·, C]` in parts along the token dim: the `K − 1` rows before
    /// the window, then the window's own, as each call gave them (views; nothing is joined
    /// until a rewind needs rows of them).
    window: Vec<Tensor>,
    /// `K − 1`: the rows before the window.
    before: usize,
    /// The recurrent state after each token of the window: copies, but for the last token
    /// the live state itself (the tensor the layer advances in place), which is copied just
    /// before the next token advances it. So a window that keeps every token costs no copy
    /// of the last state, and a pass of T tokens T − 1 copies.
    states: Vec<Tensor>,
    /// Set for a pass replayed from a CUDA graph (`families/hybrid/verify_graph.rs`): the
    /// buffers, allocated before the capture, that the rows and states are copied into, so
    /// that what the window holds is the same tensors at every replay.
    buffers: Option<StepBuffers>,
}

/// The persistent buffers of [`GdnSteps::in_buffers`].
#[derive(Debug, Clone)]
struct StepBuffers {
    /// `[B, K − 1 + T, C]`: the rows before the window, then the window's T.
    rows: Tensor,
    /// Rows of `rows` written so far.
    filled: usize,
    /// The states after each token of the window but the last: `[T − 1, ·state's shape]` in
    /// the state's dtype (`None` for T = 1), where the one-launch recurrence writes them
    /// ([`GdnSteps::recurrence_in_one_launch`]); `states` holds views of it.
    after: Option<Tensor>,
}

impl GdnSteps {
    /// A window that copies its conv rows into `rows` (`[B, K − 1 + T, C]`) and keeps the
    /// states after its tokens but the last in `after` (`[T − 1, ·state's shape]`, `None` for
    /// T = 1: a CUDA graph's persistent buffers) instead of keeping views and fresh copies.
    pub fn in_buffers(rows: Tensor, after: Option<Tensor>) -> Self {
        Self {
            buffers: Some(StepBuffers {
                rows,
                filled: 0,
                after,
            }),
            ..Self::default()
        }
    }

    /// Whether nothing was recorded yet and nothing is copied into persistent buffers (a
    /// window just opened).
    pub fn is_fresh(&self) -> bool {
        self.window.is_empty() && self.states.is_empty() && self.buffers.is_none()
    }

    /// Whether the window copies into persistent buffers ([`GdnSteps::in_buffers`]): then
    /// the layer also keeps its conv window in place (the tensor a graph was captured with).
    pub(super) fn in_place(&self) -> bool {
        self.buffers.is_some()
    }

    /// `rows` as the window keeps them: copied into the persistent buffer (next to what it
    /// holds) when there is one, else as they are.
    fn kept_rows(&mut self, rows: Tensor) -> Result<Tensor> {
        let Some(b) = &mut self.buffers else {
            return Ok(rows);
        };
        let n = rows.dim(1)?;
        let rows = match rows.is_contiguous() {
            true => rows,
            false => own_copy(&rows)?,
        };
        candle_op(b.rows.slice_set(&rows, 1, b.filled))?;
        let kept = b.rows.narrow(1, b.filled, n)?;
        b.filled += n;
        Ok(kept)
    }

    /// Keeps the conv input rows of a forward call inside the window (`padded`: the `K − 1`
    /// rows before the call, then its own). A window may span several calls (a draft model
    /// drafts one token a call): each call's own rows are appended to what the window holds,
    /// whose last `K − 1` rows are the ones the call started from.
    pub(super) fn record_window(&mut self, padded: &Tensor, before: usize) -> Result<()> {
        if self.window.is_empty() {
            self.before = before;
            self.window.push(padded.clone());
        } else {
            self.window
                .push(padded.narrow(1, before, padded.dim(1)? - before)?);
        }
        Ok(())
    }

    /// Whether the window still needs the conv rows before it ([`GdnSteps::record_before`]):
    /// nothing was recorded yet.
    pub(super) fn needs_before(&self) -> bool {
        self.window.is_empty()
    }

    /// The `K − 1` conv rows before the window, `[B, K−1, C]` (a tensor nothing advances
    /// any more: the caller copies a state it will advance in place).
    pub(super) fn record_before(&mut self, rows: Tensor) -> Result<()> {
        ensure!(
            self.window.is_empty(),
            "the window's first rows are already recorded"
        );
        self.before = rows.dim(1)?;
        let rows = self.kept_rows(rows)?;
        self.window.push(rows);
        Ok(())
    }

    /// A call's own conv input rows `[B, S, C]` (a view is kept as it is).
    pub(super) fn record_rows(&mut self, rows: Tensor) -> Result<()> {
        ensure!(
            !self.window.is_empty(),
            "the rows before the window come first"
        );
        let rows = self.kept_rows(rows)?;
        self.window.push(rows);
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
            self.keep_live_state()?;
            ys.push(step(std::array::from_fn(|i| &at[i]), state)?);
            self.states.push(state.clone());
        }
        match ys.len() {
            1 => Ok(ys.remove(0)),
            _ => candle_ops(ys.len(), Tensor::cat(&ys, 1)),
        }
    }

    /// [`GdnSteps::recurrence`] in one call: `step` (the layer's
    /// `gated_delta_update_norm_window`) runs the S tokens and writes the state after each
    /// but the last into its third argument, `[S − 1, ·state's shape]`: the window's buffer
    /// when it has one, else a fresh tensor. The same states, bit for bit (the op's contract),
    /// with one launch instead of S and no copies. Returns `y` `[B, S, Hv, Dv]`.
    pub(super) fn recurrence_in_one_launch<const N: usize>(
        &mut self,
        inputs: [&Tensor; N],
        state: &Tensor,
        step: impl Fn([&Tensor; N], &Tensor, &Tensor) -> Result<Tensor>,
    ) -> Result<Tensor> {
        let s = inputs[0].dim(1)?;
        ensure!(
            s > 1,
            "a one-launch window takes two tokens or more, got {s}"
        );
        self.keep_live_state()?;
        let kept = self.states.len();
        let buffer = (self.buffers.as_ref())
            .and_then(|b| b.after.as_ref())
            .filter(|a| a.dim(0).is_ok_and(|n| kept + s - 1 <= n));
        let after = match buffer {
            Some(a) => a.narrow(0, kept, s - 1)?,
            None => {
                let mut shape = vec![s - 1];
                shape.extend_from_slice(state.dims());
                candle_op(Tensor::zeros(shape, state.dtype(), state.device()))?
            }
        };
        let y = step(inputs, state, &after)?;
        for t in 0..s - 1 {
            self.states.push(after.get(t)?);
        }
        self.states.push(state.clone());
        Ok(y)
    }

    /// The last recorded state is the live one (the tensor the layer advances in place):
    /// copied (into the window's buffer when it has one) before the next token advances it.
    fn keep_live_state(&mut self) -> Result<()> {
        let before = self.states.len().wrapping_sub(1);
        let buffer = (self.buffers.as_ref())
            .and_then(|b| b.after.as_ref())
            .filter(|a| a.dim(0).is_ok_and(|n| before < n));
        if let Some(last) = self.states.last_mut() {
            *last = match buffer {
                Some(after) => {
                    let slot = after.get(before)?;
                    candle_op(slot.slice_set(last, 0, 0))?;
                    slot
                }
                None => own_copy(last)?,
            };
        }
        Ok(())
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
        // Rows kept .. kept + K − 1 of the window's rows (the `K − 1` before it first).
        let (from, to) = (kept, kept + self.before);
        let (mut pieces, mut at) = (Vec::new(), 0);
        for part in &self.window {
            let len = part.dim(1)?;
            let (lo, hi) = (from.max(at), to.min(at + len));
            if lo < hi {
                pieces.push(part.narrow(1, lo - at, hi - lo)?);
            }
            at += len;
        }
        ensure!(
            at == self.before + self.states.len() && !pieces.is_empty(),
            "the GDN layer recorded {at} conv rows for {} tokens",
            self.states.len()
        );
        let conv = match pieces.len() {
            1 => candle_op(pieces[0].force_contiguous())?,
            n => candle_ops(n, Tensor::cat(&pieces, 1))?,
        };
        let state = self.states.into_iter().nth(kept - 1).expect("kept ≤ len");
        Ok((conv, state))
    }
}
