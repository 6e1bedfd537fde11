//! The CUDA MoE kernels (`kernels/moe_route.cu`, `kernels/moe_combine.cu`,
//! `affine_products_swiglu_*` of `kernels/affine.cu`) against their CPU twins, for every
//! instantiation. Built only with the `cuda` feature and run on the GPU machine
//! (scripts/gpu/test-cuda.sh); without a CUDA device every test fails.
//!
//! Measure: ‖got − want‖ / ‖want‖ over all elements (NaN fails): f32 2e-5, f16 1e-3, bf16
//! 8e-3 (outputs rounded once on each side from nearby f32 values). Router ids must be equal.
#![cfg(feature = "cuda")]

mod common;

use candle_core::{DType, Device, Tensor};
use common::{assert_rel_err, gpu, random_matrix, rel_l2, tolerance, Rng};
use gdn_ops::ops::affine::AffineTensor;
use gdn_ops::ops::moe_combine::{moe_combine, moe_combine_rows};
use gdn_ops::ops::moe_route::moe_route;

const DTYPES: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

#[test]
fn moe_route_matches_the_cpu_twin() {
    let dev = gpu();
    let mut rng = Rng::xorshift(0x5EED_0101);
    for dtype in DTYPES {
        for (tokens, experts, k, renorm, shared) in [
            (4, 512, 10, true, true),
            (1, 256, 8, true, true),
            (3, 37, 32, false, false),
            (2, 7, 7, true, true),
        ] {
            let width = experts + shared as usize;
            let logits = rng.tensor_as(&[tokens, width], -6.0, 6.0, dtype);
            let (want_ids, want_w) = moe_route(&logits, k, renorm, shared).unwrap();
            let (ids, w) = moe_route(&logits.to_device(&dev).unwrap(), k, renorm, shared).unwrap();
            let what = format!("moe_route {dtype:?} N={tokens} E={experts} k={k}");
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

#[test]
fn moe_combine_matches_the_cpu_twin() {
    let dev = gpu();
    let mut rng = Rng::xorshift(0x5EED_0102);
    for dtype in DTYPES {
        for (tokens, slots, hidden, norm) in [
            (1, 11, 2048, true),
            (4, 9, 4096, true),
            (3, 5, 200, false),
            (2, 1, 77, true),
        ] {
            let down = rng.tensor_as(&[tokens, slots, hidden], -2.0, 2.0, dtype);
            let weights = rng.tensor_as(&[tokens, slots], 0.0, 0.5, DType::F32);
            let residual = rng.tensor_as(&[tokens, hidden], -4.0, 4.0, dtype);
            let nw = rng.tensor_as(&[hidden], 0.5, 1.5, dtype);
            let (want_sum, want_normed) =
                moe_combine(&down, &weights, &residual, norm.then_some((&nw, 1e-6))).unwrap();
            let on = |t: &Tensor| t.to_device(&dev).unwrap();
            let nw_gpu = on(&nw);
            let (sum, normed) = moe_combine(
                &on(&down),
                &on(&weights),
                &on(&residual),
                norm.then_some((&nw_gpu, 1e-6)),
            )
            .unwrap();
            let what = format!("moe_combine {dtype:?} N={tokens} S={slots} H={hidden}");
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
/// at Qwen3-Next's prefill chunk (2048 tokens, 10 routed + the shared slot, H 2048) and odd
/// shapes with spare rows.
#[test]
fn moe_combine_rows_matches_the_cpu_twin() {
    let dev = gpu();
    let mut rng = Rng::xorshift(0x5EED_0104);
    for dtype in DTYPES {
        for (tokens, slots, hidden, spare) in [(2048, 11, 2048, 0), (37, 9, 200, 5), (1, 1, 77, 0)]
        {
            let pairs = tokens * slots;
            let mut order: Vec<u32> = (0..(pairs + spare) as u32).collect();
            for i in (1..order.len()).rev() {
                order.swap(i, rng.below(i + 1));
            }
            order.truncate(pairs);
            let rows = Tensor::from_vec(order, (tokens, slots), &Device::Cpu).unwrap();
            let down = rng.tensor_as(&[pairs + spare, hidden], -2.0, 2.0, dtype);
            let weights = rng.tensor_as(&[tokens, slots], 0.0, 0.5, DType::F32);
            let want = moe_combine_rows(&down, &rows, &weights).unwrap();
            let on = |t: &Tensor| t.to_device(&dev).unwrap();
            let got = moe_combine_rows(&on(&down), &on(&rows), &on(&weights)).unwrap();
            let what = format!("moe_combine_rows {dtype:?} N={tokens} S={slots} H={hidden}");
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
