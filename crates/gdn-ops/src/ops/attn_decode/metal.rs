//! Metal host side of `kernels/attn_decode.metal`: a threadgroup of [`SIMDGROUPS`]
//! simdgroups per (query head, sequence), or per (query head, sequence, key range) and a
//! combine pass when the context is split ([`AttnDecodeDims::splits`]).
//!
//! The geometry here is what `kernels/emu/attn_decode_harness.cpp` emulates; change both
//! together.

use super::{AttnDecodeDims, Inputs, SIMDGROUPS};
use crate::backend::dtype_tag;
use crate::backend::metal::{
    encode, metal_buffer, metal_device, metal_source, new_output, output, pipeline, Binding,
    KernelSource,
};
use anyhow::Result;
use candle_core::{DType, Tensor};
use objc2_metal::MTLSize;

const SOURCE: KernelSource = metal_source!("attn_decode.metal", "params/attn_decode.h");

pub(crate) fn attn_decode(d: AttnDecodeDims, inputs: &Inputs) -> Result<Tensor> {
    const OP: &str = "attn_decode";
    let dev = &metal_device(inputs.q, OP)?;
    let dtype = inputs.q.dtype();
    let tag = dtype_tag(dtype, OP)?;
    let splits = d.splits();
    // Before the encoder is taken: candle ops lock the same command state.
    let (q, gate) = (inputs.q.contiguous()?, inputs.gate.contiguous()?);
    let (keys, values, pos) = (inputs.keys, inputs.values, inputs.pos);
    let len = d.batch * d.q_heads * d.head_dim;
    let out = new_output(dev, len, dtype, "attn_decode_out")?;
    let [qb, gb, kb, vb, pb] = [&q, &gate, keys, values, pos].map(|t| metal_buffer(t, OP));
    let (qb, gb, kb, vb, pb) = (qb?, gb?, kb?, vb?, pb?);
    let ob = (out.as_ref().clone(), 0);
    let params = d.params(SIMDGROUPS, splits);
    let threadgroup = MTLSize {
        width: 32,
        height: SIMDGROUPS,
        depth: 1,
    };
    let heads = |depth| MTLSize {
        width: d.q_heads,
        height: d.batch,
        depth,
    };
    if splits == 1 {
        let single = pipeline(dev, &SOURCE, &format!("attn_decode_{tag}"))?;
        encode(
            dev,
            &single,
            &[
                Binding::Read(&qb),
                Binding::Read(&gb),
                Binding::Read(&kb),
                Binding::Read(&vb),
                Binding::Read(&pb),
                Binding::Write(&ob),
            ],
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
        let rb = (partials.as_ref().clone(), 0);
        let split = pipeline(dev, &SOURCE, &format!("attn_decode_split_{tag}"))?;
        encode(
            dev,
            &split,
            &[
                Binding::Read(&qb),
                Binding::Read(&kb),
                Binding::Read(&vb),
                Binding::Read(&pb),
                Binding::Write(&rb),
            ],
            &params,
            heads(splits),
            threadgroup,
            d.scratch_bytes(SIMDGROUPS),
        )?;
        let combine = pipeline(dev, &SOURCE, &format!("attn_decode_combine_{tag}"))?;
        encode(
            dev,
            &combine,
            &[Binding::Read(&rb), Binding::Read(&gb), Binding::Write(&ob)],
            &params,
            heads(1),
            MTLSize {
                width: 32,
                height: 1,
                depth: 1,
            },
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
