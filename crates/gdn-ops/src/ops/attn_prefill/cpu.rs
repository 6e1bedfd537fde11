//! The CPU twin of `kernels/attn_prefill.cu`: per query a plain two-pass softmax in f32 over
//! its visible keys, rounded where the kernel rounds (the scores twice, the probabilities
//! before they weigh the values, the output once). The kernel's online softmax rounds
//! `exp(s − m')` for a running max `m'` where this rounds `exp(s − m)` for the row's max:
//! the same function up to a rounding of InT per term. Heads run in parallel (rayon), so
//! that the real shapes' reference takes seconds, not minutes.

use super::AttnPrefillDims;
use crate::backend::{f32_values, round_to};
use anyhow::Result;
use candle_core::Tensor;
use rayon::prelude::*;

pub(crate) fn attn_prefill(
    d: AttnPrefillDims,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
) -> Result<Tensor> {
    let dtype = q.dtype();
    let (nq, nkv, dh, s, t) = (d.q_heads, d.kv_heads, d.head_dim, d.queries, d.keys);
    let (qs, ks, vs) = (f32_values(q)?, f32_values(k)?, f32_values(v)?);
    let scale = d.scale(dtype);
    let mut out = vec![0f32; d.batch * nq * s * dh];
    out.par_chunks_mut(s * dh)
        .enumerate()
        .for_each(|(head, out)| {
            let (b, h) = (head / nq, head % nq);
            let kv = (b * nkv + h / (nq / nkv)) * t * dh;
            let (keys, values) = (&ks[kv..][..t * dh], &vs[kv..][..t * dh]);
            let mut scores = vec![0f32; t];
            for i in 0..s {
                let query = &qs[(head * s + i) * dh..][..dh];
                let visible = t.min(d.offset + i + 1);
                for (j, score) in scores[..visible].iter_mut().enumerate() {
                    let dot: f32 = query
                        .iter()
                        .zip(&keys[j * dh..][..dh])
                        .map(|(a, b)| a * b)
                        .sum();
                    *score = round_to(dtype, round_to(dtype, dot) * scale);
                }
                let max = scores[..visible]
                    .iter()
                    .copied()
                    .fold(f32::NEG_INFINITY, f32::max);
                let row = &mut out[i * dh..][..dh];
                let mut total = 0f32;
                for (j, score) in scores[..visible].iter().enumerate() {
                    let p = (score - max).exp();
                    total += p;
                    let weight = round_to(dtype, p);
                    for (o, v) in row.iter_mut().zip(&values[j * dh..][..dh]) {
                        *o += weight * v;
                    }
                }
                for o in row.iter_mut() {
                    *o = round_to(dtype, *o / total);
                }
            }
        });
    Ok(Tensor::from_vec(out, (d.batch, nq, s, dh), q.device())?.to_dtype(dtype)?)
}
