//! Gated full attention (mlx-lm-reference.md §3.7): `q_proj` yields `[query | gate]` per
//! head, q/k get RMSNorm and partial RoPE, GQA softmax attention over the KV cache, and the
//! output is multiplied by `sigmoid(gate)` before `o_proj`.

use super::linear::{FusedLinear, Linear};
use super::norm::RmsNorm;
use super::norm::{cast, contiguous};
use super::rope::PartialRope;
use crate::cache::KvCache;
use crate::weights::Checkpoint;
use crate::weights::Weight;
use crate::Config;
use anyhow::Result;
use candle_core::{DType, Device, Tensor, D};
use gdn_ops::launches::record;

mod decode;

#[derive(Debug, Clone)]
pub struct Attention {
    /// `[q_proj | k_proj | v_proj]`.
    qkv: FusedLinear,
    o_proj: Linear,
    q_norm: RmsNorm,
    k_norm: RmsNorm,
    rope: PartialRope,
    /// Device plan: `[rope dims / 2]` f32 inverse frequencies, for the fused decode kernel.
    rope_inv_freq: Option<Tensor>,
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
        let dev = &Device::Cpu;
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
            rope_inv_freq: None,
            heads: nq,
            kv_heads: nkv,
            head_dim: dh,
        })
    }

    pub fn into_device(self, device: &Device, dtype: DType) -> Result<Self> {
        Ok(Self {
            qkv: self.qkv.into_device(device, dtype)?,
            o_proj: self.o_proj.into_device(device, dtype)?,
            q_norm: self.q_norm.into_device(device, dtype)?,
            k_norm: self.k_norm.into_device(device, dtype)?,
            rope_inv_freq: Some(self.rope.inv_freq_tensor(device)?),
            ..self
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
            contiguous(&qg.narrow(D::Minus1, dh, dh)?)?.reshape((b, s, nq * dh))?,
        );
        let q = self.q_norm.forward(&q)?.transpose(1, 2)?;
        let k = self
            .k_norm
            .forward(&contiguous(&k)?.reshape((b, s, nkv, dh))?)?
            .transpose(1, 2)?;
        let v = contiguous(&contiguous(&v)?.reshape((b, s, nkv, dh))?.transpose(1, 2)?)?;
        let q = self.rope.forward(&q, offset)?;
        let k = self.rope.forward(&k, offset)?;
        let (k, v) = cache.append(&k, &v)?;
        let device_plan = !matches!(self.o_proj.weight, Weight::Host(_));
        let o = if device_plan && fused_attention_supported(&q) {
            fused_attend(&q, &k, &v, offset)?
        } else {
            if !q.device().is_cpu() {
                static ONCE: std::sync::Once = std::sync::Once::new();
                ONCE.call_once(|| {
                    eprintln!(
                        "note: no fused attention kernel for head dim {dh} in {:?}; using matmul + softmax",
                        q.dtype()
                    )
                });
            }
            attend(&q, &k, &v, offset)?
        }; // [B, Nq, S, Dh]
        let o = contiguous(&o.transpose(1, 2)?)?.reshape((b, s, nq * dh))?;
        record(2);
        let o = (o * candle_nn::ops::sigmoid(&gate)?)?;
        self.o_proj.forward(&o)
    }
}

/// Additive causal mask `[S, T]` for queries at positions `offset..offset+S` over keys
/// `0..T`: 0 where key `j ≤` the query's position, −∞ elsewhere.
pub fn causal_mask(
    s: usize,
    t: usize,
    offset: usize,
    dtype: DType,
    device: &Device,
) -> Result<Tensor> {
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
    Ok(Tensor::from_vec(mask, (s, t), device)?.to_dtype(dtype)?)
}

/// candle's fused attention kernels take these head sizes and dtypes.
fn fused_attention_supported(q: &Tensor) -> bool {
    let dh = q.dim(D::Minus1).unwrap_or(0);
    [32, 64, 72, 80, 96, 128, 256].contains(&dh)
        && matches!(q.dtype(), DType::BF16 | DType::F16 | DType::F32)
}

/// One fused kernel (`candle_nn::ops::sdpa`): the vector kernel for a single query, the full
/// kernel with an explicit causal mask for a chunk. GQA is handled by the kernels. candle has
/// them on Metal only; elsewhere the same function is computed by [`attend`], counted as the
/// one launch it stands in for.
fn fused_attend(q: &Tensor, k: &Tensor, v: &Tensor, offset: usize) -> Result<Tensor> {
    if !q.device().is_metal() {
        return gdn_ops::launches::counted_as(1, || attend(q, k, v, offset));
    }
    let (b, nq, s, dh) = q.dims4()?;
    let t = k.dim(2)?;
    let scale = (dh as f32).powf(-0.5);
    let q = contiguous(q)?;
    record(1);
    let mask = if s > 1 {
        let m = causal_mask(s, t, offset, q.dtype(), q.device())?;
        Some(m.broadcast_as((b, nq, s, t))?)
    } else {
        None
    };
    Ok(candle_nn::ops::sdpa(
        &q,
        k,
        v,
        mask.as_ref(),
        false,
        scale,
        1.0,
    )?)
}

/// Softmax attention of `q` `[B, Nq, S, Dh]` over `k`, `v` `[B, Nkv, T, Dh]`, where query
/// `i` sits at absolute position `offset + i` and sees keys `j ≤ offset + i`.
fn attend(q: &Tensor, k: &Tensor, v: &Tensor, offset: usize) -> Result<Tensor> {
    let (b, nq, s, dh) = q.dims4()?;
    let (_, nkv, t, _) = k.dims4()?;
    let rep = nq / nkv;
    // Query head h reads KV head h / rep: fold the repeat into the query's row axis.
    let q = contiguous(q)?.reshape((b, nkv, rep * s, dh))?;
    // K and V stay views of the KV buffers (rows of Dh values, heads a buffer capacity apart):
    // the matmuls take a transposed K and row-strided operands as they are (CPU gemm and
    // cuBLAS), so no step copies the whole cache.
    record(1);
    let scores = (q.matmul(&k.transpose(2, 3)?)? * (dh as f64).powf(-0.5))?;
    let scores = if s > 1 {
        // Row r of the folded query axis is query r % s.
        let mask = causal_mask(s, t, offset, scores.dtype(), q.device())?.repeat((rep, 1))?;
        record(1);
        scores.broadcast_add(&mask)?
    } else {
        scores
    };
    record(1);
    let p = cast(
        &candle_nn::ops::softmax_last_dim(&cast(&scores, DType::F32)?)?,
        v.dtype(),
    )?;
    record(1);
    Ok(p.matmul(v)?.reshape((b, nq, s, dh))?)
}
