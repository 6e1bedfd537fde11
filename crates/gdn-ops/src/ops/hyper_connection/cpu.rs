//! The CPU twin of `kernels/hyper_connection.{metal,cu}`: f32 arithmetic, rounded to the
//! activation dtype exactly where the kernels store or round.

use super::{ActInputs, HcActParams, HcMixParams, InjectInputs, MixInputs, UpMixInputs};
use crate::backend::{f32_values, round_to};
use crate::ops::affine::cpu::products;
use crate::ops::affine::{ProductKind, Products};
use anyhow::Result;
use candle_core::Tensor;

/// `1 / (1 + e^{-x})` in f32.
pub(crate) fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// The injection gate of stream logit `g`: `InT(2 · InT(sigmoid(InT(g / S))))`.
pub(crate) fn inject_gate(g: f32, streams: usize, round: impl Fn(f32) -> f32) -> f32 {
    round(2.0 * round(sigmoid(round(g / streams as f32))))
}

/// `(sum, normed)`: `sum` only with an injection, `normed` only with a norm weight.
pub(crate) fn hc_inject_norm(inputs: &InjectInputs) -> Result<(Option<Tensor>, Option<Tensor>)> {
    let p = &inputs.params;
    let (tokens, streams, cols) = (p.tokens as usize, p.streams as usize, p.cols as usize);
    let dtype = inputs.hs.dtype();
    let round = |x: f32| round_to(dtype, x);
    let mut sum = f32_values(&inputs.hs)?;
    if let Some((y, g)) = &inputs.inject {
        let (y, g) = (f32_values(y)?, f32_values(g)?);
        // A MoE block's slots summed as `moe_combine` sums them: in order, rounded once.
        let y = match &inputs.slot_weights {
            Some(w) => {
                let (w, k) = (f32_values(w)?, p.slots as usize);
                (0..tokens * cols)
                    .map(|i| {
                        let (n, j) = (i / cols, i % cols);
                        let acc = (0..k).fold(0f32, |acc, s| {
                            acc + w[n * k + s] * y[(n * k + s) * cols + j]
                        });
                        round(acc)
                    })
                    .collect()
            }
            None => y,
        };
        for (row, values) in sum.chunks_exact_mut(cols).enumerate() {
            let n = row / streams;
            let w = inject_gate(g[row], streams, round);
            for (v, &yj) in values.iter_mut().zip(&y[n * cols..(n + 1) * cols]) {
                *v = round(*v + round(w * yj));
            }
        }
    }
    let normed = match &inputs.weight {
        Some(weight) => {
            let weight = f32_values(weight)?;
            let mut normed = vec![0f32; sum.len()];
            for (row, (values, out)) in sum
                .chunks_exact(cols)
                .zip(normed.chunks_exact_mut(cols))
                .enumerate()
            {
                let s = row % streams;
                let squares: f32 = values.iter().map(|v| v * v).sum();
                let inv = 1.0 / (squares / cols as f32 + p.eps).sqrt();
                for ((o, &v), &w) in out
                    .iter_mut()
                    .zip(values)
                    .zip(&weight[s * cols..(s + 1) * cols])
                {
                    *o = round(v * inv * w);
                }
            }
            Some(normed)
        }
        None => None,
    };
    let dev = inputs.hs.device();
    let wrap = |v: Vec<f32>| -> Result<Tensor> {
        Ok(Tensor::from_vec(v, (tokens, streams * cols), dev)?.to_dtype(dtype)?)
    };
    let sum = match inputs.inject {
        Some(_) => Some(wrap(sum)?),
        None => None,
    };
    Ok((sum, normed.map(wrap).transpose()?))
}

pub(crate) fn hc_act(inputs: &ActInputs) -> Result<Tensor> {
    let streams = inputs.params.streams as f32;
    let dtype = inputs.d.dtype();
    let round = |x: f32| round_to(dtype, x);
    let a: Vec<f32> = f32_values(&inputs.d)?
        .into_iter()
        .map(|d| {
            let t = round(d / streams);
            round(t / (1.0 + (-t).exp()))
        })
        .collect();
    let len = a.len();
    Ok(Tensor::from_vec(a, len, inputs.d.device())?.to_dtype(dtype)?)
}

pub(crate) fn hc_mix(inputs: &MixInputs) -> Result<Tensor> {
    let p = &inputs.params;
    let (tokens, streams, cols) = (p.tokens as usize, p.streams as usize, p.cols as usize);
    let dtype = inputs.up.dtype();
    let round = |x: f32| round_to(dtype, x);
    let (up, normed) = (f32_values(&inputs.up)?, f32_values(&inputs.normed)?);
    let mut x = vec![0f32; tokens * cols];
    for (i, out) in x.iter_mut().enumerate() {
        let (n, j) = (i / cols, i % cols);
        let mut acc = 0f32;
        for s in 0..streams {
            let at = (n * streams + s) * cols + j;
            acc += round(round(sigmoid(up[at])) * normed[at]);
        }
        *out = round(acc / streams as f32);
    }
    Ok(Tensor::from_vec(x, (tokens, cols), inputs.up.device())?.to_dtype(dtype)?)
}

/// `hc_act`, the up product and `hc_mix` as the three twins compute them one after the
/// other: the fused kernel's arithmetic is theirs (only the order of the product's f32 sum
/// differs on a device).
pub(crate) fn hc_up_mix(inputs: &UpMixInputs) -> Result<Tensor> {
    let p = &inputs.params;
    let (tokens, rank) = (p.tokens as usize, p.rank as usize);
    let a = hc_act(&ActInputs {
        d: inputs.d.clone(),
        params: HcActParams {
            len: p.tokens * p.rank,
            streams: p.streams,
        },
    })?
    .reshape((tokens, rank))?;
    let up = products(
        inputs.up,
        &Products {
            kind: ProductKind::Plain,
            x: &a,
            ids: None,
            x_div: 1,
            out_rows: tokens,
        },
    )?;
    hc_mix(&MixInputs {
        up,
        normed: inputs.normed.clone(),
        params: HcMixParams {
            tokens: p.tokens,
            streams: p.streams,
            cols: p.cols,
        },
    })
}
