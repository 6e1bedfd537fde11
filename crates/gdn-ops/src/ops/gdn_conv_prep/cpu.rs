//! The CPU twin of `kernels/gdn_conv_prep.{metal,cu}`: the same function in f32, rounding to
//! the activation dtype exactly where the spec does (the SiLU output, q and k), token by
//! token over a chunk in the decode step's order.

use super::{qk_scales, ConvPrepOut, Inputs, NORM_EPS};
use crate::backend::f32_values;
use anyhow::Result;
use candle_core::{CpuStorage, DType, InplaceOp1, Layout, Tensor};
use half::{bf16, f16};

/// An activation dtype: the conv state is stored in it, and results are rounded to it.
trait Act: Copy {
    fn to_f32(self) -> f32;
    fn from_f32(x: f32) -> Self;
    fn round(x: f32) -> f32 {
        Self::from_f32(x).to_f32()
    }
}

impl Act for f32 {
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(x: f32) -> Self {
        x
    }
}

impl Act for f16 {
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    fn from_f32(x: f32) -> Self {
        f16::from_f32(x)
    }
}

impl Act for bf16 {
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    fn from_f32(x: f32) -> Self {
        bf16::from_f32(x)
    }
}

/// `log(1 + e^−|x|) + max(x, 0)`, stable for large |x|.
pub(crate) fn softplus(x: f32) -> f32 {
    x.max(0.0) + (-x.abs()).exp().ln_1p()
}

pub(crate) fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// The chunk's outputs in f32 (already rounded to the activation dtype where the spec says).
#[derive(Default)]
struct Outputs {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
    beta: Vec<f32>,
    /// `[B, K−1, C]`: the state after the chunk (values of `InT`, so exact in it).
    state: Vec<f32>,
}

/// The inputs as f32 values in logical order.
struct Values {
    /// `[B, S, C]`, gathered from the rows of qkv.
    qkv: Vec<f32>,
    /// `[B, S, Hv]`.
    b: Vec<f32>,
    a: Vec<f32>,
    /// `[B, K−1, C]`.
    state: Vec<f32>,
    taps: Vec<f32>,
    dt_bias: Vec<f32>,
    neg_a_exp: Vec<f32>,
}

/// Every token of every batch row, as the kernels compute it: each token's window is rows
/// `t .. t+K` of `[conv_state; qkv]`, summed oldest first, the decode step's order.
fn compute<T: Act>(inputs: &Inputs, x: &Values) -> Outputs {
    let d = inputs.dims;
    let (batch, s, c, kk) = (inputs.batch, inputs.tokens, d.channels(), d.kernel_size);
    let (hk, dk, hv, dv) = (d.key_heads, d.key_dim, d.value_heads, d.value_dim);
    let history = kk - 1;
    let qk = hk * dk;
    let (q_scale, k_scale) = qk_scales(dk);
    let mut out = Outputs::default();
    let mut act = vec![0f32; c];
    for bi in 0..batch {
        let state = &x.state[bi * history * c..(bi + 1) * history * c];
        let rows = &x.qkv[bi * s * c..(bi + 1) * s * c];
        // Row `p` of [conv_state; qkv].
        let padded = |p: usize| -> &[f32] {
            if p < history {
                &state[p * c..(p + 1) * c]
            } else {
                &rows[(p - history) * c..(p - history + 1) * c]
            }
        };
        for t in 0..s {
            for (ch, act) in act.iter_mut().enumerate() {
                let mut conv = 0f32;
                for m in 0..kk {
                    conv += padded(t + m)[ch] * x.taps[m * c + ch];
                }
                *act = T::round(silu(conv));
            }
            for (heads, scale, dst) in [
                (&act[..qk], q_scale, &mut out.q),
                (&act[qk..2 * qk], k_scale, &mut out.k),
            ] {
                for head in heads.chunks_exact(dk) {
                    let mean = head.iter().map(|x| x * x).sum::<f32>() / dk as f32;
                    let inv_rms = 1.0 / (mean + NORM_EPS).sqrt();
                    dst.extend(head.iter().map(|x| T::round(x * inv_rms * scale)));
                }
            }
            out.v.extend_from_slice(&act[2 * qk..2 * qk + hv * dv]);
            let gates = (bi * s + t) * hv;
            for h in 0..hv {
                let a = x.a[gates + h] + x.dt_bias[h];
                out.g.push((x.neg_a_exp[h] * softplus(a)).exp());
                out.beta.push(1.0 / (1.0 + (-x.b[gates + h]).exp()));
            }
        }
        for p in s..s + history {
            out.state.extend_from_slice(padded(p));
        }
    }
    out
}

/// Writes values of the activation dtype into the conv state in place (a decode step).
struct Store<'a>(&'a [f32]);

impl Store<'_> {
    fn write<T: Act>(&self, dst: &mut [T]) {
        for (d, &v) in dst.iter_mut().zip(self.0) {
            *d = T::from_f32(v);
        }
    }
}

impl InplaceOp1 for Store<'_> {
    fn name(&self) -> &'static str {
        "gdn-conv-prep-state"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> candle_core::Result<()> {
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("gdn_conv_prep: conv_state must be contiguous")
        };
        match storage {
            CpuStorage::F32(s) => self.write(&mut s[start..end]),
            CpuStorage::F16(s) => self.write(&mut s[start..end]),
            CpuStorage::BF16(s) => self.write(&mut s[start..end]),
            _ => candle_core::bail!("gdn_conv_prep: conv_state must be f32, f16 or bf16"),
        }
        Ok(())
    }
}

pub(crate) fn gdn_conv_prep(inputs: &Inputs) -> Result<ConvPrepOut> {
    let values = Values {
        qkv: f32_values(inputs.qkv)?,
        b: f32_values(inputs.b)?,
        a: f32_values(inputs.a)?,
        state: f32_values(inputs.conv_state)?,
        taps: f32_values(inputs.taps)?,
        dt_bias: f32_values(inputs.dt_bias)?,
        neg_a_exp: f32_values(inputs.neg_a_exp)?,
    };
    let dtype = inputs.qkv.dtype();
    let out = match dtype {
        DType::F16 => compute::<f16>(inputs, &values),
        DType::BF16 => compute::<bf16>(inputs, &values),
        _ => compute::<f32>(inputs, &values),
    };
    let d = inputs.dims;
    let (bn, s, dev) = (inputs.batch, inputs.tokens, inputs.qkv.device());
    let act = |v: Vec<f32>, shape: &[usize]| -> Result<Tensor> {
        Ok(Tensor::from_vec(v, shape, dev)?.to_dtype(dtype)?)
    };
    // One token: the decode step's contract, the state advanced in place. More: the input
    // stays as it was (the caller may still hold it) and the new state is a new tensor.
    let conv_state = if s == 1 {
        inputs.conv_state.inplace_op1(&Store(&out.state))?;
        inputs.conv_state.clone()
    } else {
        act(out.state, inputs.conv_state.dims())?
    };
    Ok(ConvPrepOut {
        q: act(out.q, &[bn, s, d.key_heads, d.key_dim])?,
        k: act(out.k, &[bn, s, d.key_heads, d.key_dim])?,
        v: act(out.v, &[bn, s, d.value_heads, d.value_dim])?,
        g: Tensor::from_vec(out.g, (bn, s, d.value_heads), dev)?,
        beta: Tensor::from_vec(out.beta, (bn, s, d.value_heads), dev)?,
        conv_state,
    })
}
