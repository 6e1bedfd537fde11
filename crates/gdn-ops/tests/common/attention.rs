//! The composed causal attention that `attn_prefill` replaces: the dense block of
//! `attend_dense` in crates/qwen-gdn-model's attention layer (the query heads folded onto
//! their KV head, scores in the activation dtype, scaled, the additive causal mask, softmax in
//! f32, probabilities back in the activation dtype, then times V), with candle's ops on any
//! device.

use candle_core::{DType, Tensor};

/// `[B, Nq, S, Dh]`: query `i` of `q` `[B, Nq, S, Dh]` at position `offset + i` over the keys
/// `j ≤ offset + i` of `k`, `v` `[B, Nkv, T, Dh]` (views are fine, as the model passes them).
pub fn composed_causal_attention(q: &Tensor, k: &Tensor, v: &Tensor, offset: usize) -> Tensor {
    let (b, nq, s, dh) = q.dims4().unwrap();
    let (_, nkv, t, _) = k.dims4().unwrap();
    let rep = nq / nkv;
    let rows = q
        .contiguous()
        .unwrap()
        .reshape((b, nkv, rep * s, dh))
        .unwrap();
    let scores = rows.matmul(&k.transpose(2, 3).unwrap()).unwrap();
    let scores = (scores * (dh as f64).powf(-0.5)).unwrap();
    let mask: Vec<f32> = (0..s)
        .flat_map(|i| {
            (0..t).map(move |j| {
                if j <= offset + i {
                    0.0
                } else {
                    f32::NEG_INFINITY
                }
            })
        })
        .collect();
    let mask = Tensor::from_vec(mask, (s, t), q.device())
        .unwrap()
        .to_dtype(scores.dtype())
        .unwrap()
        .repeat((rep, 1))
        .unwrap();
    let scores = scores.broadcast_add(&mask).unwrap();
    let p = candle_nn::ops::softmax_last_dim(&scores.to_dtype(DType::F32).unwrap())
        .unwrap()
        .to_dtype(v.dtype())
        .unwrap();
    p.matmul(v).unwrap().reshape((b, nq, s, dh)).unwrap()
}
