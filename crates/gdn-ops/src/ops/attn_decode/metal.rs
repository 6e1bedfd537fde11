//! Metal host side of `kernels/attn_decode.metal`: a threadgroup of [`SIMDGROUPS`]
//! simdgroups per (query head, sequence), or per (query head, sequence, key range) and a
//! combine pass when the context is split ([`AttnDecodeDims::splits`]).
//!
//! The geometry here is what `kernels/emu/attn_decode_harness.cpp` emulates; change both
//! together.

use super::{AttnDecodeDims, Inputs, SIMDGROUPS};
use crate::backend::kernel_instance;
use crate::backend::metal::{
    encode, from_start, metal_buffers, metal_device, metal_source, new_output, output, pipeline,
    reads_then_writes, size, KernelSource,
};
use anyhow::Result;
use candle_core::{DType, Tensor};

const SOURCE: KernelSource = metal_source!("attn_decode.metal", "params/attn_decode.h");

pub(crate) fn attn_decode(d: AttnDecodeDims, inputs: &Inputs) -> Result<Tensor> {
    const OP: &str = "attn_decode";
    let dev = &metal_device(inputs.q, OP)?;
    let dtype = inputs.q.dtype();
    let pipeline_for =
        |kernel: &str| pipeline(dev, &SOURCE, &kernel_instance(kernel, &[dtype], OP)?);
    let splits = d.splits();
    // Before the encoder is taken: candle ops lock the same command state.
    let (q, gate) = (inputs.q.contiguous()?, inputs.gate.contiguous()?);
    let (keys, values, pos) = (inputs.keys, inputs.values, inputs.pos);
    let len = d.batch * d.q_heads * d.head_dim;
    let out = new_output(dev, len, dtype, "attn_decode_out")?;
    let [qb, gb, kb, vb, pb] = metal_buffers([&q, &gate, keys, values, pos], OP)?;
    let ob = from_start(&out);
    let params = d.params(SIMDGROUPS, splits);
    let threadgroup = size(32, SIMDGROUPS, 1);
    let heads = |depth| size(d.q_heads, d.batch, depth);
    if splits == 1 {
        let single = pipeline_for("attn_decode")?;
        encode(
            dev,
            &single,
            &reads_then_writes(&[&qb, &gb, &kb, &vb, &pb], &[&ob]),
            &params,
            heads(1),
            threadgroup,
            d.scratch_bytes(SIMDGROUPS),
        )?;
    } else {
        let partials = new_output(
            dev,
            d.partial_len(splits),
            DType::F32,
            "attn_decode_partials",
        )?;
        let rb = from_start(&partials);
        let split = pipeline_for("attn_decode_split")?;
        encode(
            dev,
            &split,
            &reads_then_writes(&[&qb, &kb, &vb, &pb], &[&rb]),
            &params,
            heads(splits),
            threadgroup,
            d.scratch_bytes(SIMDGROUPS),
        )?;
        let combine = pipeline_for("attn_decode_combine")?;
        encode(
            dev,
            &combine,
            &reads_then_writes(&[&rb, &gb], &[&ob]),
            &params,
            heads(1),
            size(32, 1, 1),
            0,
        )?;
    }
    Ok(output(
        dev,
        out,
        (d.batch, 1, d.q_heads * d.head_dim),
        dtype,
    ))
}
