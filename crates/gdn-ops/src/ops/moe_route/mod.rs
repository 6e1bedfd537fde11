//! The MoE router of a decode step in one kernel: softmax over the routed experts' logits,
//! top-k, optional renormalisation, and the shared expert's sigmoid gate as one more slot.
//!
//! Spec. `logits` `[N, E + has_shared]` in the activation dtype (f32, f16 or bf16; the router
//! product's output, with the shared-expert gate row appended as column E) →
//! `ids` `[N, S]` u32 and `weights` `[N, S]` f32, `S = k + has_shared`:
//! - `p = softmax(f32(logits[n, 0..E]))`, in f32, max-subtracted;
//! - slots `0..k`: the k largest p in descending order, equal p ordered by the lower expert
//!   index first (the host rule of `qwen-gdn-model`'s `moe::route`); weight `p`, or
//!   `p / Σ chosen p` (summed in slot order) when `renormalise`;
//! - slot `k` when `has_shared`: id `E`, weight `sigmoid(f32(logits[n, E]))`.
//!
//! NaN probabilities are never chosen; a slot left without a candidate gets id `E - 1` and
//! weight −1, so ids always index a real expert.
//!
//! Kernels: `kernels/moe_route.metal` and `kernels/moe_route.cu`, two bodies each with the
//! same outputs bit for bit ([`RouteKernel`]): `moe_route_<in>` (one simdgroup a token, k
//! serial rounds) and `moe_route_block_<in>` (one threadgroup a token, one thread an expert);
//! [`cpu`] is the twin both must match.

pub(crate) mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(any(feature = "metal", target_os = "macos"))]
pub mod metal;

use crate::backend::on_device;
use crate::profile::{self, Traffic};
use anyhow::{ensure, Result};
use candle_core::{DType, Tensor};

/// Most routed experts a kernel holds (16 per lane of a 32-lane simdgroup).
pub const MAX_EXPERTS: usize = 512;
/// Most routed slots (one lane each).
pub const MAX_TOP_K: usize = 32;

/// Which body routes a call: the same selection, ids order and weight bits either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RouteKernel {
    /// [`RouteKernel::Block`] for calls of at most [`BLOCK_MAX_TOKENS`] tokens (decode),
    /// [`RouteKernel::Warp`] above (prefill chunks), as measured on the H200.
    #[default]
    Auto,
    /// One simdgroup (warp) a token, its k rounds one after another: 6.33 µs a call at
    /// E 512, k 10, N 1 on the H200, but the faster body from N 512 on (7.47 against 9.93 µs;
    /// 15.6 against 52.3 at N 4096: a block a token leaves too few blocks resident).
    Warp,
    /// One threadgroup (block) a token of [`block_threads`] threads, one an expert, the top k
    /// ranked in parallel: 4.24 µs at E 512, k 10, N 1 and 4 (0.67× the warp body), and the
    /// decode step +4.6% (docs/perf-notes-gpu.md "moe_route over a block: measured").
    Block,
}

/// Most tokens a call routes with the block body under [`RouteKernel::Auto`]: measured faster
/// at N 1 and 4 (both routers), slower from N 512; between them it is not measured, so the
/// decode sizes (one token, a verify window, a small batch) take it and prefill does not.
pub const BLOCK_MAX_TOKENS: usize = 4;

impl RouteKernel {
    /// The body that routes a call of `tokens` tokens.
    pub fn for_tokens(self, tokens: usize) -> RouteKernel {
        match self {
            RouteKernel::Auto if tokens <= BLOCK_MAX_TOKENS => RouteKernel::Block,
            RouteKernel::Auto => RouteKernel::Warp,
            concrete => concrete,
        }
    }
}

/// Threads of a token's threadgroup in the block body: one per expert, whole simdgroups.
pub fn block_threads(experts: usize) -> usize {
    experts.div_ceil(32) * 32
}

/// Threadgroup memory of the Metal block body, in 4-byte words (`kBlockScratchWords` of
/// kernels/moe_route.metal; the CUDA body's is static).
pub const BLOCK_SCRATCH_WORDS: usize = 1172;

/// `MoeRouteParams` of kernels/params/moe_route.h, field for field.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoeRouteParams {
    pub tokens: u32,
    pub experts: u32,
    pub top_k: u32,
    pub renormalise: u32,
    pub has_shared: u32,
}

/// Whether the kernels cover `experts` routed experts, `top_k` slots and logits in `dtype`;
/// the model falls back to the composed router otherwise.
pub fn supports(experts: usize, top_k: usize, dtype: DType) -> bool {
    (1..=MAX_EXPERTS).contains(&experts)
        && (1..=MAX_TOP_K).contains(&top_k)
        && top_k <= experts
        && matches!(dtype, DType::F32 | DType::F16 | DType::BF16)
}

/// Routes every token of `logits` `[N, E + has_shared]`: returns `(ids, weights)`, both
/// `[N, top_k + has_shared]`, u32 and f32 (see the module doc for the maths).
pub fn moe_route(
    logits: &Tensor,
    top_k: usize,
    renormalise: bool,
    has_shared: bool,
) -> Result<(Tensor, Tensor)> {
    moe_route_with(logits, top_k, renormalise, has_shared, RouteKernel::Warp)
}

/// [`moe_route`] on the body `kernel` names (Metal and CUDA; the CPU has one twin).
pub fn moe_route_with(
    logits: &Tensor,
    top_k: usize,
    renormalise: bool,
    has_shared: bool,
    kernel: RouteKernel,
) -> Result<(Tensor, Tensor)> {
    let (tokens, width) = logits
        .dims2()
        .map_err(|_| anyhow::anyhow!("moe_route: logits {:?} must be [N, E]", logits.dims()))?;
    ensure!(
        width > has_shared as usize,
        "moe_route: logits width {width} leaves no routed expert"
    );
    let experts = width - has_shared as usize;
    ensure!(
        supports(experts, top_k, logits.dtype()),
        "moe_route: no kernel for {experts} experts, top_k {top_k}, {:?} logits",
        logits.dtype()
    );
    let kernel = kernel.for_tokens(tokens);
    let p = MoeRouteParams {
        tokens: tokens as u32,
        experts: experts as u32,
        top_k: top_k as u32,
        renormalise: renormalise as u32,
        has_shared: has_shared as u32,
    };
    // Bytes moved (the decode profile): the logits read; per slot a u32 id and an f32
    // weight written.
    let traffic = || {
        let slots = top_k + has_shared as usize;
        Ok(Traffic::new()
            .read_all(logits)
            .write(tokens * slots * (4 + 4)))
    };
    let device = logits.device();
    profile::kernel("moe_route", device, traffic, || {
        on_device!(device, "moe_route", moe_route(logits, &p, kernel))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `Auto` takes the block body for decode-sized calls and the warp body for prefill
    /// chunks; a concrete body is kept whatever the size.
    #[test]
    fn auto_picks_the_measured_body_by_size() {
        let auto = RouteKernel::Auto;
        assert_eq!(auto.for_tokens(1), RouteKernel::Block);
        assert_eq!(auto.for_tokens(BLOCK_MAX_TOKENS), RouteKernel::Block);
        assert_eq!(auto.for_tokens(BLOCK_MAX_TOKENS + 1), RouteKernel::Warp);
        assert_eq!(auto.for_tokens(4096), RouteKernel::Warp);
        assert_eq!(RouteKernel::Warp.for_tokens(1), RouteKernel::Warp);
        assert_eq!(RouteKernel::Block.for_tokens(4096), RouteKernel::Block);
    }
}
