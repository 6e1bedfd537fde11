//! One decode step of gated attention, fused: softmax attention of each sequence's single
//! query over its cached keys and values, and the `sigmoid(gate)` product, in one kernel.
//!
//! Inputs (InT: f32, f16 or bf16): `q` `[B, Nq, Dh]`, `gate` `[B, Nq·Dh]` (as
//! [`attn_prep`](super::attn_prep) leaves them), `keys`, `values` `[B, Nkv, cap, Dh]`
//! (contiguous KV buffers), `pos` `[1]` u32 on the device: the query attends to positions
//! `0..=pos` (its own key included, written by `attn_prep`). Read by the kernel, so a captured
//! launch replays for every position. The host keeps `pos < cap`; the kernels clamp the last
//! position to `cap − 1` so that they never read past the buffers.
//!
//! Query head `h` reads KV head `h / (Nq / Nkv)`. In f32: `s_t = (q·k_t)·Dh^−½`,
//! `p = softmax(s)`, `o = Σ p_t·v_t`; then `out = round_InT(round_InT(o)·sigmoid(f32(gate)))`.
//! The composed path rounds the attention output to InT and multiplies it by
//! `sigmoid(gate)` in InT (sigmoid itself rounded); here the sigmoid stays in f32, a
//! difference of at most one rounding of InT.
//!
//! Output: `[B, 1, Nq·Dh]`, ready for `o_proj`.
//!
//! Kernels: `kernels/attn_decode.{metal,cu}`: per (query head, sequence) a threadgroup of
//! [`SIMDGROUPS`] simdgroups (warps) splitting the keys, each with an online softmax, combined
//! through threadgroup (shared) memory. That is one threadgroup per head: at 16 query heads a
//! long context leaves most of a GPU idle while each reads its whole KV. So from
//! [`SPLIT_KEYS`] cached positions on, the keys are split across threadgroups as in flash
//! decoding ([`AttnDecodeDims::splits`]): `attn_decode_split_*` leaves each range's running
//! max, sum and weighted values in an f32 buffer, `attn_decode_combine_*` merges them and
//! applies the gate. The split count comes from the buffers' capacity, which a captured CUDA
//! graph holds fixed (it is captured again when the KV buffers grow); the ranges come from
//! `pos` on the device.

pub(crate) mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod long_context;
#[cfg(any(feature = "metal", target_os = "macos"))]
pub mod metal;

use crate::backend::on_device;
use crate::profile::{self, elems_bytes, Traffic};
use anyhow::{ensure, Result};
use candle_core::{DType, Tensor};

/// Simdgroups (warps) per threadgroup (block), each taking every `SIMDGROUPS`-th key.
/// (kernels/attn_decode.cu bounds its blocks at 8 warps, four resident per SM.)
pub const SIMDGROUPS: usize = 8;
/// Positions per key range of a split: buffers of at most this capacity take one pass.
/// 128, not 512: at 518 positions ranges of 512 keys gave 32 blocks of 16 four-key rounds a
/// warp, 34 µs a layer on an H200 (`bench --profile-decode`, docs/perf-notes-gpu.md).
pub const SPLIT_KEYS: usize = 128;
/// Most key ranges per head: at Qwen3-Next's 16 query heads 32 ranges are 512 blocks, one
/// wave of four 256-thread blocks an SM on an H100; longer contexts take longer ranges.
pub const MAX_SPLITS: usize = 32;
/// Largest head dim: each lane holds `Dh / 32` features of q and of the output in registers.
pub const MAX_HEAD_DIM: usize = 256;

/// `AttnDecodeParams` of kernels/params/attn_decode.h, field for field.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnDecodeParams {
    pub batch: u32,
    pub q_heads: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    pub capacity: u32,
    pub simdgroups: u32,
    pub splits: u32,
    pub scale: f32,
}

/// Shapes of one call, read off its inputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttnDecodeDims {
    pub batch: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub capacity: usize,
}

impl AttnDecodeDims {
    /// Key ranges per head: one per [`SPLIT_KEYS`] positions of capacity (the context
    /// rounded up to the KV buffers' growth step), at most [`MAX_SPLITS`].
    pub fn splits(&self) -> usize {
        splits(self.capacity)
    }

    /// f32 values of the records a split leaves for the combine pass: `2 + Dh` per range.
    pub fn partial_len(&self, splits: usize) -> usize {
        self.batch * self.q_heads * splits * (2 + self.head_dim)
    }

    pub fn params(&self, simdgroups: usize, splits: usize) -> AttnDecodeParams {
        AttnDecodeParams {
            batch: self.batch as u32,
            q_heads: self.q_heads as u32,
            kv_heads: self.kv_heads as u32,
            head_dim: self.head_dim as u32,
            capacity: self.capacity as u32,
            simdgroups: simdgroups as u32,
            splits: splits as u32,
            scale: (self.head_dim as f32).powf(-0.5),
        }
    }

    /// Bytes of threadgroup (shared) memory per threadgroup: each simdgroup's running max,
    /// sum and `Dh` output values, in f32, rounded up to the 16 bytes Metal requires.
    pub fn scratch_bytes(&self, simdgroups: usize) -> usize {
        (simdgroups * (2 + self.head_dim) * 4).next_multiple_of(16)
    }
}

/// Key ranges per head for KV buffers of `capacity` positions (see [`AttnDecodeDims::splits`]).
fn splits(capacity: usize) -> usize {
    capacity.div_ceil(SPLIT_KEYS).clamp(1, MAX_SPLITS)
}

/// Kernel launches of one [`attn_decode`] on `device` over KV buffers of `capacity`
/// positions: one, or on a GPU past [`SPLIT_KEYS`] positions the split pass and its combine
/// (the CPU twin runs every range in one call). For launch budgets.
pub fn launches(capacity: usize, device: &candle_core::Device) -> usize {
    match device.is_cpu() || splits(capacity) == 1 {
        true => 1,
        false => 2,
    }
}

/// Whether the kernels cover head dim `head_dim` (a multiple of 32 up to 256: 64, 128, 256
/// among them) with `q_heads` query heads over `kv_heads` KV heads in `dtype`.
pub fn supports(head_dim: usize, q_heads: usize, kv_heads: usize, dtype: DType) -> bool {
    matches!(dtype, DType::F32 | DType::F16 | DType::BF16)
        && head_dim.is_multiple_of(32)
        && (32..=MAX_HEAD_DIM).contains(&head_dim)
        && kv_heads > 0
        && q_heads.is_multiple_of(kv_heads)
        && q_heads > 0
}

/// `o` `[B, 1, Nq·Dh]`: see the module doc.
pub fn attn_decode(
    q: &Tensor,
    gate: &Tensor,
    keys: &Tensor,
    values: &Tensor,
    pos: &Tensor,
) -> Result<Tensor> {
    let inputs = Inputs {
        q,
        gate,
        keys,
        values,
        pos,
    };
    let dims = inputs.check()?;
    let device = q.device();
    // The GPU kernels split a long context into key ranges and merge them in a second launch
    // (one row, both grids); the CPU twin never splits.
    let name = if !device.is_cpu() && dims.splits() > 1 {
        "attn_decode_split"
    } else {
        "attn_decode"
    };
    let traffic = || traffic(dims, q, gate, pos);
    profile::kernel(name, device, traffic, || {
        on_device!(device, "attn_decode", attn_decode(dims, &inputs))
    })
}

/// Bytes moved (the decode profile): q, gate and the position read, and per KV head the keys
/// and values of positions `0..=pos` (clamped as the kernels clamp it), not the buffers'
/// capacity; the output written. The position lives on the device: it is read back, which
/// the profile does only when profiling (between drained ops). The split's partial records
/// are scratch, not counted.
pub(crate) fn traffic(
    d: AttnDecodeDims,
    q: &Tensor,
    gate: &Tensor,
    pos: &Tensor,
) -> Result<Traffic> {
    let last = (pos.to_vec1::<u32>()?[0] as usize).min(d.capacity - 1);
    let dtype = q.dtype();
    let kv = elems_bytes(d.batch * d.kv_heads * (last + 1) * d.head_dim, dtype);
    Ok(Traffic::new()
        .read_all(q)
        .read_all(gate)
        .read_all(pos)
        .read(2 * kv)
        .write(elems_bytes(d.batch * d.q_heads * d.head_dim, dtype)))
}

/// The inputs of one call, as the backends receive them (with the dims [`Inputs::check`]
/// read off them).
#[derive(Clone, Copy)]
pub(crate) struct Inputs<'a> {
    pub q: &'a Tensor,
    pub gate: &'a Tensor,
    pub keys: &'a Tensor,
    pub values: &'a Tensor,
    pub pos: &'a Tensor,
}

impl Inputs<'_> {
    /// Checks the tensors against each other (see the module doc) and reads the call's dims.
    pub(crate) fn check(&self) -> Result<AttnDecodeDims> {
        let (q, gate, pos) = (self.q, self.gate, self.pos);
        let (keys, values) = (self.keys, self.values);
        const OP: &str = "attn_decode";
        let (batch, q_heads, head_dim) = q
            .dims3()
            .map_err(|_| anyhow::anyhow!("{OP}: q {:?}, expected [B, Nq, Dh]", q.dims()))?;
        let (kb, kv_heads, capacity, kd) = keys.dims4().map_err(|_| {
            anyhow::anyhow!("{OP}: keys {:?}, expected [B, Nkv, cap, Dh]", keys.dims())
        })?;
        ensure!(
            kb == batch && kd == head_dim,
            "{OP}: keys {:?} do not match q {:?}",
            keys.dims(),
            q.dims()
        );
        ensure!(
            values.dims() == keys.dims(),
            "{OP}: values {:?} must match keys {:?}",
            values.dims(),
            keys.dims()
        );
        ensure!(capacity > 0, "{OP}: empty KV buffers");
        ensure!(
            keys.is_contiguous() && values.is_contiguous(),
            "{OP}: the KV buffers must be contiguous"
        );
        ensure!(
            gate.elem_count() == batch * q_heads * head_dim
                && gate.dims().first() == Some(&batch)
                && gate.dims().last() == Some(&(q_heads * head_dim)),
            "{OP}: gate {:?}, expected [{batch}, {}]",
            gate.dims(),
            q_heads * head_dim
        );
        let dtype = q.dtype();
        for (name, t) in [("gate", gate), ("keys", keys), ("values", values)] {
            ensure!(
                t.dtype() == dtype,
                "{OP}: {name} is {:?}, q {dtype:?}",
                t.dtype()
            );
        }
        ensure!(
        supports(head_dim, q_heads, kv_heads, dtype),
        "{OP}: no kernel for head dim {head_dim}, {q_heads} query heads over {kv_heads} KV heads in {dtype:?}"
    );
        ensure!(
            pos.dtype() == DType::U32 && pos.dims() == [1],
            "{OP}: pos must be a [1] u32 tensor (got {:?} {:?})",
            pos.dims(),
            pos.dtype()
        );
        for t in [gate, keys, values, pos] {
            ensure!(
                t.device().same_device(q.device()),
                "{OP}: all inputs must be on one device"
            );
        }
        Ok(AttnDecodeDims {
            batch,
            q_heads,
            kv_heads,
            head_dim,
            capacity,
        })
    }
}
