//! Sparse MoE block (mlx-lm-reference.md §3.8): softmax router, top-k experts with optional
//! renormalisation, SwiGLU experts, plus a shared expert scaled by `sigmoid(shared_gate(x))`.
//!
//! On the CPU the routing is read on the host and tokens are grouped per selected expert,
//! so each expert's weights are read once per call and unselected experts not at all.

use super::linear::Linear;
use super::mlp::Mlp;
use crate::weights::{Checkpoint, Matrix};
use crate::Config;
use anyhow::{ensure, Result};
use candle_core::{DType, Tensor};

#[derive(Debug, Clone)]
pub struct SparseMoe {
    router: Linear,
    /// Stacked `[E, Im, H]`, `[E, Im, H]`, `[E, H, Im]`.
    gate_proj: Matrix,
    up_proj: Matrix,
    down_proj: Matrix,
    shared_expert: Option<(Mlp, Linear)>,
    top_k: usize,
    norm_topk_prob: bool,
}

/// The `k` most probable experts of one token, with their (optionally renormalised) weights.
pub fn route(probs: &[f32], k: usize, renormalise: bool) -> Vec<(usize, f32)> {
    let mut order: Vec<usize> = (0..probs.len()).collect();
    order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
    let mut chosen: Vec<(usize, f32)> = order[..k].iter().map(|&e| (e, probs[e])).collect();
    if renormalise {
        let total: f32 = chosen.iter().map(|c| c.1).sum();
        chosen.iter_mut().for_each(|c| c.1 /= total);
    }
    chosen
}

impl SparseMoe {
    pub fn load(ckpt: &Checkpoint, prefix: &str, cfg: &Config) -> Result<Self> {
        let (h, e, im, is) = (
            cfg.hidden_size,
            cfg.num_experts,
            cfg.moe_intermediate_size,
            cfg.shared_expert_intermediate_size,
        );
        let shared_expert = if is > 0 {
            Some((
                Mlp::load(ckpt, &format!("{prefix}.shared_expert"), h, is, cfg)?,
                Linear::load(ckpt, &format!("{prefix}.shared_expert_gate"), 1, h, cfg)?,
            ))
        } else {
            None
        };
        Ok(Self {
            router: Linear::load(ckpt, &format!("{prefix}.gate"), e, h, cfg)?,
            gate_proj: ckpt.experts(prefix, "gate_proj", e, im, h, cfg)?,
            up_proj: ckpt.experts(prefix, "up_proj", e, im, h, cfg)?,
            down_proj: ckpt.experts(prefix, "down_proj", e, h, im, cfg)?,
            shared_expert,
            top_k: cfg.num_experts_per_tok,
            norm_topk_prob: cfg.norm_topk_prob,
        })
    }

    /// `x`: `[B, S, H]` (already post-attention-normed).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        ensure!(
            x.device().is_cpu(),
            "the MoE block runs on the CPU only so far"
        );
        let h = x.dim(candle_core::D::Minus1)?;
        let n_experts = self.gate_proj.experts();
        let probs =
            candle_nn::ops::softmax_last_dim(&self.router.forward(x)?.to_dtype(DType::F32)?)?;
        let probs = probs.flatten_to(1)?.to_vec2::<f32>()?;
        let xs = x.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
        // Tokens per expert: (token index, routing weight).
        let mut assigned: Vec<Vec<(usize, f32)>> = vec![vec![]; n_experts];
        for (tok, p) in probs.iter().enumerate() {
            for (e, w) in route(p, self.top_k, self.norm_topk_prob) {
                assigned[e].push((tok, w));
            }
        }
        let mut out = vec![0f32; xs.len()];
        for (e, tokens) in assigned.iter().enumerate().filter(|(_, t)| !t.is_empty()) {
            let m = tokens.len();
            let rows: Vec<f32> = tokens
                .iter()
                .flat_map(|&(t, _)| xs[t * h..(t + 1) * h].iter().copied())
                .collect();
            let gate = self.gate_proj.matmul_t(e, &rows, m);
            let up = self.up_proj.matmul_t(e, &rows, m);
            let act: Vec<f32> = gate
                .iter()
                .zip(&up)
                .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                .collect();
            let down = self.down_proj.matmul_t(e, &act, m);
            for (&(t, w), y) in tokens.iter().zip(down.chunks_exact(h)) {
                out[t * h..(t + 1) * h]
                    .iter_mut()
                    .zip(y)
                    .for_each(|(o, y)| *o += w * y);
            }
        }
        let routed = Tensor::from_vec(out, x.dims(), x.device())?.to_dtype(x.dtype())?;
        match &self.shared_expert {
            Some((mlp, gate)) => {
                let scale = candle_nn::ops::sigmoid(&gate.forward(x)?)?;
                Ok((routed + mlp.forward(x)?.broadcast_mul(&scale)?)?)
            }
            None => Ok(routed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::route;

    #[test]
    fn routing_picks_top_k_and_renormalises() {
        let p = [0.1, 0.4, 0.2, 0.3];
        assert_eq!(route(&p, 2, false), vec![(1, 0.4), (3, 0.3)]);
        let r = route(&p, 2, true);
        assert!((r[0].1 - 0.4 / 0.7).abs() < 1e-6 && (r[1].1 - 0.3 / 0.7).abs() < 1e-6);
    }
}
