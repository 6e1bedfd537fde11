//! Metal host side of `kernels/hyper_connection.metal`: `hc_inject_norm` one threadgroup per
//! stream row, `hc_act` and `hc_mix` one thread per output value, `hc_up_mix` one simdgroup
//! per output value.
//!
//! The geometry here is what `kernels/emu/hyper_connection_harness.cpp` emulates; change both
//! together.

use super::{row_threads, ActInputs, InjectInputs, MixInputs, MIX_THREADS};
use super::{UpMixInputs, UP_MIX_WARPS};
use crate::backend::kernel_instance;
use crate::backend::metal::{
    encode, from_start, metal_buffer, metal_buffer_or, metal_device, metal_source, new_output,
    output, pipeline, reads_then_writes, size, KernelSource,
};
use anyhow::Result;
use candle_core::Tensor;

const SOURCE: KernelSource = metal_source!("hyper_connection.metal", "params/hyper_connection.h");

pub(crate) fn hc_inject_norm(inputs: &InjectInputs) -> Result<(Option<Tensor>, Option<Tensor>)> {
    const OP: &str = "hc_inject_norm";
    let p = &inputs.params;
    let dtype = inputs.hs.dtype();
    let dev = metal_device(&inputs.hs, OP)?;
    let name = kernel_instance("hc_inject_norm", &[dtype], OP)?;
    let pipeline = pipeline(&dev, &SOURCE, &name)?;
    let (rows, cols) = ((p.tokens * p.streams) as usize, p.cols as usize);
    let len = rows * cols;
    let sum = match inputs.inject {
        Some(_) => Some(new_output(&dev, len, dtype, "hc_inject_norm_sum")?),
        None => None,
    };
    let normed = match inputs.weight {
        Some(_) => Some(new_output(&dev, len, dtype, "hc_inject_norm_normed")?),
        None => None,
    };
    let hs = metal_buffer(&inputs.hs, OP)?;
    // The buffers a call does not use are never touched; `hs` and the other output are bound
    // there so that every slot holds a buffer.
    let y = metal_buffer_or(inputs.inject.as_ref().map(|(y, _)| y), &hs, OP)?;
    let gate = metal_buffer_or(inputs.inject.as_ref().map(|(_, g)| g), &hs, OP)?;
    let weight = metal_buffer_or(inputs.weight.as_ref(), &hs, OP)?;
    let slot_weights = metal_buffer_or(inputs.slot_weights.as_ref(), &hs, OP)?;
    let sum_out = sum.as_deref().map(from_start);
    let normed_out = normed.as_deref().map(from_start);
    let (sum_slot, normed_slot) = match (&sum_out, &normed_out) {
        (Some(s), Some(n)) => (s, n),
        (Some(s), None) => (s, s),
        (None, Some(n)) => (n, n),
        (None, None) => anyhow::bail!("{OP}: neither an injection nor a norm"),
    };
    encode(
        &dev,
        &pipeline,
        &reads_then_writes(
            &[&hs, &y, &gate, &weight, &slot_weights],
            &[sum_slot, normed_slot],
        ),
        p,
        size(rows, 1, 1),
        size(row_threads(cols), 1, 1),
        // One partial sum of squares per simdgroup, 32 at most.
        32 * std::mem::size_of::<f32>(),
    )?;
    let shape = inputs.hs.shape().clone();
    Ok((
        sum.map(|b| output(&dev, b, shape.clone(), dtype)),
        normed.map(|b| output(&dev, b, shape.clone(), dtype)),
    ))
}

pub(crate) fn hc_mix(inputs: &MixInputs) -> Result<Tensor> {
    const OP: &str = "hc_mix";
    let p = &inputs.params;
    let dtype = inputs.up.dtype();
    let dev = metal_device(&inputs.up, OP)?;
    let name = kernel_instance("hc_mix", &[dtype], OP)?;
    let pipeline = pipeline(&dev, &SOURCE, &name)?;
    let (tokens, cols) = (p.tokens as usize, p.cols as usize);
    let x = new_output(&dev, tokens * cols, dtype, "hc_mix_x")?;
    let up = metal_buffer(&inputs.up, OP)?;
    let normed = metal_buffer(&inputs.normed, OP)?;
    let x_out = from_start(&x);
    encode(
        &dev,
        &pipeline,
        &reads_then_writes(&[&up, &normed], &[&x_out]),
        p,
        size((tokens * cols).div_ceil(MIX_THREADS), 1, 1),
        size(MIX_THREADS, 1, 1),
        0,
    )?;
    Ok(output(&dev, x, (tokens, cols), dtype))
}

pub(crate) fn hc_act(inputs: &ActInputs) -> Result<Tensor> {
    const OP: &str = "hc_act";
    let len = inputs.params.len as usize;
    let dtype = inputs.d.dtype();
    let dev = metal_device(&inputs.d, OP)?;
    let name = kernel_instance("hc_act", &[dtype], OP)?;
    let pipeline = pipeline(&dev, &SOURCE, &name)?;
    let a = new_output(&dev, len, dtype, "hc_act_a")?;
    let d = metal_buffer(&inputs.d, OP)?;
    let a_out = from_start(&a);
    encode(
        &dev,
        &pipeline,
        &reads_then_writes(&[&d], &[&a_out]),
        &inputs.params,
        size(len.div_ceil(MIX_THREADS), 1, 1),
        size(MIX_THREADS, 1, 1),
        0,
    )?;
    Ok(output(&dev, a, len, dtype))
}

pub(crate) fn hc_up_mix(inputs: &UpMixInputs) -> Result<Tensor> {
    const OP: &str = "hc_up_mix";
    let p = &inputs.params;
    let dtype = inputs.normed.dtype();
    let dev = metal_device(&inputs.normed, OP)?;
    let name = kernel_instance("hc_up_mix", &[dtype, inputs.up.scales.dtype()], OP)?;
    let pipeline = pipeline(&dev, &SOURCE, &name)?;
    let (tokens, cols) = (p.tokens as usize, p.cols as usize);
    let x = new_output(&dev, tokens * cols, dtype, "hc_up_mix_x")?;
    let packed = metal_buffer(&inputs.up.packed, OP)?;
    let scales = metal_buffer(&inputs.up.scales, OP)?;
    let biases = metal_buffer(&inputs.up.biases, OP)?;
    let d = metal_buffer(&inputs.d, OP)?;
    let normed = metal_buffer(&inputs.normed, OP)?;
    let x_out = from_start(&x);
    encode(
        &dev,
        &pipeline,
        &reads_then_writes(&[&packed, &scales, &biases, &d, &normed], &[&x_out]),
        p,
        size(cols.div_ceil(UP_MIX_WARPS), tokens, 1),
        size(32 * UP_MIX_WARPS, 1, 1),
        // The token's R activations in f32, rounded up to Metal's 16-byte granule.
        (p.rank as usize * std::mem::size_of::<f32>()).next_multiple_of(16),
    )?;
    Ok(output(&dev, x, (tokens, cols), dtype))
}
