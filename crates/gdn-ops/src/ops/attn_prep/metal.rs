//! Metal host side of `kernels/attn_prep.metal`: one simdgroup per head task.
//!
//! The geometry here is what `kernels/emu/attn_prep_harness.cpp` emulates; change both
//! together.

use super::{AttnPrepDims, Inputs};
use crate::backend::dtype_tag;
use crate::backend::metal::{
    encode, metal_buffer, metal_device, metal_source, new_output, output, pipeline, Binding,
    KernelSource,
};
use anyhow::Result;
use candle_core::Tensor;
use objc2_metal::MTLSize;

const SOURCE: KernelSource = metal_source!("attn_prep.metal", "params/attn_prep.h");

pub(crate) fn attn_prep(d: AttnPrepDims, inputs: &Inputs) -> Result<(Tensor, Tensor)> {
    const OP: &str = "attn_prep";
    let dev = &metal_device(inputs.qkv, OP)?;
    let dtype = inputs.qkv.dtype();
    let pipeline = pipeline(
        dev,
        &SOURCE,
        &format!("attn_prep_{}", dtype_tag(dtype, OP)?),
    )?;
    // Before the encoder is taken: candle ops lock the same command state.
    let qkv = inputs.qkv.contiguous()?;
    let (q_norm, k_norm) = (inputs.q_norm.contiguous()?, inputs.k_norm.contiguous()?);
    let inv_freq = inputs.inv_freq.contiguous()?;
    let (pos, keys, values) = (inputs.pos, inputs.keys, inputs.values);
    let q_len = d.batch * d.q_heads * d.head_dim;
    let q = new_output(dev, q_len, dtype, "attn_prep_q")?;
    let gate = new_output(dev, q_len, dtype, "attn_prep_gate")?;
    let [xb, qnb, knb, fb, pb, kb, vb] =
        [&qkv, &q_norm, &k_norm, &inv_freq, pos, keys, values].map(|t| metal_buffer(t, OP));
    let (xb, qnb, knb, fb, pb, kb, vb) = (xb?, qnb?, knb?, fb?, pb?, kb?, vb?);
    let (qb, gb) = ((q.as_ref().clone(), 0), (gate.as_ref().clone(), 0));
    encode(
        dev,
        &pipeline,
        &[
            Binding::Read(&xb),
            Binding::Read(&qnb),
            Binding::Read(&knb),
            Binding::Read(&fb),
            Binding::Read(&pb),
            // Written in place: declared as written so that later readers wait for them.
            Binding::Write(&kb),
            Binding::Write(&vb),
            Binding::Write(&qb),
            Binding::Write(&gb),
        ],
        &d.params(inputs.eps),
        MTLSize {
            width: d.q_heads + 2 * d.kv_heads,
            height: d.batch,
            depth: 1,
        },
        MTLSize {
            width: 32,
            height: 1,
            depth: 1,
        },
        0,
    )?;
    Ok((
        output(dev, q, (d.batch, d.q_heads, d.head_dim), dtype),
        output(dev, gate, (d.batch, d.q_heads * d.head_dim), dtype),
    ))
}
