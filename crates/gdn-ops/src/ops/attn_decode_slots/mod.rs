//! [`crate::ops::attn_decode::attn_decode`] over B sequences whose KV buffers are separate
//! tensors, in one launch (two where a sequence's context is split): row `b` of `q` and
//! `gate` belongs to sequence `b`, which attends over `keys[b]`, `values[b]` (`[1, Nkv,
//! cap_b, Dh]`, each its own capacity) up to its own position `positions[b]` (`[1]` u32 on
//! the device). Each sequence's output is, bit for bit, its own call's: its blocks run the
//! body its own launch runs (one pass, or the split passes that its capacity picks, with its
//! own number of key ranges), its buffers, position and capacity read from a table of
//! addresses (see `gated_delta_norm_slots` for why a table and not a pooled KV).
//!
//! Output `[B, 1, Nq·Dh]`, as the per-sequence op's rows stacked. Backends: the CPU twin (the
//! per-sequence twin on each row) and CUDA (`attn_decode_slots_*`,
//! `attn_decode_combine_slots_*` in kernels/attn_decode.cu); none on Metal
//! ([`crate::slot_tables::supports_device`] answers for every slot op).

pub(crate) mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;

use crate::ops::attn_decode::long_context::SplitPasses;
use crate::ops::attn_decode::{traffic, AttnDecodeDims, Inputs};
use crate::profile::{self, Traffic};
use crate::slot_tables;
use anyhow::{ensure, Result};
use candle_core::{Device, Tensor};

const OP: &str = "attn_decode_slots";

/// The inputs of one slot call after the checks: each row as a per-sequence call's inputs
/// with its dims, and the whole batch's q and gate.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) struct SlotInputs<'a> {
    pub rows: Vec<(AttnDecodeDims, Inputs<'a>)>,
    /// `[B, Nq, Dh]`.
    pub q: &'a Tensor,
    /// `[B, Nq·Dh]`.
    pub gate: &'a Tensor,
}

/// `o` `[B, 1, Nq·Dh]`: sequence `b`'s decode attention over its own KV buffers; see the
/// module documentation.
pub fn attn_decode_slots(
    q: &Tensor,
    gate: &Tensor,
    keys: &[Tensor],
    values: &[Tensor],
    positions: &[Tensor],
) -> Result<Tensor> {
    let n = positions.len();
    ensure!(n > 0, "{OP}: no sequences");
    ensure!(
        keys.len() == n && values.len() == n && q.rank() == 3 && q.dim(0)? == n,
        "{OP}: q {:?}, {} key and {} value buffers for {n} positions: one each a sequence",
        q.dims(),
        keys.len(),
        values.len()
    );
    ensure!(
        gate.rank() == 2 && gate.dim(0)? == n,
        "{OP}: gate {:?}, expected [{n}, Nq·Dh]",
        gate.dims()
    );
    let row = |t: &Tensor, i: usize| t.narrow(0, i, 1);
    let row_q = (0..n)
        .map(|i| row(q, i))
        .collect::<candle_core::Result<Vec<_>>>()?;
    let row_gate = (0..n)
        .map(|i| row(gate, i))
        .collect::<candle_core::Result<Vec<_>>>()?;
    // Every row is checked as the per-sequence op checks its call.
    let rows = (0..n)
        .map(|i| {
            let inputs = Inputs {
                q: &row_q[i],
                gate: &row_gate[i],
                keys: &keys[i],
                values: &values[i],
                pos: &positions[i],
            };
            Ok((inputs.check()?, inputs))
        })
        .collect::<Result<Vec<_>>>()?;
    let first = rows[0].0;
    for (i, (d, _)) in rows.iter().enumerate() {
        ensure!(
            (d.q_heads, d.kv_heads, d.head_dim) == (first.q_heads, first.kv_heads, first.head_dim),
            "{OP}: sequence {i} has {d:?}, sequence 0 {first:?}: the heads must match"
        );
    }
    let inputs = SlotInputs { rows, q, gate };
    // Bytes moved: each row's call's (the op's formula), plus the table.
    let moved = || {
        inputs
            .rows
            .iter()
            .try_fold(Traffic::new().read(n * 8 * SLOT_WORDS), |t, (d, r)| {
                let row = traffic(*d, r.q, r.gate, r.pos)?;
                anyhow::Ok(t.read(row.read as usize).write(row.written as usize))
            })
    };
    let device = q.device();
    profile::kernel(OP, device, moved, || match device {
        Device::Cpu => {
            // The kernel's table, row for row, with host addresses.
            let elem = q.dtype().size_in_bytes();
            let mut words = Vec::with_capacity(SLOT_WORDS * n);
            for (d, r) in &inputs.rows {
                words.extend(slot_tables::host_kv_words(&[(
                    r.keys, r.values, r.pos, d.capacity,
                )])?);
                words.extend([d.splits() as u64, passes(*d, elem)]);
            }
            slot_tables::cpu_slot_twin(&words, || cpu::attn_decode_slots(&inputs))
        }
        #[cfg(feature = "cuda")]
        Device::Cuda(_) => cuda::attn_decode_slots(&inputs),
        other => anyhow::bail!("{OP}: no kernel for device {other:?}"),
    })
}

/// Eight-byte words of a sequence's row of the table (`attn_decode::Slot` in
/// kernels/attn_decode.cu): keys, values, position, capacity, key ranges, passes.
pub const SLOT_WORDS: usize = 6;

/// `kSingle`, `kShipped`, `kPipelined`, `kPairs` of kernels/attn_decode.cu: the body a
/// sequence's own launch (`ops/attn_decode/cuda.rs`) runs for `d` (its one-sequence dims) in
/// elements of `elem_bytes`.
pub fn passes(d: AttnDecodeDims, elem_bytes: usize) -> u64 {
    if d.splits() == 1 {
        return 0;
    }
    match SplitPasses::for_dims(d, elem_bytes) {
        SplitPasses::Shipped => 1,
        SplitPasses::Pipelined => 2,
        SplitPasses::HeadPairs => 3,
    }
}
