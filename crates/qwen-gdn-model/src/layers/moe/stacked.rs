//! The device plan's form of a quantized MoE block: the shared expert becomes one more
//! expert, so that one gathered product covers the routed experts and the shared one.
//!
//! - router `[E (+1), H]`: the shared expert's gate row is appended to the router's rows, so
//!   one product yields the routing logits and the shared expert's gate logit;
//! - gate/up `[E (+1), 2·Im, H]`: each expert's gate rows, then its up rows (one SwiGLU
//!   product per slot), the shared expert as expert `E`;
//! - down `[E (+1), H, Im]`, the shared expert as expert `E`.
//!
//! A token's slots are its `k` routed experts (softmax weights, renormalised if asked) and,
//! when there is a shared expert, slot `k` with id `E` and weight `sigmoid(gate logit)`: the
//! same sum as `routed + sigmoid(g)·shared(x)`. Regrouping the checkpoint's rows is lossless
//! (`AffineMatrix::gather_stacked`), so the device holds what the checkpoint holds.

use super::super::linear::Linear;
use super::super::mlp::Mlp;
use super::{swiglu_halves, top_k_on_device, weighted_sum};
use crate::candle_ops::{cat, full, sigmoid, softmax_last_dim};
use crate::tensor::{cast, contiguous};
use crate::weights::{Matrix, Weight};
use anyhow::Result;
use candle_core::{DType, Device, Tensor, D};
use gdn_ops::ops::affine::AffineMatrix;
use gdn_ops::ops::affine::AffineTensor;
use gdn_ops::ops::moe_route;

#[derive(Debug, Clone)]
pub struct StackedExperts {
    /// `[E (+1), H]`.
    pub router: Linear,
    /// `[E (+1), 2·Im, H]`.
    pub gate_up: AffineTensor,
    /// `[E (+1), H, Im]`.
    pub down: AffineTensor,
    /// Routed experts `E`.
    pub experts: usize,
    pub has_shared: bool,
    /// The router kernel's body (`RunOptions::moe_route`).
    pub route: moe_route::RouteKernel,
}

/// The affine matrix behind a host weight.
fn affine(w: &Weight) -> Option<&AffineMatrix> {
    match w {
        Weight::Host(Matrix::Affine(a)) => Some(a),
        _ => None,
    }
}

impl StackedExperts {
    /// The stacked form on `device`, or `None` when the checkpoint's matrices do not share
    /// one quantized format (float experts, a shared expert of another width or bit width):
    /// those keep the separate form.
    pub fn from_host(
        router: &Linear,
        [gate, up, down]: [&Weight; 3],
        shared: Option<&(Mlp, Linear)>,
        device: &Device,
        dtype: DType,
    ) -> Result<Option<Self>> {
        let (Some(gate), Some(up), Some(down)) = (affine(gate), affine(up), affine(down)) else {
            return Ok(None);
        };
        if router.bias.is_some() {
            return Ok(None);
        }
        let (experts, inner, hidden) = (gate.experts, gate.rows, gate.cols);
        // The shared expert's merged [gate | up] matrix, its down matrix and its gate row.
        let shared = match shared {
            None => None,
            Some((mlp, shared_gate)) => {
                let Some((gate_up, down)) = mlp.merged_parts() else {
                    return Ok(None);
                };
                match (
                    affine(&gate_up.weight),
                    affine(&down.weight),
                    shared_gate.bias.is_none(),
                ) {
                    (Some(gu), Some(d), true) if gu.rows == 2 * inner && d.cols == inner => {
                        Some((gu, d, &shared_gate.weight))
                    }
                    _ => return Ok(None),
                }
            }
        };
        let total = experts + usize::from(shared.is_some());
        let mut gate_up_rows = Vec::with_capacity(total * 2 * inner);
        for e in 0..experts {
            gate_up_rows.extend((0..inner).map(|r| (gate, e * inner + r)));
            gate_up_rows.extend((0..inner).map(|r| (up, e * inner + r)));
        }
        let mut down_rows: Vec<(&AffineMatrix, usize)> =
            (0..experts * hidden).map(|r| (down, r)).collect();
        let router_matrix = router.weight.host()?;
        let router = match shared {
            Some((gu, d, shared_gate)) => {
                gate_up_rows.extend((0..2 * inner).map(|r| (gu, r)));
                down_rows.extend((0..hidden).map(|r| (d, r)));
                match Matrix::concat_rows(&[router_matrix, shared_gate.host()?]) {
                    Some(m) => Linear::from_matrix(m),
                    None => return Ok(None),
                }
            }
            None => Linear::from_matrix(router_matrix.clone()),
        };
        let (Some(gate_up), Some(down)) = (
            AffineMatrix::gather_stacked(&gate_up_rows, total, 2 * inner),
            AffineMatrix::gather_stacked(&down_rows, total, hidden),
        ) else {
            return Ok(None);
        };
        Ok(Some(Self {
            router: router.into_device(device, dtype)?,
            gate_up: AffineTensor::upload(&gate_up, device)?,
            down: AffineTensor::upload(&down, device)?,
            experts,
            has_shared: shared.is_some(),
            route: moe_route::RouteKernel::default(),
        }))
    }

    /// Slots per token: the routed experts, plus the shared one.
    pub fn slots(&self, top_k: usize) -> usize {
        top_k + usize::from(self.has_shared)
    }

    /// Expert ids `[N, S]` u32 and f32 weights `[N, S]` from router logits `[N, E (+1)]`,
    /// with candle ops (the composed path the fused `moe_route` kernel is checked against).
    pub fn route_composed(
        &self,
        logits: &Tensor,
        top_k: usize,
        renormalise: bool,
    ) -> Result<(Tensor, Tensor)> {
        let logits = cast(logits, DType::F32)?;
        let n = logits.dim(0)?;
        let routed = if self.has_shared {
            contiguous(&logits.narrow(D::Minus1, 0, self.experts)?)?
        } else {
            logits.clone()
        };
        let probs = softmax_last_dim(&routed)?;
        let (ids, weights) = top_k_on_device(&probs, top_k, renormalise)?;
        if !self.has_shared {
            return Ok((ids, weights));
        }
        let shared_id = full(self.experts as u32, (n, 1), logits.device())?;
        let shared_weight = sigmoid(&logits.narrow(D::Minus1, self.experts, 1)?)?;
        Ok((
            cat(&[&ids, &shared_id], D::Minus1)?,
            cat(&[&weights, &shared_weight], D::Minus1)?,
        ))
    }

    /// The routing of a prefill chunk: on a GPU the fused kernel of the decode step
    /// (`moe_route`: softmax, top-k, the slot weights and the shared slot in one launch, any
    /// number of tokens), else and where it does not apply [`Self::route_composed`].
    pub fn route_prefill(
        &self,
        logits: &Tensor,
        top_k: usize,
        renormalise: bool,
    ) -> Result<(Tensor, Tensor)> {
        if !logits.device().is_cpu() && moe_route::supports(self.experts, top_k, logits.dtype()) {
            return moe_route::moe_route_with(
                logits,
                top_k,
                renormalise,
                self.has_shared,
                self.route,
            );
        }
        self.route_composed(logits, top_k, renormalise)
    }

    /// The block with candle ops around the gathered products: `x` `[N, H]` → `[N, H]`.
    pub fn forward_composed(&self, x: &Tensor, top_k: usize, renormalise: bool) -> Result<Tensor> {
        let logits = self.router.forward(x)?;
        let (ids, weights) = self.route_composed(&logits, top_k, renormalise)?;
        let inner = self.gate_up.rows / 2;
        let gate_up = self.gate_up.gather_matmul_t(x, &ids)?; // [N, S, 2·Im]
        let act = swiglu_halves(&gate_up, inner)?;
        let down = self.down.gather_matmul_t(&act, &ids)?; // [N, S, H]
        weighted_sum(&down, &weights, x.dtype())
    }
}
