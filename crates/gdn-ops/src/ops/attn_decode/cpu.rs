//! The CPU twin of `kernels/attn_decode.{metal,cu}`: per query head a plain two-pass softmax
//! in f32 (the kernels' online softmax computes the same function up to f32 rounding), the
//! output rounded where the kernels round it.

use super::{AttnDecodeDims, Inputs};
use crate::backend::{f32_values, round_to};
use anyhow::Result;
use candle_core::Tensor;

pub(crate) fn attn_decode(d: AttnDecodeDims, inputs: &Inputs) -> Result<Tensor> {
    let dtype = inputs.q.dtype();
    let (nq, nkv, dh, cap) = (d.q_heads, d.kv_heads, d.head_dim, d.capacity);
    let (qs, gs) = (f32_values(inputs.q)?, f32_values(inputs.gate)?);
    let (ks, vs) = (f32_values(inputs.keys)?, f32_values(inputs.values)?);
    // Clamped as the kernels clamp it: never past the buffers.
    let last = (inputs.pos.to_vec1::<u32>()?[0] as usize).min(cap - 1);
    let scale = (dh as f32).powf(-0.5);
    let mut out = vec![0f32; d.batch * nq * dh];
    for b in 0..d.batch {
        for h in 0..nq {
            let kvh = h / (nq / nkv);
            let base = (b * nkv + kvh) * cap * dh;
            let qh = &qs[(b * nq + h) * dh..][..dh];
            let scores: Vec<f32> = (0..=last)
                .map(|t| {
                    let k = &ks[base + t * dh..][..dh];
                    qh.iter().zip(k).map(|(a, b)| a * b).sum::<f32>() * scale
                })
                .collect();
            let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let p: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
            let total: f32 = p.iter().sum();
            let at = (b * nq + h) * dh;
            for j in 0..dh {
                let o: f32 = p
                    .iter()
                    .enumerate()
                    .map(|(t, p)| p * vs[base + t * dh + j])
                    .sum::<f32>()
                    / total;
                let g = 1.0 / (1.0 + (-gs[at + j]).exp());
                out[at + j] = round_to(dtype, o) * g;
            }
        }
    }
    Ok(Tensor::from_vec(out, (d.batch, 1, nq * dh), inputs.q.device())?.to_dtype(dtype)?)
}
