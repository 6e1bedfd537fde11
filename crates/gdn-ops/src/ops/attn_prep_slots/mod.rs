//! [`crate::ops::attn_prep::attn_prep`] over B sequences whose KV buffers are separate
//! tensors, in one launch: row `b` of `qkv` belongs to sequence `b`, which writes its key and
//! value into `keys[b]`, `values[b]` (`[1, Nkv, cap_b, Dh]`, each its own capacity) at its own
//! position `positions[b]` (`[1]` u32 on the device). Each sequence's q, gate and KV rows are,
//! bit for bit, its own call's: the same kernel body, the buffers, position and capacity read
//! from a table (see `gated_delta_norm_slots` for why a table).
//!
//! Outputs: `q` `[B, Nq, Dh]`, `gate` `[B, Nq·Dh]`. Backends: the CPU twin (the per-sequence
//! twin on each row) and CUDA (`attn_prep_slots_*` in kernels/attn_prep.cu); none on Metal
//! ([`crate::slot_tables::supports_device`] answers for every slot op).

pub(crate) mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;

use crate::ops::attn_prep::{AttnPrepDims, Inputs};
use crate::profile::{self, elems_bytes, Traffic};
use crate::slot_tables;
use anyhow::{ensure, Result};
use candle_core::{Device, Tensor};

const OP: &str = "attn_prep_slots";

/// The inputs of one slot call after the checks: each row as a per-sequence call's inputs
/// with its dims.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) struct SlotInputs<'a> {
    pub rows: Vec<(AttnPrepDims, Inputs<'a>)>,
    /// The whole `[B, W]` qkv.
    pub qkv: &'a Tensor,
}

/// Returns `(q [B, Nq, Dh], gate [B, Nq·Dh])` and writes each sequence's key and value into
/// its buffers at its position; see the module documentation.
#[allow(clippy::too_many_arguments)]
pub fn attn_prep_slots(
    qkv: &Tensor,
    q_norm: &Tensor,
    k_norm: &Tensor,
    eps: f32,
    inv_freq: &Tensor,
    positions: &[Tensor],
    keys: &[Tensor],
    values: &[Tensor],
) -> Result<(Tensor, Tensor)> {
    let n = positions.len();
    ensure!(n > 0, "{OP}: no sequences");
    ensure!(
        keys.len() == n && values.len() == n && qkv.rank() == 2 && qkv.dim(0)? == n,
        "{OP}: qkv {:?}, {} key and {} value buffers for {n} positions: one each a sequence",
        qkv.dims(),
        keys.len(),
        values.len()
    );
    let row_qkv = (0..n)
        .map(|i| Ok(qkv.narrow(0, i, 1)?))
        .collect::<Result<Vec<_>>>()?;
    // Every row is checked as the per-sequence op checks its call.
    let rows = (0..n)
        .map(|i| {
            let inputs = Inputs {
                qkv: &row_qkv[i],
                q_norm,
                k_norm,
                eps,
                inv_freq,
                pos: &positions[i],
                keys: &keys[i],
                values: &values[i],
            };
            Ok((inputs.check()?, inputs))
        })
        .collect::<Result<Vec<_>>>()?;
    let inputs = SlotInputs { rows, qkv };
    // Bytes moved: each row's call's (the op's formula), plus the table.
    let traffic = || {
        let d = inputs.rows[0].0;
        let dtype = qkv.dtype();
        let q = elems_bytes(n * d.q_heads * d.head_dim, dtype);
        let kv = elems_bytes(n * d.kv_heads * d.head_dim, dtype);
        Ok(Traffic::new()
            .read_all(qkv)
            .read_all(q_norm)
            .read_all(k_norm)
            .read_all(inv_freq)
            .read(n * (4 + 32))
            .write(2 * q + 2 * kv))
    };
    let device = qkv.device();
    profile::kernel(OP, device, traffic, || match device {
        Device::Cpu => {
            let rows = inputs
                .rows
                .iter()
                .map(|(d, r)| (r.keys, r.values, r.pos, d.capacity))
                .collect::<Vec<_>>();
            let words = slot_tables::host_kv_words(&rows)?;
            slot_tables::cpu_slot_twin(&words, || cpu::attn_prep_slots(&inputs))
        }
        #[cfg(feature = "cuda")]
        Device::Cuda(_) => cuda::attn_prep_slots(&inputs),
        other => anyhow::bail!("{OP}: no kernel for device {other:?}"),
    })
}
