//! [`crate::ops::gated_delta_norm::gated_delta_update_norm`] over B sequences whose states
//! are separate tensors, in one launch: row `b` of every input belongs to sequence `b`, whose
//! state `states[b]` (`[1, Hv, Dv, Dk]`, f32 or bf16, contiguous) is advanced in place. The
//! result is, bit for bit, the B per-sequence calls' outputs stacked: each sequence's heads
//! are computed by the same kernel body in the same order (the CUDA host picks the entry a
//! one-sequence launch would pick); only the state's address comes from a table.
//!
//! Why a table of state addresses and not one pooled `[B, Hv, Dv, Dk]` state: a batched
//! decode step's sequences join and leave at any step, each with a cache of its own; a pooled
//! state would be copied in and out on every change of the batch (or, with the caches as they
//! are, on every step: three times the recurrence's own state traffic), while the table costs
//! 8 bytes a sequence. See docs/perf-notes.md, "the state kernels over B sequences".
//!
//! Inputs as the per-sequence op's with `B` = `states.len()` rows: `q`, `k` `[B, T, Hk, Dk]`,
//! `v` `[B, T, Hv, Dv]`, `g`, `beta` `[B, T, Hv]` f32, `z` `[B, T, Hv, Dv]` (or a view with
//! each token contiguous), `weight` `[Dv]`. Output `[B, T, Hv, Dv]` in q's dtype.
//!
//! Backends: the CPU twin (the per-sequence twin on each sequence's rows) and CUDA
//! (`gated_delta_norm_slots_*` in kernels/gated_delta_norm.cu). Metal has no kernel yet:
//! [`crate::slot_tables::supports_device`] says so and the model launches per sequence there.

pub(crate) mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;

use crate::backend::row_layout;
use crate::ops::gated_delta::{self, GdnDims};
use crate::ops::gated_delta_norm::{Gate, Inputs};
use crate::profile;
use crate::slot_tables;
use anyhow::{ensure, Result};
use candle_core::{Device, Tensor};

const OP: &str = "gated_delta_update_norm_slots";

/// The inputs of one slot call after the checks: each sequence's rows as a per-sequence
/// call's inputs (the CPU twin runs those), and the whole batch's (the kernel reads those,
/// with the states from the table).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) struct SlotInputs<'a> {
    /// One per sequence: row b of every input, with `states[b]`.
    pub rows: Vec<Inputs<'a>>,
    /// The whole batch, `states[0]` in the state's place (the kernel takes the table).
    pub batch: Inputs<'a>,
    pub states: &'a [Tensor],
    pub dims: GdnDims,
}

/// Advances each `states[b]` in place over `T` tokens of row `b`, and returns the gated
/// RMSNorm of the recurrence's output, `[B, T, Hv, Dv]`; see the module documentation.
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_update_norm_slots(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    g: &Tensor,
    beta: &Tensor,
    states: &[Tensor],
    z: &Tensor,
    weight: &Tensor,
    eps: f32,
    gate: Gate,
) -> Result<Tensor> {
    let b = states.len();
    ensure!(b > 0, "{OP}: no sequences");
    ensure!(
        q.dim(0)? == b,
        "{OP}: {} rows of q for {b} states",
        q.dim(0)?
    );
    // Every row is checked as the per-sequence op checks its call (shapes, dtypes, devices,
    // each state [1, Hv, Dv, Dk] and contiguous). The row tensors are views: no copy.
    let row_tensors = (0..b)
        .map(|i| {
            let r = |t: &Tensor| t.narrow(0, i, 1);
            Ok([r(q)?, r(k)?, r(v)?, r(g)?, r(beta)?, r(z)?])
        })
        .collect::<Result<Vec<_>>>()?;
    let rows = row_tensors
        .iter()
        .zip(states)
        .map(|([q, k, v, g, beta, z], state)| {
            Inputs::checked(q, k, v, g, beta, state, z, weight, eps, gate)
        })
        .collect::<Result<Vec<_>>>()?;
    let first = &states[0];
    for (i, s) in states.iter().enumerate() {
        ensure!(
            s.dtype() == first.dtype() && s.device().same_device(first.device()),
            "{OP}: state {i} is {:?} on {:?}, state 0 {:?} on {:?}: they must match",
            s.dtype(),
            s.device(),
            first.dtype(),
            first.device()
        );
    }
    let dims = GdnDims {
        batch: b,
        ..rows[0].dims
    };
    let batch = Inputs {
        recurrence: gated_delta::Inputs::new(q, k, v, g, beta, None),
        dims,
        state: first,
        z,
        weight,
        eps,
        gate,
        z_rows: row_layout(
            z,
            &[b, dims.steps],
            dims.value_heads * dims.value_dim,
            "gated_delta_update_norm_slots: z",
        )?,
    };
    let inputs = SlotInputs {
        rows,
        batch,
        states,
        dims,
    };
    // Bytes moved: each sequence's call's (its rows, its state read and written once), plus
    // the table.
    let traffic = || {
        // `gated_delta::traffic` counts the first state; the others are added here.
        let t = gated_delta::traffic(&inputs.batch.recurrence, dims, first)
            .read_all(z)
            .read_all(weight)
            .read(b * 8);
        Ok(states[1..]
            .iter()
            .fold(t, |t, s| t.read_all(s).write_all(s)))
    };
    let device = first.device();
    profile::kernel("gated_delta_norm_slots", device, traffic, || match device {
        Device::Cpu => {
            let words = slot_tables::host_words(states)?;
            slot_tables::cpu_slot_twin(&words, || cpu::gated_delta_update_norm_slots(&inputs))
        }
        #[cfg(feature = "cuda")]
        Device::Cuda(_) => cuda::gated_delta_update_norm_slots(&inputs),
        other => anyhow::bail!("{OP}: no kernel for device {other:?}"),
    })
}
