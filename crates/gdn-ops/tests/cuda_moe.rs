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
use common::moe_combine::{cases as combine_cases, Form};
use common::moe_route::cases as route_cases;
use common::{assert_rel_err, gpu, random_matrix, rel_l2, tolerance, Rng};
use gdn_ops::ops::affine::AffineTensor;
use gdn_ops::ops::moe_combine::{moe_combine, moe_combine_rows};
use gdn_ops::ops::moe_route::moe_route;

const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

/// The router's cases (tests/common/moe_route.rs).
#[test]
fn moe_route_matches_the_cpu_twin() {
    let dev = gpu();
    for dtype in DTYPES {
        for (i, c) in route_cases().into_iter().enumerate() {
            let (k, renorm, shared) = (c.top_k, c.renormalise, c.has_shared);
            let logits = c.logits(i, dtype);
            let (want_ids, want_w) = moe_route(&logits, k, renorm, shared).unwrap();
            let (ids, w) = moe_route(&logits.to_device(&dev).unwrap(), k, renorm, shared).unwrap();
            let what = format!(
                "moe_route {dtype:?} N={} E={} k={k} levels={}",
                c.tokens, c.experts, c.levels
            );
            assert_eq!(
                ids.to_device(&Device::Cpu)
                    .unwrap()
                    .to_vec2::<u32>()
                    .unwrap(),
                want_ids.to_vec2::<u32>().unwrap(),
                "{what}: ids"
            );
            // The weights are f32 whatever the logits.
            assert_rel_err(&what, rel_l2(&w, &want_w), 1e-5);
        }
    }
}

/// The combine's decode cases (tests/common/moe_combine.rs).
#[test]
fn moe_combine_matches_the_cpu_twin() {
    let dev = gpu();
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
            let nw_gpu = nw.map(on);
            let (sum, normed) = moe_combine(
                &on(down),
                &on(weights),
                &on(&residual),
                nw_gpu.as_ref().map(|w| (w, 1e-6)),
            )
            .unwrap();
            let what = format!(
                "moe_combine {dtype:?} N={} S={} H={} norm={norm}",
                c.tokens, c.slots, c.hidden
            );
            assert_rel_err(
                &format!("{what}: sum"),
                rel_l2(&sum, &want_sum),
                tolerance(dtype),
            );
            assert_eq!(normed.is_some(), want_normed.is_some());
            if let (Some(g), Some(w)) = (normed, want_normed) {
                assert_rel_err(&format!("{what}: normed"), rel_l2(&g, &w), tolerance(dtype));
            }
        }
    }
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

/// Gathered gate/up products with SwiGLU, every bit width, group size and (x, scale) dtype
/// pair, against the CPU twin.
#[test]
fn affine_swiglu_matches_the_cpu_twin() {
    let dev = gpu();
    let mut rng = Rng::xorshift(0x5EED_0103);
    for bits in [2, 3, 4, 5, 6, 8] {
        for group in [32, 64, 128] {
            for scale_dtype in DTYPES {
                for x_dtype in DTYPES {
                    let (experts, im, cols) = (5, 8 + rng.below(24), 256);
                    let m =
                        random_matrix(&mut rng, bits, group, [experts, 2 * im, cols], scale_dtype);
                    let cpu = AffineTensor::upload(&m, &Device::Cpu).unwrap();
                    let gpu_m = AffineTensor::upload(&m, &dev).unwrap();
                    let tokens = 1 + rng.below(4);
                    let x = rng.tensor_as(&[tokens, cols], -1.0, 1.0, x_dtype);
                    let ids: Vec<u32> =
                        (0..tokens * 3).map(|_| rng.below(experts) as u32).collect();
                    let ids = Tensor::from_vec(ids, (tokens, 3), &Device::Cpu).unwrap();
                    let want = cpu.gather_swiglu(&x, &ids).unwrap();
                    let got = gpu_m
                        .gather_swiglu(&x.to_device(&dev).unwrap(), &ids.to_device(&dev).unwrap())
                        .unwrap();
                    assert_rel_err(
                        &format!("swiglu {bits}-bit g{group} x {x_dtype:?} scales {scale_dtype:?} N={tokens} Im={im}"),
                        rel_l2(&got, &want),
                        tolerance(x_dtype),
                    );
                }
            }
        }
    }
    // The Qwen3-Next-80B expert shape: H = 2048, Im = 512, 4 bits, group 64, bf16.
    let m = random_matrix(&mut rng, 4, 64, [3, 1024, 2048], DType::BF16);
    let cpu = AffineTensor::upload(&m, &Device::Cpu).unwrap();
    let gpu_m = AffineTensor::upload(&m, &dev).unwrap();
    let x = rng.tensor_as(&[1, 2048], -1.0, 1.0, DType::BF16);
    let ids = Tensor::new(&[[2u32, 0, 1]], &Device::Cpu).unwrap();
    let want = cpu.gather_swiglu(&x, &ids).unwrap();
    let got = gpu_m
        .gather_swiglu(&x.to_device(&dev).unwrap(), &ids.to_device(&dev).unwrap())
        .unwrap();
    assert_rel_err(
        "swiglu Qwen3-Next expert shape, bf16",
        rel_l2(&got, &want),
        tolerance(DType::BF16),
    );
}
