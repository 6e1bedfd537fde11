//! [`crate::ops::gdn_conv_prep::gdn_conv_prep`]'s decode step (one token) over B sequences
//! whose conv states are separate tensors, in one launch: row `b` of `qkv`, `b`, `a` belongs
//! to sequence `b`, whose conv state `conv_states[b]` (`[1, K−1, C]`, contiguous) is shifted
//! in place. Each sequence's outputs are, bit for bit, its own call's: the same kernel body,
//! the state read from an address table (see `gated_delta_norm_slots` for why a table).
//!
//! Inputs: `qkv` `[B, C]`, `b`, `a` `[B, Hv]` (rows contiguous, at any stride), the layer's
//! `taps`, `dt_bias`, `neg_a_exp` as the per-sequence op's. Outputs: `q`, `k` `[B, 1, Hk, Dk]`,
//! `v` `[B, 1, Hv, Dv]`, `g`, `beta` `[B, 1, Hv]` f32.
//!
//! Backends: the CPU twin (the per-sequence twin on each row) and CUDA
//! (`gdn_conv_prep_slots_*` in kernels/gdn_conv_prep.cu); none on Metal yet
//! ([`crate::slot_tables::supports_device`] answers for both slot ops).

pub(crate) mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;

use crate::backend::row_layout;
use crate::ops::gdn_conv_prep::{traffic, ConvPrepDims, Inputs};
use crate::profile;
use crate::slot_tables;
use anyhow::{ensure, Result};
use candle_core::{Device, Tensor};

const OP: &str = "gdn_conv_prep_slots";

/// What [`gdn_conv_prep_slots`] returns: the recurrence's inputs for the B rows (the conv
/// states are advanced in place).
#[derive(Debug, Clone)]
pub struct SlotsOut {
    /// `[B, 1, Hk, Dk]`, `InT`.
    pub q: Tensor,
    /// `[B, 1, Hk, Dk]`, `InT`.
    pub k: Tensor,
    /// `[B, 1, Hv, Dv]`, `InT`.
    pub v: Tensor,
    /// `[B, 1, Hv]` f32.
    pub g: Tensor,
    /// `[B, 1, Hv]` f32.
    pub beta: Tensor,
}

/// The inputs of one slot call after the checks: each row as a per-sequence call's inputs,
/// and the whole batch's (`conv_states[0]` in the state's place: the kernel takes the table).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) struct SlotInputs<'a> {
    pub rows: Vec<Inputs<'a>>,
    pub batch: Inputs<'a>,
    pub conv_states: &'a [Tensor],
}

/// One decode step's conv front for B sequences; see the module documentation.
#[allow(clippy::too_many_arguments)]
pub fn gdn_conv_prep_slots(
    qkv: &Tensor,
    b: &Tensor,
    a: &Tensor,
    conv_states: &[Tensor],
    taps: &Tensor,
    dt_bias: &Tensor,
    neg_a_exp: &Tensor,
    dims: ConvPrepDims,
) -> Result<SlotsOut> {
    let n = conv_states.len();
    ensure!(n > 0, "{OP}: no sequences");
    for (name, t) in [("qkv", qkv), ("b", b), ("a", a)] {
        ensure!(
            t.rank() == 2 && t.dim(0)? == n,
            "{OP}: {name} {:?}, expected [{n}, ·] (one token a sequence)",
            t.dims()
        );
    }
    let (qkv, b, a) = (qkv.unsqueeze(1)?, b.unsqueeze(1)?, a.unsqueeze(1)?);
    // Every row is checked as the per-sequence op checks its call (views: no copy).
    let row_tensors = (0..n)
        .map(|i| Ok([qkv.narrow(0, i, 1)?, b.narrow(0, i, 1)?, a.narrow(0, i, 1)?]))
        .collect::<Result<Vec<_>>>()?;
    let rows = row_tensors
        .iter()
        .zip(conv_states)
        .map(|([qkv, b, a], state)| {
            Inputs::checked(qkv, b, a, state, taps, dt_bias, neg_a_exp, dims)
        })
        .collect::<Result<Vec<_>>>()?;
    let first = &conv_states[0];
    for (i, s) in conv_states.iter().enumerate() {
        ensure!(
            s.device().same_device(first.device()),
            "{OP}: conv state {i} is on {:?}, conv state 0 on {:?}: they must match",
            s.device(),
            first.device()
        );
    }
    let lead = [n, 1];
    let hv = dims.value_heads;
    let batch = Inputs {
        dims,
        batch: n,
        tokens: 1,
        qkv: &qkv,
        b: &b,
        a: &a,
        conv_state: first,
        taps,
        dt_bias,
        neg_a_exp,
        qkv_rows: row_layout(&qkv, &lead, dims.channels(), "gdn_conv_prep_slots: qkv")?,
        b_rows: row_layout(&b, &lead, hv, "gdn_conv_prep_slots: b")?,
        a_rows: row_layout(&a, &lead, hv, "gdn_conv_prep_slots: a")?,
    };
    let inputs = SlotInputs {
        rows,
        batch,
        conv_states,
    };
    // Bytes moved: each row's call's, plus the table.
    let moved = || {
        let t = inputs.rows.iter().map(|r| traffic(r).total()).sum::<u64>();
        Ok(profile::Traffic::new().read(t as usize + n * 8))
    };
    let device = first.device();
    profile::kernel(OP, device, moved, || match device {
        Device::Cpu => {
            let words = slot_tables::host_words(conv_states)?;
            slot_tables::cpu_slot_twin(&words, || cpu::gdn_conv_prep_slots(&inputs))
        }
        #[cfg(feature = "cuda")]
        Device::Cuda(_) => cuda::gdn_conv_prep_slots(&inputs),
        other => anyhow::bail!("{OP}: no kernel for device {other:?}"),
    })
}
