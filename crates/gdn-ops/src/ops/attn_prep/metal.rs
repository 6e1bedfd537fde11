//! Metal host side of `kernels/attn_prep.metal`: one simdgroup per head task.
//!
//! The geometry here is what `kernels/emu/attn_prep_harness.cpp` emulates; change both
//! together.

use super::{AttnPrepDims, Inputs};
use crate::backend::kernel_instance;
use crate::backend::metal::{
    encode, from_start, metal_buffers, metal_device, metal_source, new_output, output, pipeline,
    reads_then_writes, size, KernelSource,
};
use anyhow::Result;
use candle_core::Tensor;

const SOURCE: KernelSource = metal_source!("attn_prep.metal", "params/attn_prep.h");

pub(crate) fn attn_prep(d: AttnPrepDims, inputs: &Inputs) -> Result<(Tensor, Tensor)> {
    const OP: &str = "attn_prep";
    let dev = &metal_device(inputs.qkv, OP)?;
    let dtype = inputs.qkv.dtype();
    let name = kernel_instance("attn_prep", &[dtype], OP)?;
    let pipeline = pipeline(dev, &SOURCE, &name)?;
    // Before the encoder is taken: candle ops lock the same command state.
    let qkv = inputs.qkv.contiguous()?;
    let (q_norm, k_norm) = (inputs.q_norm.contiguous()?, inputs.k_norm.contiguous()?);
    let inv_freq = inputs.inv_freq.contiguous()?;
    let (pos, keys, values) = (inputs.pos, inputs.keys, inputs.values);
    let q_len = d.batch * d.q_heads * d.head_dim;
    let q = new_output(dev, q_len, dtype, "attn_prep_q")?;
    let gate = new_output(dev, q_len, dtype, "attn_prep_gate")?;
    let [xb, qnb, knb, fb, pb, kb, vb] =
        metal_buffers([&qkv, &q_norm, &k_norm, &inv_freq, pos, keys, values], OP)?;
    let (qb, gb) = (from_start(&q), from_start(&gate));
    // keys and values are written in place: declared as written so that later readers wait
    // for them.
    encode(
        dev,
        &pipeline,
        &reads_then_writes(&[&xb, &qnb, &knb, &fb, &pb], &[&kb, &vb, &qb, &gb]),
        &d.params(inputs.eps),
        size(d.q_heads + 2 * d.kv_heads, d.batch, 1),
        size(32, 1, 1),
        0,
    )?;
    Ok((
        output(dev, q, (d.batch, d.q_heads, d.head_dim), dtype),
        output(dev, gate, (d.batch, d.q_heads * d.head_dim), dtype),
    ))
}
