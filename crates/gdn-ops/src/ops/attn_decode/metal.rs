//! Metal host side of `kernels/attn_decode.metal`: a threadgroup of [`SIMDGROUPS`]
//! simdgroups per (query head, sequence).
//!
//! The geometry here is what `kernels/emu/attn_decode_harness.cpp` emulates; change both
//! together.

use super::{AttnDecodeDims, SIMDGROUPS};
use crate::backend::dtype_tag;
use crate::backend::metal::{
    encode, metal_buffer, metal_device, new_output, output, pipeline, Binding, KernelSource,
};
use anyhow::Result;
use candle_core::Tensor;
use objc2_metal::MTLSize;

const SOURCE: KernelSource = KernelSource {
    file: "kernels/attn_decode.metal",
    text: include_str!("../../../../../kernels/attn_decode.metal"),
    headers: &[(
        "params/attn_decode.h",
        include_str!("../../../../../kernels/params/attn_decode.h"),
    )],
};

pub(crate) fn attn_decode(
    d: AttnDecodeDims,
    q: &Tensor,
    gate: &Tensor,
    keys: &Tensor,
    values: &Tensor,
    pos: &Tensor,
) -> Result<Tensor> {
    const OP: &str = "attn_decode";
    let dev = &metal_device(q, OP)?;
    let dtype = q.dtype();
    let pipeline = pipeline(
        dev,
        &SOURCE,
        &format!("attn_decode_{}", dtype_tag(dtype, OP)?),
    )?;
    // Before the encoder is taken: candle ops lock the same command state.
    let (q, gate) = (q.contiguous()?, gate.contiguous()?);
    let len = d.batch * d.q_heads * d.head_dim;
    let out = new_output(dev, len, dtype, "attn_decode_out")?;
    let [qb, gb, kb, vb, pb] = [&q, &gate, keys, values, pos].map(|t| metal_buffer(t, OP));
    let (qb, gb, kb, vb, pb) = (qb?, gb?, kb?, vb?, pb?);
    let ob = (out.as_ref().clone(), 0);
    encode(
        dev,
        &pipeline,
        &[
            Binding::Read(&qb),
            Binding::Read(&gb),
            Binding::Read(&kb),
            Binding::Read(&vb),
            Binding::Read(&pb),
            Binding::Write(&ob),
        ],
        &d.params(SIMDGROUPS),
        MTLSize {
            width: d.q_heads,
            height: d.batch,
            depth: 1,
        },
        MTLSize {
            width: 32,
            height: SIMDGROUPS,
            depth: 1,
        },
        d.scratch_bytes(SIMDGROUPS),
    )?;
    Ok(output(
        dev,
        out,
        (d.batch, 1, d.q_heads * d.head_dim),
        dtype,
    ))
}
