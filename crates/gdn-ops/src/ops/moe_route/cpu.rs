//! The CPU twin of the MoE router kernels, in the kernels' order of operations: the same
//! selection rule (strictly greater wins, lowest index first), the chosen probabilities
//! summed in slot order.

use super::{MoeRouteParams, RouteKernel};
use anyhow::Result;
use candle_core::{DType, Tensor};

/// Both kernel bodies' twin: they differ in their threads, not in their outputs.
pub(crate) fn moe_route(
    logits: &Tensor,
    p: &MoeRouteParams,
    _kernel: RouteKernel,
) -> Result<(Tensor, Tensor)> {
    let (tokens, experts, k) = (p.tokens as usize, p.experts as usize, p.top_k as usize);
    let width = experts + p.has_shared as usize;
    let slots = k + p.has_shared as usize;
    let values = logits
        .to_dtype(DType::F32)?
        .flatten_all()?
        .to_vec1::<f32>()?;
    let (mut ids, mut weights) = (
        Vec::with_capacity(tokens * slots),
        Vec::with_capacity(tokens * slots),
    );
    for row in values.chunks_exact(width) {
        let routed = &row[..experts];
        let top_logit = routed.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let exps: Vec<f32> = routed.iter().map(|&l| (l - top_logit).exp()).collect();
        let total: f32 = exps.iter().sum();
        // −1 marks a chosen expert: probabilities are never below 0.
        let mut probs: Vec<f32> = exps.iter().map(|&e| e / total).collect();
        let mut chosen = Vec::with_capacity(k);
        for _ in 0..k {
            let (mut best, mut best_e) = (-1f32, experts - 1);
            for (e, &q) in probs.iter().enumerate() {
                if q > best {
                    best = q;
                    best_e = e;
                }
            }
            probs[best_e] = -1.0;
            chosen.push((best_e as u32, best));
        }
        let chosen_sum: f32 = chosen.iter().map(|c| c.1).sum();
        for (e, w) in chosen {
            ids.push(e);
            weights.push(if p.renormalise != 0 {
                w / chosen_sum
            } else {
                w
            });
        }
        if p.has_shared != 0 {
            ids.push(p.experts);
            weights.push(1.0 / (1.0 + (-row[experts]).exp()));
        }
    }
    let dev = logits.device();
    Ok((
        Tensor::from_vec(ids, (tokens, slots), dev)?,
        Tensor::from_vec(weights, (tokens, slots), dev)?,
    ))
}
