//! The MoE router's CPU twin (`gdn_ops::ops::moe_route`) against the composed router of the
//! model's device plan (crates/qwen-gdn-model/src/layers/moe.rs `routed_on_device`, and the
//! shared expert's `sigmoid(shared_gate(x))`), written here with plain candle ops, over the
//! op's cases (tests/common/moe_route.rs); plus one test per input check.

mod common;

use candle_core::{DType, Device, Tensor, D};
use common::moe_route::{cases, Case};
use common::values;
use gdn_ops::ops::moe_route::{moe_route, supports};

/// The device plan's composed router: softmax in f32, a descending argsort cut to k, the
/// gathered probabilities (renormalised when asked), and the shared gate's sigmoid in the
/// activation dtype.
fn composed(
    logits: &Tensor,
    k: usize,
    renormalise: bool,
    has_shared: bool,
) -> (Tensor, Tensor, Option<Tensor>) {
    let e = logits.dim(1).unwrap() - has_shared as usize;
    let routed = logits
        .narrow(1, 0, e)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap();
    let max = routed.max_keepdim(D::Minus1).unwrap();
    let exps = routed.broadcast_sub(&max).unwrap().exp().unwrap();
    let probs = exps
        .broadcast_div(&exps.sum_keepdim(D::Minus1).unwrap())
        .unwrap();
    let ids = probs
        .arg_sort_last_dim(false)
        .unwrap()
        .narrow(D::Minus1, 0, k)
        .unwrap()
        .contiguous()
        .unwrap();
    let mut weights = probs.gather(&ids, D::Minus1).unwrap();
    if renormalise {
        weights = weights
            .broadcast_div(&weights.sum_keepdim(D::Minus1).unwrap())
            .unwrap();
    }
    let shared = has_shared.then(|| {
        let gate = logits.narrow(1, e, 1).unwrap();
        // sigmoid in the activation dtype, as candle_nn::ops::sigmoid on the gate's output.
        (gate.neg().unwrap().exp().unwrap() + 1.0)
            .unwrap()
            .recip()
            .unwrap()
    });
    (ids, weights, shared)
}

fn check(i: usize, c: Case, dtype: DType) {
    let (tokens, experts, k) = (c.tokens, c.experts, c.top_k);
    let (renorm, shared) = (c.renormalise, c.has_shared);
    let logits = c.logits(i, dtype);
    let (ids, weights) = moe_route(&logits, k, renorm, shared).unwrap();
    let slots = k + shared as usize;
    assert_eq!(ids.dims(), [tokens, slots]);
    assert_eq!((ids.dtype(), weights.dtype()), (DType::U32, DType::F32));
    let (want_ids, want_w, want_shared) = composed(&logits, k, renorm, shared);
    let ids = ids.to_vec2::<u32>().unwrap();
    let weights = weights.to_vec2::<f32>().unwrap();
    let want_ids = want_ids.to_vec2::<u32>().unwrap();
    let want_w = want_w.to_vec2::<f32>().unwrap();
    let want_shared = want_shared.map(|s| values(&s));
    let tol = if dtype == DType::F32 { 1e-5 } else { 2e-2 };
    for n in 0..tokens {
        if dtype == DType::F32 {
            // Continuous logits: no ties, one top-k order.
            assert_eq!(ids[n][..k], want_ids[n][..], "token {n}");
        } else {
            // Rounded logits tie; the argsort may order equal probabilities either way.
            let mut a = ids[n][..k].to_vec();
            let mut b = want_ids[n].clone();
            a.sort();
            b.sort();
            let mut wa = weights[n][..k].to_vec();
            let mut wb = want_w[n].clone();
            wa.sort_by(f32::total_cmp);
            wb.sort_by(f32::total_cmp);
            if a != b {
                // A tie at the cut: the k-th weight equals the next one; the weights agree.
                assert!(
                    (wa[0] - wb[0]).abs() <= tol,
                    "token {n}: ids {a:?} vs {b:?}"
                );
            }
        }
        for j in 0..k {
            let (g, w) = (weights[n][j], want_w[n][j]);
            assert!(
                (g - w).abs() <= tol * w.abs().max(1e-3),
                "token {n} slot {j}: {g} vs {w}"
            );
        }
        if let Some(s) = &want_shared {
            assert_eq!(ids[n][k], experts as u32);
            let (g, w) = (weights[n][k], s[n]);
            assert!((g - w).abs() <= tol, "token {n} shared: {g} vs {w}");
        }
    }
}

/// The op's continuous cases (the composed argsort orders exact ties either way).
#[test]
fn twin_matches_the_composed_router() {
    for dtype in [DType::F32, DType::BF16] {
        for (i, c) in cases().into_iter().enumerate() {
            if c.levels == 0 {
                check(i, c, dtype);
            }
        }
    }
}

#[test]
fn ties_go_to_the_lower_expert_first() {
    let logits = Tensor::new(&[[1f32, 3.0, 3.0, 0.0, 3.0, 2.0, 7.0]], &Device::Cpu).unwrap();
    let (ids, _) = moe_route(&logits, 4, false, true).unwrap();
    assert_eq!(ids.to_vec2::<u32>().unwrap(), [[1, 2, 4, 5, 6]]);
    let (ids, w) = moe_route(&logits.narrow(1, 0, 6).unwrap(), 6, true, false).unwrap();
    assert_eq!(ids.to_vec2::<u32>().unwrap(), [[1, 2, 4, 5, 0, 3]]);
    let total: f32 = w.to_vec2::<f32>().unwrap()[0].iter().sum();
    assert!((total - 1.0).abs() < 1e-6);
}

#[test]
fn supports_covers_the_qwen_routers_only() {
    assert!(supports(512, 10, DType::BF16));
    assert!(supports(256, 8, DType::F16));
    assert!(supports(1, 1, DType::F32));
    assert!(!supports(513, 10, DType::BF16));
    assert!(!supports(64, 33, DType::BF16));
    assert!(!supports(4, 5, DType::BF16));
    assert!(!supports(64, 0, DType::BF16));
    assert!(!supports(64, 4, DType::U32));
}

fn err(r: anyhow::Result<(Tensor, Tensor)>) -> String {
    r.expect_err("an error").to_string()
}

#[test]
fn rejects_logits_that_are_not_a_matrix() {
    let t = Tensor::zeros((2, 3, 8), DType::F32, &Device::Cpu).unwrap();
    assert!(err(moe_route(&t, 2, true, false)).contains("must be [N, E]"));
}

#[test]
fn rejects_a_row_with_only_the_shared_gate() {
    let t = Tensor::zeros((2, 1), DType::F32, &Device::Cpu).unwrap();
    assert!(err(moe_route(&t, 1, true, true)).contains("leaves no routed expert"));
}

#[test]
fn rejects_what_the_kernels_do_not_cover() {
    let t = Tensor::zeros((1, 8), DType::F32, &Device::Cpu).unwrap();
    assert!(err(moe_route(&t, 9, true, false)).contains("no kernel"));
    let t = Tensor::zeros((1, 600), DType::F32, &Device::Cpu).unwrap();
    assert!(err(moe_route(&t, 9, true, false)).contains("no kernel"));
    let t = Tensor::zeros((1, 8), DType::U32, &Device::Cpu).unwrap();
    assert!(err(moe_route(&t, 2, true, false)).contains("no kernel"));
}
