//! Metal host side of `kernels/gdn_conv_prep.metal`: binding and launch geometry. The
//! geometry here is what `kernels/emu/gdn_conv_prep_harness.cpp` emulates; change both
//! together.

use super::{supports, ConvPrepOut, Inputs};
use crate::backend::kernel_instance;
use crate::backend::metal::{
    encode, from_start, metal_buffer_of_view, metal_buffers, metal_device, metal_source,
    new_output, output, pipeline, size, Binding, KernelSource,
};
use anyhow::{ensure, Result};
use candle_core::DType;

const SOURCE: KernelSource = metal_source!("gdn_conv_prep.metal", "params/gdn_conv_prep.h");

/// Simdgroups (head slots) per threadgroup.
pub const SLOTS_PER_THREADGROUP: usize = 4;

pub(crate) fn gdn_conv_prep(inputs: &Inputs) -> Result<ConvPrepOut> {
    const OP: &str = "gdn_conv_prep";
    let dev = &metal_device(inputs.conv_state, OP)?;
    let dtype = inputs.qkv.dtype();
    ensure!(
        supports(&inputs.dims, dtype),
        "{OP}: no Metal kernel for {:?} in {dtype:?} (head dims multiples of 32 up to 256, 2 to 8 taps)",
        inputs.dims
    );
    let name = kernel_instance("gdn_conv_prep", &[dtype], OP)?;
    let pipeline = pipeline(dev, &SOURCE, &name)?;
    let params = inputs.params()?;
    let d = inputs.dims;
    let (bn, s) = (inputs.batch, inputs.tokens);
    let rows = bn * s;
    let qk_len = rows * d.key_heads * d.key_dim;
    let v_len = rows * d.value_heads * d.value_dim;
    let gate_len = rows * d.value_heads;
    let q = new_output(dev, qk_len, dtype, "gdn_conv_prep_q")?;
    let k = new_output(dev, qk_len, dtype, "gdn_conv_prep_k")?;
    let v = new_output(dev, v_len, dtype, "gdn_conv_prep_v")?;
    let g = new_output(dev, gate_len, DType::F32, "gdn_conv_prep_g")?;
    let beta = new_output(dev, gate_len, DType::F32, "gdn_conv_prep_beta")?;
    // A decode step shifts the state in place (each element read, then written, by one
    // thread). A chunk's tokens all read the old state: the last token's simdgroups write the
    // new one to its own buffer.
    let fresh_state = if s > 1 {
        let n = inputs.conv_state.elem_count();
        Some(new_output(dev, n, dtype, "gdn_conv_prep_state")?)
    } else {
        None
    };
    {
        // qkv, b and a may be views: their row layouts were checked by the caller.
        let qkv = metal_buffer_of_view(inputs.qkv, OP)?;
        let b = metal_buffer_of_view(inputs.b, OP)?;
        let a = metal_buffer_of_view(inputs.a, OP)?;
        let [state, taps, dt_bias, neg_a_exp] = metal_buffers(
            [
                inputs.conv_state,
                inputs.taps,
                inputs.dt_bias,
                inputs.neg_a_exp,
            ],
            OP,
        )?;
        let outs = [&q, &k, &v, &g, &beta].map(|o| from_start(o));
        let next = match &fresh_state {
            Some(buffer) => from_start(buffer),
            None => state.clone(),
        };
        encode(
            dev,
            &pipeline,
            &[
                Binding::Read(&qkv),
                Binding::Read(&b),
                Binding::Read(&a),
                // Declared as written for a decode step, whose shift is in place, so that
                // later readers wait.
                if fresh_state.is_some() {
                    Binding::Read(&state)
                } else {
                    Binding::Write(&state)
                },
                Binding::Write(&next),
                Binding::Read(&taps),
                Binding::Read(&dt_bias),
                Binding::Read(&neg_a_exp),
                Binding::Write(&outs[0]),
                Binding::Write(&outs[1]),
                Binding::Write(&outs[2]),
                Binding::Write(&outs[3]),
                Binding::Write(&outs[4]),
            ],
            &params,
            size(s, d.slots().div_ceil(SLOTS_PER_THREADGROUP), bn),
            size(32, SLOTS_PER_THREADGROUP, 1),
            0,
        )?;
    }
    let qk_shape = (bn, s, d.key_heads, d.key_dim);
    Ok(ConvPrepOut {
        q: output(dev, q, qk_shape, dtype),
        k: output(dev, k, qk_shape, dtype),
        v: output(dev, v, (bn, s, d.value_heads, d.value_dim), dtype),
        g: output(dev, g, (bn, s, d.value_heads), DType::F32),
        beta: output(dev, beta, (bn, s, d.value_heads), DType::F32),
        conv_state: match fresh_state {
            Some(buffer) => output(dev, buffer, inputs.conv_state.dims(), dtype),
            None => inputs.conv_state.clone(),
        },
    })
}
