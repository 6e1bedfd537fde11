//! The CPU twin of `kernels/gdn_conv_prep.{metal,cu}`: the same function in f32, rounding to
//! the activation dtype exactly where the spec does (the SiLU output, q and k).

use super::{qk_scales, ConvPrepOut, Inputs, NORM_EPS};
use crate::backend::f32_values;
use anyhow::Result;
use candle_core::{CpuStorage, InplaceOp1, Layout, Tensor};
use half::{bf16, f16};
use std::sync::Mutex;

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

/// The step's outputs in f32 (already rounded to the activation dtype where the spec says).
#[derive(Default)]
struct Outputs {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    g: Vec<f32>,
    beta: Vec<f32>,
}

/// The whole step as an in-place op on the conv state.
struct Step<'a> {
    inputs: &'a Inputs<'a>,
    /// `[B, C]`, gathered from the rows of qkv.
    qkv: Vec<f32>,
    b: Vec<f32>,
    a: Vec<f32>,
    taps: Vec<f32>,
    dt_bias: Vec<f32>,
    neg_a_exp: Vec<f32>,
    out: Mutex<Outputs>,
}

impl Step<'_> {
    fn run<T: Act>(&self, state: &mut [T]) {
        let d = self.inputs.dims;
        let (batch, c, kk) = (self.inputs.batch, d.channels(), d.kernel_size);
        let (hk, dk, hv, dv) = (d.key_heads, d.key_dim, d.value_heads, d.value_dim);
        let qk = hk * dk;
        let (q_scale, k_scale) = qk_scales(dk);
        let mut out = Outputs::default();
        let mut act = vec![0f32; c];
        for (bi, state) in state.chunks_exact_mut((kk - 1) * c).enumerate().take(batch) {
            let x = &self.qkv[bi * c..(bi + 1) * c];
            for (ch, act) in act.iter_mut().enumerate() {
                let mut conv = 0f32;
                for m in 0..kk - 1 {
                    let s = state[m * c + ch];
                    conv += s.to_f32() * self.taps[m * c + ch];
                    if m > 0 {
                        state[(m - 1) * c + ch] = s;
                    }
                }
                conv += x[ch] * self.taps[(kk - 1) * c + ch];
                state[(kk - 2) * c + ch] = T::from_f32(x[ch]);
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
            for h in 0..hv {
                let a = self.a[bi * hv + h] + self.dt_bias[h];
                out.g.push((self.neg_a_exp[h] * softplus(a)).exp());
                out.beta.push(1.0 / (1.0 + (-self.b[bi * hv + h]).exp()));
            }
        }
        *self.out.lock().expect("output lock") = out;
    }
}

impl InplaceOp1 for Step<'_> {
    fn name(&self) -> &'static str {
        "gdn-conv-prep"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> candle_core::Result<()> {
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("gdn_conv_prep: conv_state must be contiguous")
        };
        match storage {
            CpuStorage::F32(s) => self.run(&mut s[start..end]),
            CpuStorage::F16(s) => self.run(&mut s[start..end]),
            CpuStorage::BF16(s) => self.run(&mut s[start..end]),
            _ => candle_core::bail!("gdn_conv_prep: conv_state must be f32, f16 or bf16"),
        }
        Ok(())
    }
}

pub(crate) fn gdn_conv_prep(inputs: &Inputs) -> Result<ConvPrepOut> {
    let step = Step {
        inputs,
        qkv: f32_values(inputs.qkv)?,
        b: f32_values(inputs.b)?,
        a: f32_values(inputs.a)?,
        taps: f32_values(inputs.taps)?,
        dt_bias: f32_values(inputs.dt_bias)?,
        neg_a_exp: f32_values(inputs.neg_a_exp)?,
        out: Mutex::new(Outputs::default()),
    };
    inputs.conv_state.inplace_op1(&step)?;
    let out = step
        .out
        .into_inner()
        .expect("no other holder of the output lock");
    let d = inputs.dims;
    let (bn, dtype, dev) = (inputs.batch, inputs.qkv.dtype(), inputs.qkv.device());
    let act = |v: Vec<f32>, shape: (usize, usize, usize, usize)| -> Result<Tensor> {
        Ok(Tensor::from_vec(v, shape, dev)?.to_dtype(dtype)?)
    };
    Ok(ConvPrepOut {
        q: act(out.q, (bn, 1, d.key_heads, d.key_dim))?,
        k: act(out.k, (bn, 1, d.key_heads, d.key_dim))?,
        v: act(out.v, (bn, 1, d.value_heads, d.value_dim))?,
        g: Tensor::from_vec(out.g, (bn, 1, d.value_heads), dev)?,
        beta: Tensor::from_vec(out.beta, (bn, 1, d.value_heads), dev)?,
    })
}
