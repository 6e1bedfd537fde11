//! Gated full attention (mlx-lm-reference.md §3.7): `q_proj` yields `[query | gate]` per
//! head, q/k get RMSNorm and partial RoPE, GQA softmax attention over the KV cache, and the
//! output is multiplied by `sigmoid(gate)` before `o_proj`.

use super::linear::{FusedLinear, Linear};
use super::norm::RmsNorm;
use super::rope::PartialRope;
use crate::cache::KvCache;
use crate::weights::Checkpoint;
use crate::Config;
use anyhow::Result;
use candle_core::{DType, Tensor, D};

#[derive(Debug, Clone)]
pub struct Attention {
    /// `[q_proj | k_proj | v_proj]`.
    qkv: FusedLinear,
    o_proj: Linear,
    q_norm: RmsNorm,
    k_norm: RmsNorm,
    rope: PartialRope,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
}

impl Attention {
    pub fn load(ckpt: &Checkpoint, prefix: &str, cfg: &Config) -> Result<Self> {
        let (h, nq, nkv, dh) = (
            cfg.hidden_size,
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        );
        let dev = &candle_core::Device::Cpu;
        let eps = cfg.rms_norm_eps as f32;
        Ok(Self {
            qkv: FusedLinear::new(vec![
                Linear::load(ckpt, &format!("{prefix}.q_proj"), 2 * nq * dh, h, cfg)?,
                Linear::load(ckpt, &format!("{prefix}.k_proj"), nkv * dh, h, cfg)?,
                Linear::load(ckpt, &format!("{prefix}.v_proj"), nkv * dh, h, cfg)?,
            ]),
            o_proj: Linear::load(ckpt, &format!("{prefix}.o_proj"), h, nq * dh, cfg)?,
            q_norm: RmsNorm {
                weight: ckpt.norm(&format!("{prefix}.q_norm.weight"), dh, dev)?,
                eps,
            },
            k_norm: RmsNorm {
                weight: ckpt.norm(&format!("{prefix}.k_norm.weight"), dh, dev)?,
                eps,
            },
            rope: PartialRope::new(cfg.rope_dims(), cfg.rope_theta),
            heads: nq,
            kv_heads: nkv,
            head_dim: dh,
        })
    }

    /// `x`: `[B, S, H]` at positions `offset..offset+S`.
    pub fn forward(&self, x: &Tensor, cache: &mut KvCache, offset: usize) -> Result<Tensor> {
        let (b, s, _) = x.dims3()?;
        let (nq, nkv, dh) = (self.heads, self.kv_heads, self.head_dim);
        let [qg, k, v]: [Tensor; 3] = self.qkv.forward(x)?.try_into().expect("three projections");
        let qg = qg.reshape((b, s, nq, 2 * dh))?;
        let (q, gate) = (
            qg.narrow(D::Minus1, 0, dh)?,
            qg.narrow(D::Minus1, dh, dh)?.reshape((b, s, nq * dh))?,
        );
        let q = self.q_norm.forward(&q)?.transpose(1, 2)?;
        let k = self
            .k_norm
            .forward(&k.reshape((b, s, nkv, dh))?)?
            .transpose(1, 2)?;
        let v = v.reshape((b, s, nkv, dh))?.transpose(1, 2)?.contiguous()?;
        let q = self.rope.forward(&q, offset)?;
        let k = self.rope.forward(&k, offset)?;
        let (k, v) = match (&cache.keys, &cache.values) {
            (Some(pk), Some(pv)) => (Tensor::cat(&[pk, &k], 2)?, Tensor::cat(&[pv, &v], 2)?),
            _ => (k, v),
        };
        cache.keys = Some(k.clone());
        cache.values = Some(v.clone());
        let o = attend(&q, &k, &v, offset)?; // [B, Nq, S, Dh]
        let o = o.transpose(1, 2)?.reshape((b, s, nq * dh))?;
        let o = (o * candle_nn::ops::sigmoid(&gate)?)?;
        self.o_proj.forward(&o)
    }
}

/// Softmax attention of `q` `[B, Nq, S, Dh]` over `k`, `v` `[B, Nkv, T, Dh]`, where query
/// `i` sits at absolute position `offset + i` and sees keys `j ≤ offset + i`.
fn attend(q: &Tensor, k: &Tensor, v: &Tensor, offset: usize) -> Result<Tensor> {
    let (b, nq, s, dh) = q.dims4()?;
    let (_, nkv, t, _) = k.dims4()?;
    let rep = nq / nkv;
    // Query head h reads KV head h / rep: fold the repeat into the query's row axis.
    let q = q.reshape((b, nkv, rep * s, dh))?.contiguous()?;
    let scores = (q.matmul(&k.transpose(2, 3)?.contiguous()?)? * (dh as f64).powf(-0.5))?;
    let scores = if s > 1 {
        let mask: Vec<f32> = (0..rep * s)
            .flat_map(|row| {
                let pos = offset + row % s;
                (0..t).map(move |j| if j <= pos { 0.0 } else { f32::NEG_INFINITY })
            })
            .collect();
        let mask = Tensor::from_vec(mask, (rep * s, t), q.device())?.to_dtype(scores.dtype())?;
        scores.broadcast_add(&mask)?
    } else {
        scores
    };
    let p = candle_nn::ops::softmax_last_dim(&scores.to_dtype(DType::F32)?)?.to_dtype(v.dtype())?;
    Ok(p.matmul(v)?.reshape((b, nq, s, dh))?)
}
