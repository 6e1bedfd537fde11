//! [`crate::ops::gated_delta_norm::gated_delta_update_norm`] over a speculative verify window
//! of T tokens (issue 28) in one launch, with the state after every token but the last kept:
//! what T one-token calls give, bit for bit, each followed by a copy of the state.
//!
//! Why: a verify pass must be able to keep any prefix of its T tokens, so a GDN layer keeps
//! the state after each. One-token launches with a copy between them cost a GDN layer T
//! launches and T − 1 copies (at T = 4 on the H200: 144 launches of the kernel, 1.28 ms, for
//! 36 layers); here one launch writes the T − 1 states where the window keeps them.
//!
//! Bit for bit T one-token calls: the kernel runs each token as the one-token launch does
//! (the same entry, cluster or not, so the same sums in the same order) and rounds the state
//! to its dtype after every token as each launch's store does (a bf16 state is rounded T
//! times, not once as the plain op's T-token call rounds it).
//!
//! Inputs as the plain op's (`q`, `k` `[B, T, Hk, Dk]`, `v` `[B, T, Hv, Dv]`, `g`, `beta`
//! `[B, T, Hv]` f32, `state` `[B, Hv, Dv, Dk]` advanced in place, `z`, `weight`), plus
//! `after` `[T − 1, B, Hv, Dv, Dk]` in the state's dtype, contiguous, written: `after[t]` is
//! the state after token t. Output `[B, T, Hv, Dv]` in q's dtype.
//!
//! Backends: the CPU twin (T one-token calls of the plain op's twin, each state copied),
//! Metal and CUDA (`gated_delta_norm_window_*` in kernels/gated_delta_norm.{metal,cu}).

pub(crate) mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(any(feature = "metal", target_os = "macos"))]
pub mod metal;

use crate::backend::on_device;
use crate::ops::gated_delta;
use crate::ops::gated_delta_norm::{Gate, Inputs};
use crate::profile;
use anyhow::{ensure, Result};
use candle_core::Tensor;

const OP: &str = "gated_delta_update_norm_window";

/// The inputs of one window call after the checks: the plain op's, and where the states go.
pub(crate) struct WindowInputs<'a> {
    pub inputs: Inputs<'a>,
    /// `[T − 1, B, Hv, Dv, Dk]`, the state's dtype, contiguous.
    pub after: &'a Tensor,
}

/// Advances `state` in place over the T tokens, writes the state after each token but the
/// last into `after`, and returns the gated RMSNorm of the recurrence's output with `gate`,
/// `[B, T, Hv, Dv]`; see the module documentation.
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_update_norm_window(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    g: &Tensor,
    beta: &Tensor,
    state: &Tensor,
    z: &Tensor,
    weight: &Tensor,
    eps: f32,
    gate: Gate,
    after: &Tensor,
) -> Result<Tensor> {
    let inputs = Inputs::checked(q, k, v, g, beta, state, z, weight, eps, gate)?;
    let d = inputs.dims;
    let want = [
        d.steps.saturating_sub(1),
        d.batch,
        d.value_heads,
        d.value_dim,
        d.key_dim,
    ];
    ensure!(d.steps > 0, "{OP}: no tokens");
    ensure!(
        after.dims() == want && after.dtype() == state.dtype() && after.is_contiguous(),
        "{OP}: after is {:?} {:?}, must be a contiguous {want:?} {:?} (the state's dtype)",
        after.dims(),
        after.dtype(),
        state.dtype()
    );
    ensure!(
        after.device().same_device(state.device()),
        "{OP}: after is on another device than the state"
    );
    let window = WindowInputs { inputs, after };
    // Bytes moved: the plain op's (its inputs, the state read and written once, the output),
    // plus the T − 1 states written.
    let traffic = || {
        let i = &window.inputs;
        Ok(gated_delta::traffic(&i.recurrence, d, state)
            .read_all(z)
            .read_all(weight)
            .write_all(after))
    };
    let device = state.device();
    profile::kernel("gated_delta_norm_window", device, traffic, || {
        on_device!(device, OP, gated_delta_update_norm_window(&window))
    })
}
