//! The MoE block's decode step on fused kernels, over [`StackedExperts`]: the router product
//! (with the shared expert's gate row), one kernel for softmax, top-k and the slot weights
//! (`moe_route`), one gathered gate/up product with SwiGLU in its epilogue, and one gathered
//! down product. The weighted sum joins the residual add and the next norm in the model's
//! step (`moe_combine`). [`StackedExperts::forward_composed`] is the composed path these
//! kernels are tested against.

use super::{SparseMoe, StackedExperts};
use anyhow::Result;
use candle_core::{DType, Tensor};
use gdn_ops::ops::moe_route;
use gdn_ops::profile;

impl SparseMoe {
    /// Whether the fused kernels cover this block in `dtype`.
    pub(crate) fn fused_decode_supported(&self, dtype: DType) -> bool {
        self.fused_decode_supports_rows(1, dtype)
    }

    /// Whether the fused kernels take `rows` tokens in one launch each (a batched step).
    pub(crate) fn fused_decode_supports_rows(&self, rows: usize, dtype: DType) -> bool {
        self.stacked().is_some_and(|s| {
            moe_route::supports(s.experts, self.top_k, dtype)
                && s.gate_up.supports_gather_swiglu(rows, dtype)
        })
    }

    /// `x` `[N, H]` (post-norm) → the down products of every slot `[N, S, H]` and their f32
    /// weights `[N, S]`, for `moe_combine`.
    pub(crate) fn decode_fused(&self, x: &Tensor) -> Result<(Tensor, Tensor)> {
        let s: &StackedExperts = self
            .stacked()
            .ok_or_else(|| anyhow::anyhow!("fused MoE decode needs stacked experts"))?;
        let logits = profile::labelled("moe.router", || s.router.forward(x))?;
        let (ids, weights) = moe_route::moe_route_with(
            &logits,
            self.top_k,
            self.norm_topk_prob,
            s.has_shared,
            s.route,
        )?;
        let act = profile::labelled("moe.gate_up", || s.gate_up.gather_swiglu(x, &ids))?; // [N, S, Im]
        let down = profile::labelled("moe.down", || s.down.gather_matmul_t(&act, &ids))?; // [N, S, H]
        Ok((down, weights))
    }
}
