//! CUDA host side of `kernels/attn_decode.cu`: a block of [`SIMDGROUPS`] warps per (query
//! head, sequence), or per (query head, sequence, key range) and a combine pass when the
//! context is split ([`AttnDecodeDims::splits`]); long contexts take the split passes
//! [`SplitPasses`] picks.

use super::long_context::SplitPasses;
use super::{AttnDecodeDims, AttnDecodeParams, Inputs, SIMDGROUPS};
use crate::backend::cuda::{
    config, cuda_device, cuda_source, launch, tensor, with_float_type, Element, Held, Kernel,
    KernelSource,
};
use anyhow::{ensure, Result};
use candle_core::cuda_backend::cudarc::driver::{DeviceRepr, PushKernelArg};
use candle_core::{CudaDevice, Tensor};

const OP: &str = "attn_decode";
const SOURCE: KernelSource = cuda_source!("attn_decode");

// SAFETY: `AttnDecodeParams` is `repr(C)` of seven u32 and an f32, as the kernel's struct.
unsafe impl DeviceRepr for AttnDecodeParams {}

pub(crate) fn attn_decode(d: AttnDecodeDims, inputs: &Inputs) -> Result<Tensor> {
    let dev = cuda_device(inputs.q, OP)?;
    ensure!(d.batch <= 65535, "{OP}: at most 65535 sequences per call");
    let (q, gate) = (inputs.q.contiguous()?, inputs.gate.contiguous()?);
    let inputs = [&q, &gate, inputs.keys, inputs.values, inputs.pos];
    with_float_type!(q.dtype(), OP, |T| run::<T>(d, inputs, &dev))
}

/// `inputs`: q, gate, keys, values, pos (contiguous).
fn run<T>(d: AttnDecodeDims, inputs: [&Tensor; 5], dev: &CudaDevice) -> Result<Tensor>
where
    T: Element,
{
    let [_, _, keys, values, _] = inputs;
    // The kernel reads each lane's keys and values in 16- or 8-byte loads.
    for (name, t) in [("keys", keys), ("values", values)] {
        ensure!(
            (t.layout().start_offset() * std::mem::size_of::<T>()).is_multiple_of(16),
            "{OP}: {name} must start on a 16-byte boundary"
        );
    }
    let kernel = |name: &str| Kernel::typed(dev, &SOURCE, name, &[T::DTYPE], OP);
    let len = d.batch * d.q_heads * d.head_dim;
    // SAFETY: the kernel (or the combine pass) writes every element of out.
    let out = unsafe { dev.alloc::<T>(len)? };
    let splits = d.splits();
    {
        let [q, gate, keys, values, pos] = inputs.map(Held::new);
        let q_view = q.view::<T>(OP)?;
        let g_view = gate.view::<T>(OP)?;
        let k_view = keys.view::<T>(OP)?;
        let v_view = values.view::<T>(OP)?;
        let p_view = pos.view::<u32>(OP)?;
        let params = d.params(SIMDGROUPS, splits);
        // Blocks of SIMDGROUPS warps over (query heads / heads a block, sequences, ranges).
        let blocks = |heads_per_block: usize| {
            config(
                (
                    (d.q_heads / heads_per_block) as u32,
                    d.batch as u32,
                    splits as u32,
                ),
                (32, SIMDGROUPS as u32, 1),
                d.scratch_bytes(SIMDGROUPS),
            )
        };
        if splits == 1 {
            let single = kernel("attn_decode")?;
            let mut args = single.args();
            args.arg(&q_view)
                .arg(&g_view)
                .arg(&k_view)
                .arg(&v_view)
                .arg(&p_view)
                .arg(&out)
                .arg(&params);
            // SAFETY: arguments in the order and types of `attn_decode_*` in
            // kernels/attn_decode.cu; the views cover the shapes checked in
            // ops/attn_decode/mod.rs, and the shared memory holds SIMDGROUPS * (2 + Dh) floats.
            unsafe { launch(args, blocks(1)) }?;
        } else {
            // SAFETY: the split pass writes every record (an empty range its neutral one).
            let partials = unsafe { dev.alloc::<f32>(d.partial_len(splits))? };
            let passes = SplitPasses::for_dims(d, std::mem::size_of::<T>()).kernels(d.head_dim);
            let split = kernel(passes.split)?;
            let mut args = split.args();
            args.arg(&q_view)
                .arg(&k_view)
                .arg(&v_view)
                .arg(&p_view)
                .arg(&partials)
                .arg(&params);
            // SAFETY: arguments of `attn_decode_split_*` (the long-context passes take the
            // same); grid depth = params.splits, heads_per_block divides the GQA group
            // (long_context.rs), and partials holds B·Nq·splits·(2 + Dh) floats.
            unsafe { launch(args, blocks(passes.heads_per_block)) }?;
            let combine = kernel(passes.combine)?;
            let mut args = combine.args();
            args.arg(&partials).arg(&g_view).arg(&out).arg(&params);
            let heads = config(
                (d.q_heads as u32, d.batch as u32, 1),
                (passes.combine_threads as u32, 1, 1),
                0,
            );
            // SAFETY: arguments of `attn_decode_combine_*` (and of the wide one, on blocks of
            // Dh <= 256 threads), reading the records written above on the same stream.
            unsafe { launch(args, heads) }?;
        }
    }
    Ok(tensor(out, dev, (d.batch, 1, d.q_heads * d.head_dim)))
}
