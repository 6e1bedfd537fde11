//! CUDA host side of `attn_decode_slots_*` and `attn_decode_combine_slots_*`
//! (kernels/attn_decode.cu): the table of each sequence's KV buffers, position, capacity, key
//! ranges and passes (what its own launch would choose, [`passes`]), uploaded on candle's
//! stream; a grid over (query heads, sequences, the most ranges of any sequence), then the
//! combine over the sequences that split.

use super::{passes, SlotInputs, SLOT_WORDS};
use crate::backend::cuda::{
    config, cuda_device, cuda_source, launch, slot_table, tensor, with_float_type, Element, Held,
    HeldKv, Kernel, KernelSource,
};
use crate::ops::attn_decode::{AttnDecodeDims, SIMDGROUPS};
use anyhow::{ensure, Result};
use candle_core::cuda_backend::cudarc::driver::PushKernelArg;
use candle_core::{CudaDevice, Tensor};

const OP: &str = "attn_decode_slots";
const SOURCE: KernelSource = cuda_source!("attn_decode");

pub(crate) fn attn_decode_slots(inputs: &SlotInputs) -> Result<Tensor> {
    let dev = cuda_device(inputs.q, OP)?;
    ensure!(
        inputs.rows.len() <= 65535,
        "{OP}: at most 65535 sequences per call"
    );
    let (q, gate) = (inputs.q.contiguous()?, inputs.gate.contiguous()?);
    with_float_type!(q.dtype(), OP, |T| run::<T>(inputs, &q, &gate, &dev))
}

fn run<T>(inputs: &SlotInputs, q: &Tensor, gate: &Tensor, dev: &CudaDevice) -> Result<Tensor>
where
    T: Element,
{
    let n = inputs.rows.len();
    let elem = std::mem::size_of::<T>();
    let first = inputs.rows[0].0;
    let most_splits = inputs
        .rows
        .iter()
        .map(|(d, _)| d.splits())
        .max()
        .unwrap_or(1);
    let most_capacity = inputs
        .rows
        .iter()
        .map(|(d, _)| d.capacity)
        .max()
        .unwrap_or(1);
    let d = AttnDecodeDims {
        batch: n,
        capacity: most_capacity,
        ..first
    };
    let kernel = |name: &str| Kernel::typed(dev, &SOURCE, name, &[T::DTYPE], OP);
    let len = n * d.q_heads * d.head_dim;
    // SAFETY: each sequence's blocks (its one pass, or its combine) write its rows of out.
    let out = unsafe { dev.alloc::<T>(len)? };
    // SAFETY: each split sequence's blocks write every one of its records before its combine
    // reads them; the records of ranges past a sequence's own are never read.
    let partials = unsafe { dev.alloc::<f32>(d.partial_len(most_splits))? };
    {
        // Every sequence's buffers and position stay read-locked until the launches are
        // queued; they are only read.
        let kv = HeldKv::new(inputs.rows.iter().map(|(_, r)| [r.keys, r.values, r.pos]));
        let mut table = Vec::with_capacity(SLOT_WORDS * n);
        for ((rd, r), [k, v, p]) in inputs.rows.iter().zip(kv.addresses::<T>(dev, OP)?) {
            // The kernel reads each lane's keys and values in 16- or 8-byte loads.
            for (name, t) in [("keys", r.keys), ("values", r.values)] {
                ensure!(
                    (t.layout().start_offset() * elem).is_multiple_of(16),
                    "{OP}: {name} must start on a 16-byte boundary"
                );
            }
            let (cap, splits) = (rd.capacity as u64, rd.splits() as u64);
            table.extend([k, v, p, cap, splits, passes(*rd, elem)]);
        }
        let slots = slot_table(dev, &table)?;
        let [q, gate] = [q, gate].map(Held::new);
        let (q, gate) = (q.view::<T>(OP)?, gate.view::<T>(OP)?);
        let params = d.params(SIMDGROUPS, most_splits);
        let first_pass = kernel("attn_decode_slots")?;
        let mut args = first_pass.args();
        args.arg(&q)
            .arg(&gate)
            .arg(slots.as_ref())
            .arg(&partials)
            .arg(&out)
            .arg(&params);
        let geometry = config(
            (d.q_heads as u32, n as u32, most_splits as u32),
            (32, SIMDGROUPS as u32, 1),
            d.scratch_bytes(SIMDGROUPS),
        );
        // SAFETY: arguments in the order and types of `attn_decode_slots_*` in
        // kernels/attn_decode.cu; each table row addresses its sequence's whole contiguous
        // [1, Nkv, cap, Dh] buffers (cap its own, checked per row) and its [1] u32 position;
        // partials holds B·Nq·most_splits·(2 + Dh) floats, the shared memory SIMDGROUPS ·
        // (2 + Dh) floats, as the per-sequence launch's.
        unsafe { launch(args, geometry) }?;
        if most_splits > 1 {
            let combine = kernel("attn_decode_combine_slots")?;
            let mut args = combine.args();
            args.arg(&partials)
                .arg(&gate)
                .arg(slots.as_ref())
                .arg(&out)
                .arg(&params);
            let heads = config(
                (d.q_heads as u32, n as u32, 1),
                (d.head_dim as u32, 1, 1),
                0,
            );
            // SAFETY: arguments of `attn_decode_combine_slots_*`, on blocks of Dh <= 256
            // threads, reading the records written above on the same stream.
            unsafe { launch(args, heads) }?;
        }
    }
    Ok(tensor(out, dev, (n, 1, d.q_heads * d.head_dim)))
}
