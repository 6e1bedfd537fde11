//! The CUDA MoE kernels (`kernels/moe_route.cu`, `kernels/moe_combine.cu`,
//! `affine_products_swiglu_*` of `kernels/affine.cu`) against their CPU twins, for every
//! instantiation. Built only with the `cuda` feature and run on the GPU machine
//! (scripts/gpu/test-cuda.sh); without a CUDA device every test fails. The router and the
//! combine run their ops' cases (tests/common/moe_route.rs, tests/common/moe_combine.rs).
//!
//! Measure: ‖got − want‖ / ‖want‖ over all elements (NaN fails): f32 2e-5, f16 1e-3, bf16
//! 8e-3 (outputs rounded once on each side from nearby f32 values). Router ids must be equal.
#![cfg(feature = "cuda")]

mod common;

use candle_core::{DType, Device, Tensor};
use common::affine::{self, Kind};
use common::moe_combine::{cases as combine_cases, Form};
use common::moe_route::cases as route_cases;
use common::{assert_rel_err, gpu, rel_l2, tolerance};
use gdn_ops::ops::moe_combine::cuda::uses_cluster;
use gdn_ops::ops::moe_combine::{moe_combine, moe_combine_rows, moe_combine_with, CombineKernel};
use gdn_ops::ops::moe_route::{moe_route, moe_route_with, RouteKernel};

const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// The router's cases (tests/common/moe_route.rs), on both bodies: each against the twin,
/// and the block body's outputs equal to the warp body's bit for bit.
#[test]
fn moe_route_matches_the_cpu_twin() {
    let dev = gpu();
    for dtype in DTYPES {
        for (i, c) in route_cases().into_iter().enumerate() {
            let (k, renorm, shared) = (c.top_k, c.renormalise, c.has_shared);
            let logits = c.logits(i, dtype);
            let (want_ids, want_w) = moe_route(&logits, k, renorm, shared).unwrap();
            let on_gpu = logits.to_device(&dev).unwrap();
            let mut bodies = vec![];
            for body in [RouteKernel::Warp, RouteKernel::Block] {
                let (ids, w) = moe_route_with(&on_gpu, k, renorm, shared, body).unwrap();
                let what = format!(
                    "moe_route {body:?} {dtype:?} N={} E={} k={k} levels={}",
                    c.tokens, c.experts, c.levels
                );
                let ids = ids
                    .to_device(&Device::Cpu)
                    .unwrap()
                    .to_vec2::<u32>()
                    .unwrap();
                assert_eq!(ids, want_ids.to_vec2::<u32>().unwrap(), "{what}: ids");
                // The weights are f32 whatever the logits.
                assert_rel_err(&what, rel_l2(&w, &want_w), 1e-5);
                let bits: Vec<u32> = w
                    .flatten_all()
                    .unwrap()
                    .to_device(&Device::Cpu)
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap()
                    .iter()
                    .map(|x| x.to_bits())
                    .collect();
                bodies.push(bits);
            }
            assert_eq!(
                bodies[0], bodies[1],
                "moe_route {dtype:?} case {i}: the block body's weights differ from the warp body's"
            );
        }
    }
}

/// The combine's decode cases (tests/common/moe_combine.rs), on each kernel: one block a token
/// and, where `uses_cluster` takes it (Qwen3-Next's decode among the cases), a token over a
/// cluster of blocks. Both within tolerance of the CPU twin; the cluster's `sum` equal to the
/// one-block kernel's bit for bit (a column's arithmetic does not depend on the split), its
/// `normed` within 1 ulp of it (only the sum of squares is added in another order) and the
/// same bits on a second call (a fixed order).
#[test]
fn moe_combine_matches_the_cpu_twin() {
    let dev = gpu();
    let mut clustered = 0;
    for dtype in DTYPES {
        for (i, c) in combine_cases().into_iter().enumerate() {
            let Form::Decode { norm } = c.form else {
                continue;
            };
            let x = c.inputs(i, dtype);
            let (down, weights, residual) = (&x.down, &x.weights, x.residual.unwrap());
            let nw = x.norm_weight.as_ref();
            let (want_sum, want_normed) =
                moe_combine(down, weights, &residual, nw.map(|w| (w, 1e-6))).unwrap();
            let on = |t: &Tensor| t.to_device(&dev).unwrap();
            let (down_gpu, weights_gpu, residual_gpu) = (on(down), on(weights), on(&residual));
            let nw_gpu = nw.map(on);
            let run = |kernel| {
                moe_combine_with(
                    &down_gpu,
                    &weights_gpu,
                    &residual_gpu,
                    nw_gpu.as_ref().map(|w| (w, 1e-6)),
                    kernel,
                )
                .unwrap()
            };
            let what = format!(
                "moe_combine {dtype:?} N={} S={} H={} norm={norm}",
                c.tokens, c.slots, c.hidden
            );
            let one = run(CombineKernel::OneBlock);
            let auto = run(CombineKernel::Auto);
            for (kernel, (sum, normed)) in [("one block", &one), ("auto", &auto)] {
                let what = format!("{what} {kernel}");
                assert_rel_err(
                    &format!("{what}: sum"),
                    rel_l2(sum, &want_sum),
                    tolerance(dtype),
                );
                assert_eq!(normed.is_some(), want_normed.is_some());
                if let (Some(g), Some(w)) = (normed, &want_normed) {
                    assert_rel_err(&format!("{what}: normed"), rel_l2(g, w), tolerance(dtype));
                }
            }
            if !uses_cluster(c.tokens, c.hidden, false, CombineKernel::Auto) {
                continue;
            }
            clustered += 1;
            assert_eq!(
                bits(&auto.0),
                bits(&one.0),
                "{what}: cluster sum != one block's"
            );
            if let (Some(g), Some(w)) = (&auto.1, &one.1) {
                // The norm's sum of squares is added in another order (per block, then
                // over the cluster): its rounding moves `normed` by a few f32 ulps (measured
                // 3 at H = 2048: ~log2(H) roundings of the sum, halved by the rsqrt), which
                // a bf16 or f16 output rounds away.
                let ulps = max_ulps(g, w, dtype);
                let limit = if dtype == DType::F32 { 16.0 } else { 1.0 };
                assert!(
                    ulps <= limit,
                    "{what}: cluster normed {ulps} ulps from one block's (at most {limit})"
                );
                let again = run(CombineKernel::Auto).1.unwrap();
                assert_eq!(
                    bits(&again),
                    bits(g),
                    "{what}: cluster normed differs run to run"
                );
            }
        }
    }
    assert!(clustered > 0, "no case ran the cluster kernel");
}

/// Every element as f32 (any float dtype; f16 and bf16 widen exactly).
fn f32_values(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap()
}

/// Every element's bits, as u32 (f16 and bf16 widened to f32 exactly).
fn bits(t: &Tensor) -> Vec<u32> {
    f32_values(t).into_iter().map(f32::to_bits).collect()
}

/// The largest |got − want| in units of `dtype`'s spacing at `want` (its subnormals' below
/// the smallest normal).
fn max_ulps(got: &Tensor, want: &Tensor, dtype: DType) -> f32 {
    let (mantissa, tiny) = match dtype {
        DType::F32 => (23, f32::MIN_POSITIVE),
        DType::F16 => (10, 2f32.powi(-14)),
        _ => (7, f32::MIN_POSITIVE),
    };
    f32_values(got)
        .into_iter()
        .zip(f32_values(want))
        .map(|(g, w)| {
            let spacing = (w.abs().max(tiny).log2().floor() - mantissa as f32).exp2();
            (g - w).abs() / spacing
        })
        .fold(0.0, f32::max)
}

/// The prefill form: expert outputs in a shuffled (grouped) order read back through `rows`,
/// the combine's `Form::Rows` cases (Qwen3-Next's prefill chunk of 2048 tokens, 10 routed +
/// the shared slot, H 2048, and odd shapes with spare rows).
#[test]
fn moe_combine_rows_matches_the_cpu_twin() {
    let dev = gpu();
    for dtype in DTYPES {
        for (i, c) in combine_cases().into_iter().enumerate() {
            if !matches!(c.form, Form::Rows { .. }) {
                continue;
            }
            let x = c.inputs(i, dtype);
            let (down, weights, rows) = (&x.down, &x.weights, x.rows.unwrap());
            let want = moe_combine_rows(down, &rows, weights).unwrap();
            let on = |t: &Tensor| t.to_device(&dev).unwrap();
            let got = moe_combine_rows(&on(down), &on(&rows), &on(weights)).unwrap();
            let what = format!(
                "moe_combine_rows {dtype:?} N={} S={} H={}",
                c.tokens, c.slots, c.hidden
            );
            assert_rel_err(&what, rel_l2(&got, &want), tolerance(dtype));
        }
    }
}

/// Gathered gate/up products with SwiGLU: the affine family's SwiGLU cases
/// (tests/common/affine.rs: every bit width, group size and (x, scale) type pair, and the
/// Qwen3-Next-80B expert shape), against the CPU twin.
#[test]
fn affine_swiglu_matches_the_cpu_twin() {
    let dev = gpu();
    for (i, c) in affine::cases_of(Kind::Swiglu) {
        let (_, [want, got]) = affine::on_cpu_and(&dev, i, &c);
        assert_rel_err(
            &format!("swiglu {}", c.label()),
            rel_l2(&got, &want),
            tolerance(c.x.dtype()),
        );
    }
}
